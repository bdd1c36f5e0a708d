"""Tidy frames of the talk figures (:mod:`engine.figures.talk`): run records (and optionally an audit
report) in, one :class:`pandas.DataFrame` per question out. They build on :mod:`engine.figures.frames`
(tier histories, recall AUC, series labels, INO/IDP pairs matched by ``seed_index``) and
:func:`engine.figures.bands.seed_mean` (mean ± standard error over the seeds of a series), and add what
a talk needs across runs: per-tier values against ε, gains per algorithm, the INO/DP-SGD-S internals,
an audit's GPR against ε.

Frames hold raw text; the builders escape it. Nothing here reads the store or plots.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from engine.audit.pa_alooa.report import as_report
from engine.dp.algorithms import draws
from engine.figures import evidence as ev
from engine.figures import frames as fr
from engine.figures.bands import mean_se
from engine.figures.common_span import common_span
from engine.jobs.runs import algorithm_label, run_label, seed_index, series_key
from engine.models.metrics import mid_markers
from engine.train.records import PlanRecord

# The stored keys of an INO-SGD evaluation's state (``Importance.state()`` in engine.dp.mechanisms; read as
# ``EvalRecord.ino``: ``rho_by_tier``, ``downweighted_fraction``), named where a figure says what is missing:
RHO_KEY = "ino_rho_by_tier"  # per tier (tier order), mean ρ of the tier's batch items since the last evaluation
DOWNWEIGHTED_KEY = "ino_downweighted_fraction"  # Σ (1 − ρ_i) C_i / Σ C_i over the same steps


def _se(values) -> float:
    """Standard error of the mean of the finite values (nan for fewer than two)."""
    return mean_se(values)[1]


def _mean(values) -> float:
    return mean_se(values)[0]


def most_private_tier(runs: list[dict], memo: dict | None = None) -> tuple[str, float] | None:
    """(name, ε) of the smallest-ε tier of the selection's last evaluations, or None (``memo``: a live view's
    frame memo, :mod:`engine.figures.frames`)."""
    best = None
    for run in runs:
        last = fr.last_eval(run, memo)
        for t in last.tiers if last is not None else ():
            if t.epsilon is not None and (best is None or t.epsilon < best[1]):
                best = (t.name, float(t.epsilon))
    return best


# --- frontier: recall per tier vs ε, across runs ---------------------------------------------------------

FRONTIER_COLUMNS = ["kind", "series", "algorithm", "run_id", "tier", "tier_index", "epsilon", "recall", "recall_se",
                    "recall_auc", "auc_se", "n", "error_bars"]


def frontier_frame(runs: list[dict]) -> pd.DataFrame:
    """Final recall and recall AUC per (series, tier): mean ± s.e. over the series' seeds (``error_bars``
    "seeds"); when no series has replicates, over the runs of one algorithm ("runs"). Plus one row per
    run (``kind`` "run") behind each mean (``kind`` "mean"). A rerun (:func:`engine.figures.evidence.reruns`) is
    counted once: its kept run stands for both."""
    runs = ev.distinct(runs)
    auc = fr.recall_auc_table(runs)
    if auc.empty:
        return pd.DataFrame(columns=FRONTIER_COLUMNS)
    # the frames' series column is shared by the replicates of a series (engine.figures.frames.series_labels)
    replicated = auc.groupby("series")["run_id"].nunique().max() > 1
    if not replicated:
        auc["series"] = [algorithm_label(a) for a in auc["algorithm"]]
    rows = []
    for (_, tier), g in auc.groupby(["series", "tier"], sort=False):
        base = {"series": g["series"].iloc[0], "algorithm": g["algorithm"].iloc[0], "tier": tier,
                "tier_index": int(g["tier_index"].iloc[0]), "epsilon": float(g["epsilon"].iloc[0]),
                "error_bars": "seeds" if replicated else "runs"}
        rows.append({**base, "kind": "mean", "run_id": None, "recall": _mean(g["final_recall"]),
                     "recall_se": _se(g["final_recall"]), "recall_auc": _mean(g["recall_auc"]),
                     "auc_se": _se(g["recall_auc"]), "n": len(g)})
        for _, r in g.iterrows():
            rows.append({**base, "kind": "run", "run_id": int(r["run_id"]), "recall": r["final_recall"],
                         "recall_se": float("nan"), "recall_auc": r["recall_auc"], "auc_se": float("nan"), "n": 1})
    return pd.DataFrame(rows, columns=FRONTIER_COLUMNS)


# --- INO − IDP paired by seed -----------------------------------------------------------------------------

PAIRED_COLUMNS = ["series", "series_key", "ino_run_id", "idp_run_id", "seed_index", "tier", "tier_index", "epsilon",
                  "gain_final", "gain_auc", "diverged"]


def paired_gains(runs: list[dict], span=None) -> pd.DataFrame:
    """Per INO-SGD run and tier: final-recall and recall-AUC gain over its IDP-SGD run, paired by seed
    (:func:`engine.figures.frames.pair_runs`), in percentage points, over the runs' common ``span`` (default:
    :func:`engine.figures.common_span.common_span` of ``runs``); ``series`` is INO's series label; ``diverged``:
    the pair's runs that diverged, in words ('' for none: :func:`engine.figures.evidence.diverged_words`)."""
    hist = fr.tier_history(runs)
    auc = fr.recall_auc_table(runs, span=span).set_index(["run_id", "tier"])
    labels = fr.series_labels(runs)
    rows = []
    for ino, idp in fr.pair_runs(runs):
        if ino["id"] not in auc.index.get_level_values(0):
            continue
        diverged = ev.diverged_words([(r, ev.diverged_at(r, hist[hist.run_id == r["id"]])) for r in (ino, idp)])
        for (_, tier), a in auc.loc[[ino["id"]]].iterrows():
            if (idp["id"], tier) not in auc.index:
                continue
            b = auc.loc[(idp["id"], tier)]
            rows.append({"series": labels[ino["id"]], "series_key": series_key(ino), "ino_run_id": ino["id"],
                         "idp_run_id": idp["id"], "seed_index": seed_index(ino), "tier": tier,
                         "tier_index": int(a["tier_index"]), "epsilon": float(a["epsilon"]),
                         "gain_final": 100.0 * (a["final_recall"] - b["final_recall"]),
                         "gain_auc": 100.0 * (a["recall_auc"] - b["recall_auc"]), "diverged": diverged})
    return pd.DataFrame(rows, columns=PAIRED_COLUMNS)


