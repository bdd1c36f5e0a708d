"""Paired-seed statistics of tiered runs (INO-SGD variants against the IDP-SGD run of the same seed).

Input: the run records of the store (``engine.figures.export.load_runs``) and, per run, its (algorithm key, seed).
The per-evaluation numbers come from the engine's tidy frames (``engine.figures.frames.tier_history`` /
``class_history``); this module only aligns them by seed and evaluation step and averages over seeds.
Recall, gains and accuracy are in percent. Tiers are ordered from the smallest ε.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from engine.models.metrics import recall_auc
from experiments.common import finite, mean_se
from engine.figures.common_span import common_span
from engine.figures.frames import class_history, mid_spans, run_evals, tier_history


@dataclass
class RunRef:
    run_id: int
    key: str  # algorithm key in the spec ("idp", "ino_b1", ...)
    seed: int


def frames(runs: list[dict], refs: list[RunRef]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(tier history, class history) of ``runs`` with ``key`` and ``seed`` columns, over the steps every run
    reached (the lab's one rule for comparing runs, :func:`engine.figures.common_span.common_span`: a run reused
    from an interrupted job is not compared over more steps than it trained)."""

    key = {r.run_id: r.key for r in refs}
    seed = {r.run_id: r.seed for r in refs}
    span = common_span(runs)
    th, ch = span.keep(tier_history(runs)), span.keep(class_history(runs))
    for f in (th, ch):
        f["key"] = f["run_id"].map(key)
        f["seed"] = f["run_id"].map(seed)
    return th, ch


def tier_order(th: pd.DataFrame) -> list[str]:
    t = th.drop_duplicates("tier")[["tier", "epsilon", "tier_index"]]
    return list(t.sort_values(["epsilon", "tier_index"], kind="stable")["tier"])


def epoch_steps(th: pd.DataFrame, epochs: float) -> dict[str, int]:
    """Evaluation step of each whole epoch (the evaluation nearest to it) and of the end: {"epoch1": s, ..., "final": s}."""
    ev = th.drop_duplicates("step")[["step", "epoch"]].sort_values("step")
    out = {}
    for e in range(1, int(np.floor(epochs + 1e-9)) + 1):
        i = int(np.argmin(np.abs(ev["epoch"].to_numpy(float) - e)))
        out[f"epoch{e}"] = int(ev["step"].iloc[i])
    out["final"] = int(ev["step"].max())
    return out


def tier_at(th: pd.DataFrame, key: str, seed: int, step: int, tiers: list[str], col: str = "recall") -> np.ndarray:
    g = th[(th.key == key) & (th.seed == seed) & (th.step == step)].set_index("tier")
    return np.array([float(g.at[t, col]) if t in g.index else np.nan for t in tiers])


def tier_auc(th: pd.DataFrame, key: str, seed: int, tiers: list[str]) -> np.ndarray:
    out = []
    for t in tiers:
        g = th[(th.key == key) & (th.seed == seed) & (th.tier == t)].sort_values("step")
        x, y = g["step"].to_numpy(float), g["recall"].to_numpy(float)
        # the run summary's recall AUC; a curve of one point (or none) has no area here
        out.append(recall_auc(x, y) if len(x) > 1 and x[-1] > 0 else np.nan)
    return np.array(out)


def tier_gains(th: pd.DataFrame, variant: str, reference: str, seeds: list[int], points: dict[str, int]) -> dict:
    """Per tier, at each point (``epoch1`` … ``final``) and as recall AUC: the gain variant − reference in
    percentage points per seed, its mean and standard error."""
    tiers = tier_order(th)
    out = {}
    for name, step in list(points.items()) + [("auc", None)]:
        per_seed = []
        for s in seeds:
            if step is None:
                a, b = tier_auc(th, variant, s, tiers), tier_auc(th, reference, s, tiers)
            else:
                a, b = tier_at(th, variant, s, step, tiers), tier_at(th, reference, s, step, tiers)
            per_seed.append(100.0 * (a - b))
        arr = np.array(per_seed)
        stats = [mean_se(arr[:, j]) for j in range(len(tiers))]
        out[name] = {"step": step, "mean": [finite(m) for m, _, _ in stats], "se": [finite(e) for _, e, _ in stats],
                     "n": [n for _, _, n in stats], "per_seed": [[finite(v) for v in row] for row in arr]}
    return out


