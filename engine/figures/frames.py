"""Tidy frames of training runs: run records in, one :class:`pandas.DataFrame` per question out.

Histories (``tier_history``, ``class_history``, ``overall_history``, ``mid_spans``) show each run as far
as it went; comparisons (``owner_recall``, ``pearson_by_run``, ``recall_gain_by_class``, ``recall_auc_table``,
``final_table``, ``fairness_table``, ``mid_summary``) read every run over the span all compared runs reached
(:func:`engine.figures.common_span.common_span`: a cancelled run beside a finished one is compared over the
steps both reached), and ``recall_gain_over_time`` only where both runs of a pair have got to. Frames hold raw
text (run and tier names as the user wrote them); the figure builders in :mod:`engine.figures.training` escape
it. Nothing here reads the store or plots.

A run record's ``evals`` are the store's dicts (or :class:`engine.train.records.EvalRecord`); they are read as
records (:func:`run_evals`). ``memo`` (a dict kept by a live view between refreshes, or by one figure build):
each evaluation is converted once, and only new evaluations are turned into rows (:func:`_run_rows`).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from engine.config.run import AlgorithmConfig
from engine.dp.algorithms import find_algorithm
from engine.figures import evidence as ev
from engine.figures.common_span import Span, common_span
from engine.jobs.runs import (algorithm_label, dp_note, run_config, run_label, run_seed, seed_index, series_key,
                              series_label)
from engine.models.metrics import mid_markers, recall_auc
from engine.train.records import EvalRecord

ID_COLUMNS = ["run_id", "run", "algorithm", "seed", "seed_index", "series"]


def series_labels(runs: list[dict], rerun_of: dict | None = None) -> dict[int, str]:
    """Run id → the label of its series (:func:`engine.jobs.runs.series_label` of the series' lowest seed index):
    the replicates of one series (same group and config but the seed) share it. A series of reruns
    (:func:`engine.figures.evidence.reruns`) is marked: "INO-SGD #14 (rerun of #12)"."""
    rerun_of = ev.reruns(runs) if rerun_of is None else rerun_of
    members: dict[str, list[dict]] = {}
    for run in sorted(runs, key=seed_index):
        members.setdefault(series_key(run), []).append(run)
    out = {}
    for group in members.values():
        ids = [r["id"] for r in group]
        label = series_label(group[0], ids)
        if all(i in rerun_of for i in ids):
            label += ev.rerun_mark([rerun_of[i] for i in ids])
        out.update({i: label for i in ids})
    return out


def run_names(runs: list[dict], rerun_of: dict | None = None) -> dict[int, str]:
    """Run id → its label in frames and legends (:func:`engine.jobs.runs.run_label`), a rerun's marked."""
    rerun_of = ev.reruns(runs) if rerun_of is None else rerun_of
    return {r["id"]: run_label(r) + (ev.rerun_mark([rerun_of[r["id"]]]) if r["id"] in rerun_of else "")
            for r in runs}


def _labels(runs: list[dict]) -> tuple[dict, dict]:
    """(series labels, run labels) of the runs, reruns marked in both: what :func:`_ident` reads."""
    rerun_of = ev.reruns(runs)
    return series_labels(runs, rerun_of), run_names(runs, rerun_of)


def _ident(run: dict, labels: tuple[dict, dict]) -> dict:
    """The identifying columns of every frame: run, algorithm, seed, seed index and series (``labels``:
    :func:`_labels`)."""
    series, names = labels
    name = names.get(run["id"], run_label(run))
    return {"run_id": run["id"], "run": name, "algorithm": run.get("algorithm", ""), "seed": run_seed(run),
            "seed_index": seed_index(run), "series": series.get(run["id"], name)}


def run_evals(run: dict, memo: dict | None = None) -> list[EvalRecord]:
    """The run's evaluations as records (stored dicts converted, records kept as they are). With a ``memo``
    the records are kept in it and only the evaluations new since the last call are converted (a run's
    evaluations are append-only; a shorter list, or another step where the kept ones end, starts again)."""
    evals = run.get("evals") or []
    if memo is None:
        return [EvalRecord.of(e) for e in evals]
    key = ("records", run["id"])
    done = memo.get(key)
    if done is None or len(done) > len(evals) or (done and done[-1].step != _step(evals[len(done) - 1])):
        done = memo[key] = []
    if len(done) < len(evals):
        done.extend(EvalRecord.of(e) for e in evals[len(done):])
    return done


def forget(memo: dict, runs=()) -> None:
    """Empty ``memo`` but for the evaluation records of the runs not in ``runs`` (ids): every row is made
    again (labels, series and totals may have changed); a run's records are kept unless it is named (a run
    whose status changed may have been run again: its evaluations start over)."""
    stale = set(runs)
    for key in [k for k in memo if k[0] != "records" or k[1] in stale]:
        del memo[key]


def _step(e) -> int:
    return e.step if isinstance(e, EvalRecord) else e.get("step", 0)


def last_eval(run: dict, memo: dict | None = None) -> EvalRecord | None:
    """The run's last evaluation as a record (only that one converted without a memo); None before the first."""
    if memo is not None:
        evals = run_evals(run, memo)
        return evals[-1] if evals else None
    evals = run.get("evals") or []
    return EvalRecord.of(evals[-1]) if evals else None


def _tier_order(tiers) -> dict[str, int]:
    """Colour index per tier name (``tiers``: one evaluation's TierMetrics): ascending ε (ties keep the
    configured order)."""
    order = sorted(range(len(tiers)), key=lambda k: (tiers[k].epsilon or math.inf, k))
    return {tiers[k].name: rank for rank, k in enumerate(order)}


def _finite(x) -> float:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return float("nan")
    return x if math.isfinite(x) else float("nan")


def _raw_loss(x) -> float:
    """A loss as recorded: non-finite values (a diverged model) stay inf/nan; missing ones are nan."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def private_epsilon_spent(e) -> float:
    """ε spent of the evaluation's (an EvalRecord or its dict) most private tier (lowest budget); nan when
    not accounted."""
    tiers = EvalRecord.of(e).tiers
    if not tiers:
        return float("nan")
    order = _tier_order(tiers)
    first = min(range(len(tiers)), key=lambda k: order.get(tiers[k].name, k))
    return _finite(tiers[first].epsilon_spent)


TIER_COLUMNS = ID_COLUMNS + ["step", "epoch", "elapsed", "progress", "tier", "tier_index", "epsilon",
                             "epsilon_spent", "loss", "recall", "accuracy", "raw_loss"]


def _run_rows(run: dict, evals: list[EvalRecord], memo: dict | None, kind: str, stamp: tuple, make) -> list[dict]:
    """The rows of one run's evaluations (``evals``: :func:`run_evals`), ``make(evals, start)`` giving those of
    ``evals[start:]``. With a ``memo`` (a live view's dict, kept between refreshes) only new evaluations are
    turned into rows: a run's evaluations are append-only while its ``stamp`` (labels, totals, tiers) stays
    the same."""
    if memo is None:
        return make(evals, 0)
    key = (kind, run["id"])
    done = memo.get(key)
    if done is None or done[0] != stamp or done[1] > len(evals):
        done = (stamp, 0, [])
    rows = done[2] + make(evals, done[1]) if done[1] < len(evals) else done[2]
    memo[key] = (stamp, len(evals), rows)
    return rows


def _stamp(evals: list[EvalRecord], ident: dict, total) -> tuple:
    tiers = evals[-1].tiers if evals else ()
    return (tuple(ident.values()), total, tuple(t.name for t in tiers))


def _total(run: dict, evals: list[EvalRecord]) -> int:
    """The run's planned step total (progress = step / total): the store's, else its last evaluation's step."""
    return run.get("total_steps") or (evals[-1].step if evals else None) or 1


def tier_history(runs: list[dict], memo: dict | None = None) -> pd.DataFrame:
    """One row per (run, evaluation, tier); ``raw_loss`` keeps non-finite losses (divergence), ``loss`` has nan.
    ``memo``: see :func:`_run_rows` (the live figures' incremental refresh)."""
    rows = []
    labels = _labels(runs)
    for run in runs:
        ident = _ident(run, labels)
        evals = run_evals(run, memo)
        total = _total(run, evals)

        def make(evals, start, ident=ident, total=total):
            out = []
            for e in evals[start:]:
                order = _tier_order(e.tiers)
                for k, t in enumerate(e.tiers):
                    out.append({**ident, "step": e.step, "epoch": _finite(e.epoch),
                                "elapsed": _finite(e.elapsed), "progress": e.step / max(total, 1),
                                "tier": t.name, "tier_index": order.get(t.name, k),
                                "raw_loss": _raw_loss(t.loss), "epsilon": _finite(t.epsilon),
                                "epsilon_spent": _finite(t.epsilon_spent), "loss": _finite(t.loss),
                                "recall": _finite(t.recall), "accuracy": _finite(t.accuracy)})
            return out
        rows.extend(_run_rows(run, evals, memo, "tier", _stamp(evals, ident, total), make))
    return pd.DataFrame(rows, columns=TIER_COLUMNS)


def class_tier_lookup(run: dict, memo: dict | None = None) -> dict[int, tuple[str, float]]:
    """class index → (tier name, ε) for class-assigned tiers; {} otherwise."""
    cfg = run_config(run)
    if cfg is None or cfg.tiers.assign != "class":
        return {}
    last = last_eval(run, memo)
    names = [t.name for t in (last.tiers if last is not None else ())]
    out = {}
    for k, t in enumerate(cfg.tiers.tiers):
        name = names[k] if k < len(names) else (t.name or f"tier {k}")
        for c in t.classes:
            out[int(c)] = (name, float(t.epsilon))
    return out


CLASS_COLUMNS = ID_COLUMNS + ["step", "epoch", "elapsed", "progress", "private_epsilon_spent", "class",
                              "class_index", "tier", "epsilon", "loss", "recall", "accuracy"]


def class_history(runs: list[dict], memo: dict | None = None) -> pd.DataFrame:
    """One row per (run, evaluation, class); ``private_epsilon_spent``: ε spent of the most private tier."""
    rows = []
    labels = _labels(runs)
    for run in runs:
        ident = _ident(run, labels)
        evals = run_evals(run, memo)
        total = _total(run, evals)
        stamp = _stamp(evals, ident, total)
        key = ("lookup", run["id"])
        if memo is not None and key in memo and memo[key][0] == stamp:
            lookup = memo[key][1]
        else:
            lookup = class_tier_lookup(run, memo)
            if memo is not None:
                memo[key] = (stamp, lookup)

        def make(evals, start, ident=ident, total=total, lookup=lookup):
            out = []
            for e in evals[start:]:
                priv = private_epsilon_spent(e)
                for c, m in enumerate(e.classes):
                    tier, eps = lookup.get(c, ("", float("nan")))
                    out.append({**ident, "step": e.step, "epoch": _finite(e.epoch),
                                "elapsed": _finite(e.elapsed), "progress": e.step / max(total, 1),
                                "private_epsilon_spent": priv, "class": _class_name(m, c),
                                "class_index": c, "tier": tier, "epsilon": eps, "loss": _finite(m.loss),
                                "recall": _finite(m.recall), "accuracy": _finite(m.accuracy)})
            return out
        rows.extend(_run_rows(run, evals, memo, "class", stamp, make))
    return pd.DataFrame(rows, columns=CLASS_COLUMNS)


def _class_name(m, c: int) -> str:
    """A class's name as its evaluation records it, else its index."""
    return m.name if m.name is not None else str(c)


OVERALL_COLUMNS = ID_COLUMNS + ["step", "epoch", "elapsed", "private_epsilon_spent", "loss", "accuracy",
                                "balanced_accuracy"]


def overall_history(runs: list[dict], memo: dict | None = None) -> pd.DataFrame:
    rows = []
    labels = _labels(runs)
    for run in runs:
        ident = _ident(run, labels)
        evals = run_evals(run, memo)

        def make(evals, start, ident=ident):
            return [{**ident, "step": e.step, "epoch": _finite(e.epoch), "elapsed": _finite(e.elapsed),
                     "private_epsilon_spent": private_epsilon_spent(e), "loss": _finite(e.overall.loss),
                     "accuracy": _finite(e.overall.accuracy), "balanced_accuracy": _finite(e.overall.balanced_accuracy)}
                    for e in evals[start:]]
        rows.extend(_run_rows(run, evals, memo, "overall", _stamp(evals, ident, None), make))
    return pd.DataFrame(rows, columns=OVERALL_COLUMNS)


MID_COLUMNS = ID_COLUMNS + ["tier", "tier_index", "epsilon", "initial_loss", "onset_step",
               "end_step", "peak_step", "peak_increase", "last_step", "state"]


def mid_spans(runs: list[dict], memo: dict | None = None) -> pd.DataFrame:
    """MID (minority initial drop) per run and tier, from the history so far (works while running).

    state: "none" (loss never rose above its initial value), "ongoing" (above it at the last
    evaluation), "recovered" (back at or below it).
    """
    rows = []
    labels = _labels(runs)
    for run in runs:
        evals = run_evals(run, memo)
        if not evals or not evals[0].tiers:
            continue
        steps = [e.step for e in evals]
        losses = [[_finite(t.loss) for t in e.tiers] for e in evals]
        marks = mid_markers(losses, steps)
        order = _tier_order(evals[-1].tiers)
        for k, (t, m) in enumerate(zip(evals[-1].tiers, marks)):
            state = "none" if m["onset_step"] is None else ("recovered" if m["end_step"] is not None else "ongoing")
            rows.append({**_ident(run, labels),
                         "tier": t.name, "tier_index": order.get(t.name, k), "epsilon": _finite(t.epsilon),
                         "initial_loss": losses[0][k], "onset_step": m["onset_step"], "end_step": m["end_step"],
                         "peak_step": m["peak_step"], "peak_increase": m["peak_increase"], "last_step": steps[-1],
                         "state": state})
    return pd.DataFrame(rows, columns=MID_COLUMNS)


# --- data: comparisons (finished or partial runs, over the span all of them reached) ------------------

OWNER_COLUMNS = ID_COLUMNS + ["owner", "owner_kind", "tier", "epsilon", "recall"]


def compared_eval(run: dict, span: Span, memo: dict | None = None) -> EvalRecord | None:
    """The run's last evaluation within the compared ``span`` (:func:`engine.figures.common_span.common_span`
    of the runs compared with it); None before the first."""
    limit = span.limit(run["id"])
    if limit is None:
        return last_eval(run, memo)
    return span.last(run_evals(run, memo), run["id"])


def owner_recall(runs: list[dict], memo: dict | None = None, span: Span | None = None) -> pd.DataFrame:
    """Recall per data owner at each run's last compared evaluation (``span``: default the runs' common span):
    per class when tiers are assigned by class, else per tier."""
    rows = []
    labels = _labels(runs)
    span = common_span(runs) if span is None else span
    for run in runs:
        last = compared_eval(run, span, memo)
        if last is None:
            continue
        ident = _ident(run, labels)
        lookup = class_tier_lookup(run, memo)
        if lookup:
            for c, m in enumerate(last.classes):
                tier, eps = lookup.get(c, ("", float("nan")))
                rows.append({**ident, "owner": _class_name(m, c), "owner_kind": "class", "tier": tier, "epsilon": eps,
                             "recall": _finite(m.recall)})
        else:
            for t in last.tiers:
                rows.append({**ident, "owner": t.name, "owner_kind": "tier", "tier": t.name,
                             "epsilon": _finite(t.epsilon), "recall": _finite(t.recall)})
    return pd.DataFrame(rows, columns=OWNER_COLUMNS)


def pearson_by_run(owners: pd.DataFrame) -> pd.DataFrame:
    """Pearson r (and two-sided p) between owner recall and privacy budget, per run."""
    from scipy.stats import pearsonr

    rows = []
    for ident, g in owners.groupby(ID_COLUMNS, sort=False):
        g = g.dropna(subset=["epsilon", "recall"])
        r = p = float("nan")
        if len(g) >= 3 and g["epsilon"].nunique() > 1 and g["recall"].nunique() > 1:
            res = pearsonr(g["epsilon"].to_numpy(float), g["recall"].to_numpy(float))
            r, p = float(res.statistic), float(res.pvalue)
        rows.append({**dict(zip(ID_COLUMNS, ident)), "n": len(g), "r": r, "p": p})
    return pd.DataFrame(rows, columns=ID_COLUMNS + ["n", "r", "p"])


def pair_runs(runs: list[dict]) -> list[tuple[dict, dict]]:
    """(INO-SGD run, IDP-SGD run it builds on) pairs — a run of an algorithm whose gains are measured against
    others (its registry entry's ``gain_against``, engine.dp.algorithms) with one of those: the one of the same
    planner mode preferred (``gain_reference``: IDP-SGD of INO's mode); same group preferred, and within it the
    same ``seed_index`` and seed (replicate j of INO pairs with replicate j of IDP: same batches and noise).
    A rerun (:func:`engine.figures.evidence.reruns`: same config and seed as a run kept) is no new pair: an INO
    rerun pairs with nothing, and an IDP-SGD one gives way to its kept run (the same curves)."""
    pairs = []
    rerun_of = ev.reruns(runs)
    for ino in runs:
        entry = find_algorithm(ino.get("algorithm"))
        if entry is None or not entry.gain_against or ino["id"] in rerun_of:
            continue
        cfg = run_config(ino)
        want = entry.gain_reference(cfg.algorithm if cfg is not None else AlgorithmConfig(name=entry.name))
        idps = [r for r in ev.distinct(runs, rerun_of) if r.get("algorithm") in entry.gain_against]
        cands = [r for r in idps if r["algorithm"] == want] or idps
        if not cands:
            continue
        same = [r for r in cands if r.get("group_id") and r.get("group_id") == ino.get("group_id")] or cands
        # the same seed and seed index: the same initialisation, batches and noise (a k-seed job's row j,
        # or a lone run with the same seed)
        seeded = [r for r in same if seed_index(r) == seed_index(ino) and run_seed(r) == run_seed(ino)] or \
            [r for r in same if seed_index(r) == seed_index(ino)]
        pairs.append((ino, (seeded or same)[0]))
    return pairs


def _pair_label(ino: dict, idp: dict) -> str:
    return f"INO #{ino['id']} − {algorithm_label(idp['algorithm'])} #{idp['id']}"


def _pair_ident(ino: dict, idp: dict, labels: dict) -> dict:
    """Identifying columns of a pair: its label, runs, INO's seed and the pair's series (what bands aggregate)."""
    pair = _pair_label(ino, idp)
    single = labels.get(ino["id"]) == run_label(ino) and labels.get(idp["id"]) == run_label(idp)
    series = pair if single else f"{labels.get(ino['id'])} − {labels.get(idp['id'])}"
    return {"pair": pair, "ino_run_id": ino["id"], "idp_run_id": idp["id"], "seed": run_seed(ino),
            "seed_index": seed_index(ino), "series": series}


PAIR_COLUMNS = ["pair", "ino_run_id", "idp_run_id", "seed", "seed_index", "series"]
GAIN_CLASS_COLUMNS = PAIR_COLUMNS + ["owner", "tier", "epsilon", "ino_recall", "idp_recall", "gain"]


def recall_gain_by_class(runs: list[dict], memo: dict | None = None, span: Span | None = None) -> pd.DataFrame:
    """Per-owner recall gain INO − IDP at the end of the runs' common span (their final recall when every run
    finished; owner = class for class tiers, else tier); one row per seed pair."""
    owners = owner_recall(runs, memo, span)
    labels = series_labels(runs)
    rows = []
    for ino, idp in pair_runs(runs):
        a = owners[owners.run_id == ino["id"]].set_index("owner")
        b = owners[owners.run_id == idp["id"]].set_index("owner")
        for owner in a.index.intersection(b.index):
            rows.append({**_pair_ident(ino, idp, labels),
                         "owner": owner, "tier": a.at[owner, "tier"], "epsilon": a.at[owner, "epsilon"],
                         "ino_recall": a.at[owner, "recall"], "idp_recall": b.at[owner, "recall"],
                         "gain": a.at[owner, "recall"] - b.at[owner, "recall"]})
    return pd.DataFrame(rows, columns=GAIN_CLASS_COLUMNS)


GAIN_TIME_COLUMNS = PAIR_COLUMNS + ["step", "epoch", "elapsed", "progress", "tier", "tier_index", "epsilon",
                                    "epsilon_spent", "ino_recall", "idp_recall", "gain", "idp_loss", "ino_loss",
                                    "diverged"]


def recall_gain_over_time(runs: list[dict], hist: pd.DataFrame | None = None, memo: dict | None = None) -> pd.DataFrame:
    """Per-tier recall gain INO − IDP along training (IDP interpolated onto INO's progress), one row per seed
    pair (:func:`pair_runs`: replicate j with replicate j) and INO evaluation; step, epoch, elapsed and ε spent
    are INO's, and so is IDP-SGD's tier loss (``idp_loss``, interpolated the same way) beside INO's own
    (``ino_loss``): the headline reads both algorithms' MID from them by the one MID rule. ``diverged``: the
    pair's runs that diverged, in words (:func:`engine.figures.evidence.diverged_words`; '' for none): a pair with
    one has no winner. ``hist``: the runs' :func:`tier_history` when the caller has it."""
    hist = tier_history(runs, memo) if hist is None else hist
    labels = series_labels(runs)
    parts = []
    for ino, idp in pair_runs(runs):
        a, b = hist[hist.run_id == ino["id"]], hist[hist.run_id == idp["id"]]
        ident = _pair_ident(ino, idp, labels)
        diverged = ev.diverged_words([(ino, ev.diverged_at(ino, a)), (idp, ev.diverged_at(idp, b))])
        for tier, ga in a.groupby("tier", sort=False):
            gb = b[b.tier == tier].sort_values("progress")
            if gb.empty:
                continue
            ga = ga.sort_values("progress")
            ga = ga[ga["progress"] <= gb["progress"].max() + 1e-9]  # IDP has not got further (yet)
            idp_rec = np.interp(ga["progress"].to_numpy(float), gb["progress"].to_numpy(float),
                                gb["recall"].to_numpy(float))
            part = ga[["step", "epoch", "elapsed", "progress", "tier", "tier_index", "epsilon", "epsilon_spent"]].copy()
            part["ino_recall"], part["idp_recall"] = ga["recall"].to_numpy(float), idp_rec
            part["gain"] = part["ino_recall"] - idp_rec
            part["idp_loss"] = np.interp(ga["progress"].to_numpy(float), gb["progress"].to_numpy(float),
                                         gb["loss"].to_numpy(float))
            part["ino_loss"] = ga["loss"].to_numpy(float)
            part["diverged"] = diverged
            for k, v in ident.items():
                part[k] = v
            parts.append(part)
    if not parts:
        return pd.DataFrame(columns=GAIN_TIME_COLUMNS)
    return pd.concat(parts, ignore_index=True)[GAIN_TIME_COLUMNS]


def recall_auc_table(runs: list[dict], memo: dict | None = None, span: Span | None = None) -> pd.DataFrame:
    """Area under each tier's recall-vs-progress curve, normalised to [0, 1]: the summary's own
    :func:`engine.models.metrics.recall_auc` over the evaluations within the compared ``span`` (default: the
    runs' common span; a run with only its initial evaluation: that recall); ``final_recall`` is the recall at
    the span's end."""
    span = common_span(runs) if span is None else span
    hist = span.keep(tier_history(runs, memo))
    rows = []
    for key, g in hist.groupby(ID_COLUMNS + ["tier"], sort=False):
        g = g.sort_values("step")
        rows.append({**dict(zip(ID_COLUMNS + ["tier"], key)),
                     "tier_index": int(g["tier_index"].iloc[0]), "epsilon": g["epsilon"].iloc[0],
                     "recall_auc": recall_auc(g["step"], g["recall"]), "final_recall": g["recall"].iloc[-1]})
    return pd.DataFrame(rows, columns=ID_COLUMNS + ["tier", "tier_index", "epsilon", "recall_auc", "final_recall"])


FINAL_COLUMNS = ID_COLUMNS + ["status", "steps", "loss", "accuracy", "balanced_accuracy", "dp"]


def final_table(runs: list[dict], memo: dict | None = None, span: Span | None = None) -> pd.DataFrame:
    """Overall loss and accuracy per run at its last compared evaluation (``span``: default the common span)."""
    rows = []
    labels = _labels(runs)
    span = common_span(runs) if span is None else span
    for run in runs:
        last = compared_eval(run, span, memo)
        if last is None:
            continue
        o = last.overall
        rows.append({**_ident(run, labels), "status": run.get("status", ""), "steps": last.step, "loss": _finite(o.loss),
                     "accuracy": _finite(o.accuracy), "balanced_accuracy": _finite(o.balanced_accuracy),
                     "dp": dp_note(run) or "formal DP"})
    return pd.DataFrame(rows, columns=FINAL_COLUMNS)


def fairness_table(runs: list[dict], memo: dict | None = None, span: Span | None = None) -> pd.DataFrame:
    """Outcome-fairness metrics per run at its last compared evaluation (``span``: default the common span)."""
    rows = []
    labels = _labels(runs)
    span = common_span(runs) if span is None else span
    for run in runs:
        last = compared_eval(run, span, memo)
        fair = last.fairness.to_dict() if last is not None and last.fairness is not None else None
        if not fair:
            continue
        for metric, value in fair.items():
            rows.append({**_ident(run, labels), "metric": metric, "value": _finite(value)})
    return pd.DataFrame(rows, columns=ID_COLUMNS + ["metric", "value"])


def mid_summary(runs: list[dict], memo: dict | None = None, span: Span | None = None) -> pd.DataFrame:
    """The MID table: per run and tier, onset/end/peak (over the run's whole history), final recall and recall
    AUC (over the compared ``span``, default the runs' common span: see :func:`recall_auc_table`)."""
    spans = mid_spans(runs, memo)
    auc = recall_auc_table(runs, memo, span)
    if spans.empty:
        return pd.DataFrame(columns=["run", "seed", "series", "tier", "ε", "MID", "onset step", "end step", "peak step",
                                     "peak loss increase", "final recall", "recall AUC", "DP"])
    merged = spans.merge(auc[["run_id", "tier", "recall_auc", "final_recall"]], on=["run_id", "tier"], how="left")
    notes = {r["id"]: dp_note(r) or "formal DP" for r in runs}
    out = pd.DataFrame({
        "run": merged["run"], "seed": merged["seed"], "series": merged["series"], "tier": merged["tier"], "ε": merged["epsilon"], "MID": merged["state"],
        "onset step": merged["onset_step"], "end step": merged["end_step"], "peak step": merged["peak_step"],
        "peak loss increase": merged["peak_increase"].round(4), "final recall": merged["final_recall"].round(4),
        "recall AUC": merged["recall_auc"].round(4), "DP": merged["run_id"].map(notes),
    })
    return out