def gain_summary(runs: list[dict]) -> dict | None:
    """The Results headline: the most private tier's INO − IDP gain of one INO-SGD series (the first one's, when
    the selection holds several, e.g. a sweep), by the lab's headline rules (:mod:`engine.figures.evidence`): the
    recall AUC gain (pp) ± s.e. over its paired seeds, the final gain, and the gain averaged over IDP-SGD's MID
    window on the tier (:func:`mid_window_gain`), each with its spread in words ("1 seed: no spread"), all over
    the runs' common span (``span``: its words when it cuts a run, else None); reruns counted once (``pairs``).
    No peak of the noisy gain curve. With a diverged run in a pair, ``not_comparable`` is the sentence that says
    so and every gain is nan (no winner). None without a pair."""
    tier = most_private_tier(runs)
    span = common_span(runs)
    pg = paired_gains(runs, span)
    if tier is None or pg.empty:
        return None
    p = pg[pg.tier == tier[0]]
    if p.empty:
        return None
    p = p[p.series_key == p.sort_values("ino_run_id")["series_key"].iloc[0]]
    n = len(p)
    out = {"tier": tier[0], "epsilon": tier[1], "series": p["series"].iloc[0], "pairs": n, "span": span.words(),
           "auc_gain": _mean(p["gain_auc"]), "auc_se": _se(p["gain_auc"]),
           "final_gain": _mean(p["gain_final"]), "final_se": _se(p["gain_final"]),
           "mid_gain": float("nan"), "mid_se": float("nan"), "mid_pairs": 0, "mid_window": None,
           "not_comparable": None}
    t = fr.recall_gain_over_time(runs)
    t = t[(t.tier == tier[0]) & t.ino_run_id.isin(set(p["ino_run_id"]))]
    if not t.empty:
        out.update(mid_window_gain(t))
    diverged = [w for w in p["diverged"].unique() if w]
    if diverged:
        out["not_comparable"] = ev.not_comparable_sentence(diverged, f"on the ε = {tier[1]:g} tier")
        out.update({k: float("nan") for k in ("auc_gain", "auc_se", "final_gain", "final_se", "mid_gain", "mid_se")})
    out["auc_spread"] = ev.spread_words(out["auc_se"], n)
    out["final_spread"] = ev.spread_words(out["final_se"], n)
    out["mid_spread"] = ev.spread_words(out["mid_se"], out["mid_pairs"])
    out["auc_words"] = f"INO − IDP area under the {tier[0]} tier's recall curve, {out['auc_spread']}"
    out["mid_words"] = _mid_words(out)
    return out