def tier_values(th: pd.DataFrame, key: str, seeds: list[int], col: str) -> pd.DataFrame:
    """Mean over seeds of ``col`` (recall ×100 or loss) per evaluation step and tier: index step, columns tiers."""
    g = th[th.key == key].groupby(["step", "tier"])[col].mean().unstack("tier")
    g = g[tier_order(th)]
    return g * 100.0 if col == "recall" else g


def class_values(ch: pd.DataFrame, key: str, col: str) -> pd.DataFrame:
    g = ch[ch.key == key].groupby(["step", "class_index"])[col].mean().unstack("class_index")
    return g * 100.0 if col == "recall" else g


def class_gain_pearson(ch: pd.DataFrame, variant: str, reference: str, step: int) -> dict:
    """Pearson (r, p) of the per-class recall gain (mean over seeds, pp) against the class's ε, at ``step``."""
    from scipy.stats import pearsonr

    a = ch[(ch.key == variant) & (ch.step == step)].groupby("class_index")[["recall", "epsilon"]].mean()
    b = ch[(ch.key == reference) & (ch.step == step)].groupby("class_index")["recall"].mean()
    gain = 100.0 * (a["recall"] - b.reindex(a.index))
    ok = gain.notna() & a["epsilon"].notna()
    r = p = None
    if ok.sum() >= 3 and a["epsilon"][ok].nunique() > 1 and gain[ok].nunique() > 1:
        res = pearsonr(a["epsilon"][ok].to_numpy(float), gain[ok].to_numpy(float))
        r, p = finite(res.statistic), finite(res.pvalue)
    return {"r": r, "p": p, "n_classes": int(ok.sum()),
            "gain_by_class": {int(c): finite(v) for c, v in gain.items()},
            "epsilon_by_class": {int(c): finite(v) for c, v in a["epsilon"].items()}}


def mid_table(runs: list[dict], refs: list[RunRef], tiers: list[str]) -> dict:
    """MID per algorithm key and tier (``engine.figures.frames.mid_spans``): fraction of seeds with a MID, mean onset
    and mean duration in epochs (a MID still open at the last evaluation lasts until it)."""

    spans = mid_spans(runs)
    key = {r.run_id: r.key for r in refs}
    spans["key"] = spans["run_id"].map(key)
    epoch_of = {}
    for run in runs:
        for e in run_evals(run):
            epoch_of[(run["id"], e.step)] = float(e.epoch or 0.0)
    out = {}
    for k, g in spans.groupby("key", sort=False):
        rows = []
        for t in tiers:
            gt = g[g.tier == t]
            onset, dur = [], []
            for _, r in gt.iterrows():
                if r["onset_step"] is None or pd.isna(r["onset_step"]):
                    continue
                o = epoch_of[(r["run_id"], int(r["onset_step"]))]
                end_step = r["end_step"] if r["end_step"] is not None and not pd.isna(r["end_step"]) else r["last_step"]
                onset.append(o)
                dur.append(epoch_of[(r["run_id"], int(end_step))] - o)
            m_on, se_on, n = mean_se(onset)
            m_d, se_d, _ = mean_se(dur)
            rows.append({"tier": t, "runs_with_mid": n, "runs": int(len(gt)), "onset_epoch": m_on,
                         "onset_epoch_se": se_on, "duration_epochs": m_d, "duration_epochs_se": se_d,
                         "still_open": int(sum(1 for _, r in gt.iterrows() if r["state"] == "ongoing"))})
        out[k] = rows
    return out