def _mid_words(summary: dict) -> str:
    """What the MID-window gain is, in words (the Results headline's help)."""
    window = summary["mid_window"]
    if window is None:
        return f"IDP-SGD had no MID on the {summary['tier']} tier: no window to average the gain over"
    where = f"steps {window[0]}–{window[1]}" if window[1] is not None else f"from step {window[0]}, still in it"
    if summary["mid_pairs"] > 1:
        where = f"each seed's own; the first's: {where}"
    return (f"INO − IDP recall gain averaged over the evaluations inside IDP-SGD's MID window on the "
            f"{summary['tier']} tier ({where}), not its largest value, {summary['mid_spread']}")


def mid_window_gain(gain: pd.DataFrame) -> dict:
    """The gain where the lab's phenomenon lives, smoothed over evaluations rather than read at its largest: per
    pair of a one-tier gain frame (:func:`engine.figures.frames.recall_gain_over_time`), the mean gain over the
    evaluations inside IDP-SGD's MID window on the tier (the lab's one MID rule on its tier loss, ``idp_loss``:
    from the first evaluation above its initial value to the first back at or below it, or to the last one);
    then the mean (pp) ± s.e. over the pairs with a window (``mid_pairs``), and the window of the first pair
    (``mid_window``: (start, end), end None while IDP-SGD is still in it). Pairs without a MID are left out."""
    values, window = [], None
    for _, g in gain.sort_values("step").groupby("ino_run_id", sort=True):
        m = mid_markers([[v] for v in g["idp_loss"].to_numpy(float)], list(g["step"]))[0]
        if m["onset_step"] is None:
            continue
        value = ev.window_mean(g["step"], g["gain"], m["onset_step"], m["end_step"])
        if math.isfinite(value):
            values.append(100.0 * value)
            window = window or (int(m["onset_step"]), None if m["end_step"] is None else int(m["end_step"]))
    mean, se, n = mean_se(values)
    return {"mid_gain": mean, "mid_se": se, "mid_pairs": n, "mid_window": window}


# --- INO internals and DP-SGD-S clips over training ---------------------------------------------------------

INO_COLUMNS = ["run_id", "run", "series", "seed_index", "step", "epoch", "quantity", "tier", "tier_index", "value"]


def ino_internals_frame(runs: list[dict]) -> pd.DataFrame:
    """Per INO-SGD run and evaluation: mean ρ per tier (``quantity`` "rho") and the fraction of clip mass
    down-weighted ("downweighted"), from each evaluation's INO state (``EvalRecord.ino``; stored under
    :data:`RHO_KEY` / :data:`DOWNWEIGHTED_KEY`). Empty when no run recorded them."""
    rows = []
    labels = fr.series_labels(runs)
    for run in runs:
        if not draws(run.get("algorithm"), "ino_internals"):  # INO-SGD's (its registry entry's figures)
            continue
        base = {"run_id": run["id"], "run": run_label(run), "series": labels[run["id"]], "seed_index": seed_index(run)}
        for e in fr.run_evals(run):
            if e.ino is None:
                continue
            tiers = e.tiers
            order = fr._tier_order(tiers)
            at = {**base, "step": e.step, "epoch": e.epoch}
            for k, v in enumerate(e.ino.rho_by_tier or ()):
                name = tiers[k].name if k < len(tiers) else f"tier {k}"
                rows.append({**at, "quantity": "rho", "tier": name, "tier_index": order.get(name, k),
                             "value": fr._finite(v)})
            if e.ino.downweighted_fraction is not None:
                rows.append({**at, "quantity": "downweighted", "tier": "", "tier_index": -1,
                             "value": fr._finite(e.ino.downweighted_fraction)})
    return pd.DataFrame(rows, columns=INO_COLUMNS)


CLIP_COLUMNS = ["run_id", "run", "series", "algorithm", "seed_index", "step", "epoch", "group", "group_index",
                "clip_norm", "noise_std", "base_clip", "noise_ratio", "noise_multiplier_ratio"]


def group_clip_frame(runs: list[dict], memo: dict | None = None) -> pd.DataFrame:
    """Per run of an algorithm that draws its group clips (its registry entry's figures: DP-SGD-S, DPSGD-F),
    evaluation and clip group: its algorithm's label, the group's clip norm C_k, the step's noise std
    z_Δ · max_k C_k (``EvalRecord.group_clip``; group names from the plan's ``group_clip.clip_groups``), the
    run's C (``base_clip``), the noise relative to plain DP-SGD's at the same ε, (z_Δ · max_k C_k) / (σ·C)
    (``noise_ratio``, :meth:`engine.train.records.GroupClipPlan.noise_ratio`) and z_Δ / σ
    (``noise_multiplier_ratio``); the last two NaN for a plan stored without σ. ``memo``: a live view's frame
    memo (:func:`engine.figures.frames.run_evals`)."""
    rows = []
    labels = fr.series_labels(runs)
    for run in runs:
        if not draws(run.get("algorithm"), "group_clip"):  # its registry entry's figures say so
            continue
        label = algorithm_label(run.get("algorithm"))
        setup = PlanRecord.of(run.get("plan")).group_clip
        names = list(setup.clip_groups or ()) if setup is not None else []
        base_clip = fr._finite(setup.base_clip if setup is not None else None)
        z_ratio = fr._finite(setup.noise_multiplier_ratio if setup is not None else None)
        for e in fr.run_evals(run, memo):
            clips = e.group_clip
            if clips is None:
                continue
            ratio = fr._finite(setup.noise_ratio(clips.noise_std) if setup is not None else None)
            for k, c in enumerate(clips.clip_norms or ()):
                rows.append({"run_id": run["id"], "run": run_label(run), "series": labels[run["id"]],
                             "algorithm": label, "seed_index": seed_index(run), "step": e.step, "epoch": e.epoch,
                             "group": str(names[k]) if k < len(names) else f"group {k}", "group_index": k,
                             "clip_norm": fr._finite(c), "noise_std": fr._finite(clips.noise_std),
                             "base_clip": base_clip, "noise_ratio": ratio, "noise_multiplier_ratio": z_ratio})
    return pd.DataFrame(rows, columns=CLIP_COLUMNS)


NOISE_RATIO_LARGE = 1.5  # a run's noise at least this many times DP-SGD's: the live view says what it costs


def noise_cost_sentence(frame: pd.DataFrame, *, threshold: float = NOISE_RATIO_LARGE) -> str | None:
    """What moving clips' noise costs, in words, from :func:`group_clip_frame`: for each series (of DP-SGD-S,
    DPSGD-F: the algorithms that draw their group clips) whose
    noise at its runs' latest evaluation (mean over its seeds) is at least ``threshold`` × DP-SGD's at the same
    ε, one sentence with that ratio, its largest group clip (in units of C) and z_Δ / σ (the ratio is their
    product), named by its algorithm. None when no series is that far (small cost, no such run, or a plan stored
    without σ).
    Raw text (series labels as the user wrote them): the page escapes it."""
    if frame.empty:
        return None
    d = frame[np.isfinite(frame["noise_ratio"].to_numpy(float))]
    if d.empty:
        return None
    d = d[d["step"] == d.groupby("run_id")["step"].transform("max")]  # each run's latest evaluation
    per_run = d.groupby("run_id", sort=False).agg(series=("series", "first"), name=("algorithm", "first"),
                                                  ratio=("noise_ratio", "first"),
                                                  clip=("clip_norm", "max"), base=("base_clip", "first"),
                                                  z=("noise_multiplier_ratio", "first"))
    per_run["clip"] = per_run["clip"] / per_run["base"]
    several = per_run["series"].nunique() > 1
    out = []
    for series, g in per_run.groupby("series", sort=False):
        ratio = _mean(g["ratio"])
        if not ratio >= threshold:
            continue
        name = str(g["name"].iloc[0])
        who = name if not several else series if series.startswith(name) else f"{name} ({series})"
        seeds = f", mean over {len(g)} seeds" if len(g) > 1 else ""
        out.append(f"{who} adds {ratio:.1f}× the noise DP-SGD would at the same ε (latest evaluation{seeds}: "
                   f"largest group clip {_mean(g['clip']):.3g} · C, z_Δ/σ = {_mean(g['z']):.3g}): "
                   "expect lower accuracy than DP-SGD.")
    return " ".join(out) or None


# --- audit: GPR per tier against the tier's ε ---------------------------------------------------------------

def advantage_ceiling(epsilon: float, delta: float) -> float:
    """The largest membership advantage TPR − FPR any (ε, δ)-DP mechanism allows:
    (e^ε − 1 + 2δ) / (e^ε + 1) (Kairouz, Oh & Viswanath 2015, the (ε, δ) privacy region)."""
    if epsilon is None or not math.isfinite(epsilon):
        return float("nan")
    return min(1.0, (math.expm1(epsilon) + 2 * delta) / (math.exp(epsilon) + 1))


def epsilon_from_advantage(adv: float, delta: float) -> float:
    """The inverse of :func:`advantage_ceiling`: an advantage ``adv`` implies ε ≥ ln((1 + adv − 2δ)/(1 − adv)),
    clamped at 0 (a point estimate: no confidence level)."""
    if adv is None or not math.isfinite(adv):
        return float("nan")
    if adv >= 1:
        return math.inf
    return max(0.0, math.log(max(1 + adv - 2 * delta, 1e-300) / (1 - adv)))


AUDIT_TIER_COLUMNS = ["algorithm", "label", "tier", "epsilon", "gpr", "low", "high", "null_floor", "ceiling",
                      "epsilon_from_gpr", "epsilon_lower_bound", "delta", "formal_dp"]


def audit_tier_frame(report) -> pd.DataFrame:
    """Per audited algorithm and tier: the claimed ε, the tier's GPR with CI (audits grouped by tier), the
    largest advantage that ε allows, the ε the GPR implies, and the audit's Clopper–Pearson ε lower bound."""
    if report is None:
        return pd.DataFrame(columns=AUDIT_TIER_COLUMNS)

    report = as_report(report)
    rows = []
    by_tier = report.group_by == "tier"
    for a in report.algorithms:
        delta = a.epsilon_delta if a.epsilon_delta is not None else float((report.config or {}).get("delta") or 0.0)
        for t, claimed in zip(a.epsilon, a.claimed_epsilons()):
            e = a.gpr.get(t.name) if by_tier else None
            gpr = fr._finite(e.value) if e is not None else float("nan")
            eps = fr._finite(claimed if claimed is not None else t.target)
            rows.append({"algorithm": a.key, "label": a.label, "tier": t.name, "epsilon": eps, "gpr": gpr,
                         "low": fr._finite(e.low) if e is not None else float("nan"),
                         "high": fr._finite(e.high) if e is not None else float("nan"),
                         "null_floor": fr._finite(a.null_groups.get(t.name, a.null_floor) if by_tier else a.null_floor),
                         "ceiling": advantage_ceiling(eps, delta), "epsilon_from_gpr": epsilon_from_advantage(gpr, delta),
                         "epsilon_lower_bound": fr._finite(t.lower_bound), "delta": delta, "formal_dp": a.formal_dp})
    return pd.DataFrame(rows, columns=AUDIT_TIER_COLUMNS)


# --- the one-slide results table ------------------------------------------------------------------------------

def _pm(mean: float, se: float, digits: int = 1, signed: bool = False) -> str | None:
    if not math.isfinite(mean):
        return None
    s = f"{mean:+.{digits}f}" if signed else f"{mean:.{digits}f}"
    return s + (f" ± {se:.{digits}f}" if math.isfinite(se) else "")


NOT_COMPARABLE = "not comparable (diverged)"  # a gain cell of a pair with a diverged run


def results_table(runs: list[dict], report=None) -> pd.DataFrame:
    """One row per algorithm (series): runs (seeds), overall accuracy, the most private tier's final recall
    and recall AUC, its gain vs IDP-SGD (pp, ± s.e. over paired seeds) and the audit's Δ (pp) if audited; all
    over the runs' common span (:func:`engine.figures.common_span.common_span`: the figure says so when it cuts
    a run). A rerun (:func:`engine.figures.evidence.reruns`) is counted once, and a series with a diverged run in
    a pair has no gain: "not comparable (diverged)" (:mod:`engine.figures.evidence`)."""
    runs = ev.distinct(runs)
    span = common_span(runs)
    final = fr.final_table(runs, span=span)
    tier = most_private_tier(runs)
    if final.empty or tier is None:
        return pd.DataFrame(columns=["algorithm", "runs", "accuracy (%)"])
    auc = fr.recall_auc_table(runs, span=span)
    auc = auc[auc.tier == tier[0]].set_index("run_id")
    gains = paired_gains(runs, span)
    gains = gains[gains.tier == tier[0]]
    deltas = {}
    if report is not None:
        for a in as_report(report).algorithms:  # the first of each algorithm; DP-SGD-S's controls are not DP-SGD
            if a.control is None:
                deltas.setdefault(a.name, a.delta.value)
    t = f"{tier[0]}"
    rows = []
    for series, g in final.groupby("series", sort=False):
        ids = list(g["run_id"])
        algo = g["algorithm"].iloc[0]
        rec = [auc.at[i, "final_recall"] for i in ids if i in auc.index]
        area = [auc.at[i, "recall_auc"] for i in ids if i in auc.index]
        gg = gains[gains.ino_run_id.isin(ids)]
        delta = deltas.get(algo)
        broken = bool((gg["diverged"] != "").any())
        rows.append({"algorithm": series, "runs": len(ids),
                     "accuracy (%)": _pm(100 * _mean(g["accuracy"]), 100 * _se(g["accuracy"])),
                     f"{t} recall (%)": _pm(100 * _mean(rec), 100 * _se(rec)),
                     f"{t} recall AUC (%)": _pm(100 * _mean(area), 100 * _se(area)),
                     f"{t} gain vs IDP, AUC (pp)": NOT_COMPARABLE if broken else
                     _pm(_mean(gg["gain_auc"]), _se(gg["gain_auc"]), signed=True) if not gg.empty else None,
                     f"{t} gain vs IDP, final (pp)": NOT_COMPARABLE if broken else
                     _pm(_mean(gg["gain_final"]), _se(gg["gain_final"]), signed=True) if not gg.empty else None,
                     "audit Δ (pp)": None if delta is None else f"{delta:.2f}"})
    out = pd.DataFrame(rows)
    if not deltas:
        out = out.drop(columns=["audit Δ (pp)"])
    return out
