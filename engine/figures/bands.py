"""Seeds as bands, smoothing, divergence and the x axis of the curves over training: what the curve figures
(:mod:`engine.figures.curves`) do to a tidy frame before they plot it.

* **Units.** A figure draws one curve per *unit*: a run, or — with ``bands=True`` and a series of more than
  one seed (the frames' ``series`` column, :func:`engine.figures.frames.series_labels`) — the series, as the
  mean over its seeds with a band of ± 1 standard error (:func:`seed_mean`).
* **Gain beyond the seed spread.** :func:`recall_gain_spread` and :func:`gain_spread_words` over
  :func:`engine.figures.frames.recall_gain_over_time` (seed pairs matched by ``seed_index``).
* **Smoothing.** :func:`ema`, an exponential moving average with weight ``smoothing`` in [0, 0.99).
* **Divergence.** :func:`diverged_units`, by the lab's one rule (:func:`engine.models.metrics.diverged_step`, also
  what ends a run as *diverged*): a loss that is non-finite, or that stays above :data:`DIVERGENCE_FACTOR` × its
  initial value, marks the run diverged from that evaluation on.
* **x axis.** :func:`with_x`: step, epoch, wall time (elapsed s) or ε spent.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from engine.figures.evidence import spread_words
from engine.models.metrics import DIVERGENCE_FACTOR, diverged_step

X_AXES = ("step", "epoch", "elapsed", "epsilon")
MID_LAYOUTS = ("facet", "overlay")


def check_options(*, mid_layout: str = "facet", x_axis: str = "step", smoothing: float = 0.0) -> None:
    """One clear ValueError for a figure option out of range."""
    if mid_layout not in MID_LAYOUTS:
        raise ValueError(f"unknown MID layout {mid_layout!r}; allowed: {', '.join(MID_LAYOUTS)}")
    if x_axis not in X_AXES:
        raise ValueError(f"unknown x axis {x_axis!r}; allowed: {', '.join(X_AXES)}")
    if not (isinstance(smoothing, (int, float)) and 0.0 <= float(smoothing) < 0.99):
        raise ValueError(f"smoothing must be an EMA weight in [0, 0.99), got {smoothing!r}")


# --- units and seed means ---------------------------------------------------------------------------

def with_units(df: pd.DataFrame, bands: bool, *, run_col: str = "run", id_col: str = "run_id") -> pd.DataFrame:
    """``df`` with a ``unit`` column: the series where ``bands`` and the series has more than one run,
    else the run."""
    if df.empty:
        return df.assign(unit=pd.Series(dtype=object))
    if bands:
        sizes = df.groupby("series", sort=False)[id_col].nunique()
        multi = sizes[sizes > 1].index
        if len(multi):
            return df.assign(unit=df[run_col].where(~df["series"].isin(multi), df["series"]))
    return df.assign(unit=df[run_col])


def seed_mean(df: pd.DataFrame, keys: list[str], value: str, *, extra: tuple[str, ...] = ()) -> pd.DataFrame:
    """Mean of ``value`` over the rows sharing ``keys`` (the seeds of a series at one evaluation) with its
    standard error (sample sd / √n; 0 for one seed) and n; ``extra`` columns are averaged too (x values).
    Without replicates (no two rows share ``keys``) the rows themselves come back, with se 0 and n 1."""
    if not df.duplicated(keys).any():  # one seed per key (no series): the values themselves
        return df.assign(se=0.0, n=np.isfinite(df[value].to_numpy(float)).astype(int))
    grouped = df.groupby(keys, sort=False, dropna=False)
    out = grouped[[value, *extra]].mean()
    v = grouped[value]
    count = v.count()
    out["se"] = (v.std(ddof=1) / np.sqrt(count.clip(lower=1))).fillna(0.0)
    out["n"] = count
    return out.reset_index()


def mean_se(values) -> tuple[float, float, int]:
    """(mean, standard error of the mean, n) of the finite values among ``values`` — :func:`seed_mean`'s rule
    for one group of seeds; mean nan for none, s.e. nan for fewer than two."""
    v = np.asarray([float(x) for x in values if x is not None], dtype=float)
    v = v[np.isfinite(v)]
    if len(v) < 2:
        return (float(v[0]) if len(v) else float("nan")), float("nan"), int(len(v))
    out = seed_mean(pd.DataFrame({"k": 0, "v": v}), ["k"], "v")
    return float(out["v"].iloc[0]), float(out["se"].iloc[0]), int(len(v))


GAIN_SPREAD_COLUMNS = ["series", "tier", "tier_index", "epsilon", "step", "progress", "mean_gain", "se", "n", "p",
                       "beyond_spread", "avg_gain", "avg_se", "diverged"]


def recall_gain_spread(gain: pd.DataFrame) -> pd.DataFrame:
    """Is the gain beyond the seed spread? Per pair series, tier and evaluation (from
    :func:`engine.figures.frames.recall_gain_over_time`): the mean paired gain over seeds, its standard error,
    n, the paired t-test's two-sided p, and ``beyond_spread`` = n ≥ 2 and mean − 2·SE > 0. Per pair series and
    tier (on each of its rows): ``avg_gain`` ± ``avg_se``, each pair's gain averaged over its evaluations, then the
    mean ± s.e. over the pairs (nan s.e. for one), and ``diverged``, the words of its pairs' diverged runs ('')."""
    if gain.empty:
        return pd.DataFrame(columns=GAIN_SPREAD_COLUMNS)
    from scipy.stats import ttest_1samp

    out = seed_mean(gain, ["series", "tier", "tier_index", "epsilon", "step"], "gain", extra=("progress",))
    out = out.rename(columns={"gain": "mean_gain"})
    keys = ["series", "tier", "tier_index", "epsilon", "step"]
    values = gain["gain"].to_numpy(float)
    p = {}
    for key, pos in gain.groupby(keys, sort=False, dropna=False).indices.items():
        x = values[pos]
        x = x[np.isfinite(x)]
        p[key] = float(ttest_1samp(x, 0.0).pvalue) if len(x) >= 2 and np.ptp(x) > 0 else float("nan")
    out["p"] = [p.get(k, float("nan")) for k in out[keys].itertuples(index=False, name=None)]
    out["beyond_spread"] = (out["n"] >= 2) & (out["mean_gain"] - 2 * out["se"] > 0)
    pair = "ino_run_id" if "ino_run_id" in gain else "seed_index"
    per_series = {}
    for key, g in gain.groupby(["series", "tier"], sort=False, dropna=False):
        avg, se, _ = mean_se(g.groupby(pair, sort=False)["gain"].mean())
        words = g["diverged"].dropna().unique() if "diverged" in g else ()
        per_series[key] = (avg, se, ", ".join(dict.fromkeys(w for w in words if w)))
    stats = [per_series.get(k, (math.nan, math.nan, "")) for k in out[["series", "tier"]].itertuples(index=False,
                                                                                                       name=None)]
    out["avg_gain"], out["avg_se"], out["diverged"] = [list(c) for c in zip(*stats)] if stats else ([], [], [])
    return out[GAIN_SPREAD_COLUMNS]


def gain_spread_words(spread: pd.DataFrame) -> list[str]:
    """The gain summary in words (raw text), one line per pair series and tier, the most private tier first, by the
    lab's headline rules (:mod:`engine.figures.evidence`): a series with a diverged run has no winner; otherwise
    the gain averaged over training (each pair's over its evaluations, ± s.e. over the pairs; "1 seed: no
    spread"), never the largest value along the curve (between evaluations one seed's gain swings by tens of
    points), and at how many evaluations the mean is beyond the seed spread."""
    lines = []
    if spread.empty:
        return lines
    for (series, tier), g in spread.sort_values(["tier_index", "step"]).groupby(["series", "tier"], sort=False):
        n = int(g["n"].max())
        head = f"{tier} ({series})"
        diverged = str(g["diverged"].iloc[0] or "") if "diverged" in g else ""
        if diverged:
            lines.append(f"{head}: no winner: {diverged}; a pair with a diverged run is not comparable.")
            continue
        avg = f"gain {100 * float(g['avg_gain'].iloc[0]):+.1f}"
        if n < 2:
            lines.append(f"{head}: {avg} points averaged over its {len(g)} evaluations; "
                         f"{spread_words(math.nan, 1)}, so no one evaluation's gain can be told from noise (repeat "
                         "over k seeds).")
            continue
        k = int(g["beyond_spread"].sum())
        verdict = (f"beyond the seed spread (mean − 2·SE > 0) at {k} of {len(g)} evaluations" if k
                   else "not beyond the seed spread (mean − 2·SE ≤ 0) at any evaluation")
        lines.append(f"{head}: {avg} points averaged over training, "
                     f"{spread_words(100 * float(g['avg_se'].iloc[0]), n, unit='points')}; {verdict}.")
    return lines


# --- smoothing and divergence ------------------------------------------------------------------------

def ema(y, weight: float) -> np.ndarray:
    """Exponential moving average s_t = w·s_{t−1} + (1 − w)·y_t (s_0 = y_0); nan points stay gaps and
    do not reset the average. ``weight`` 0 returns the values unchanged."""
    y = np.asarray(y, dtype=float)
    if weight <= 0:
        return y.copy()
    out = np.full_like(y, np.nan)
    s = math.nan
    for i, v in enumerate(y):
        if math.isfinite(v):
            s = v if not math.isfinite(s) else weight * s + (1.0 - weight) * v
            out[i] = s
    return out


def diverged_units(df: pd.DataFrame, value: str = "raw_loss", factor: float = DIVERGENCE_FACTOR) -> dict:
    """unit → the first step at which any of its runs' tier curves diverged (the lab's one rule,
    :func:`engine.models.metrics.diverged_step`; units that never did are absent)."""
    if df.empty:
        return {}
    out: dict = {}
    for (unit, _, _), g in df.sort_values("step", kind="stable").groupby(["unit", "run_id", "tier"], sort=False):
        step = diverged_step(g["step"].to_numpy(), g[value].to_numpy(float), factor)
        if step is not None:
            out[unit] = step if unit not in out else min(out[unit], step)
    return out


# --- the x axis ------------------------------------------------------------------------------------

def x_title(x_axis: str, *, per_tier: bool) -> str:
    if x_axis == "epsilon":
        return "ε spent (each tier's own)" if per_tier else "ε spent of the most private tier"
    return {"step": "step", "epoch": "epoch", "elapsed": "wall time (s)"}[x_axis]


def with_x(df: pd.DataFrame, x_axis: str, *, per_tier: bool) -> tuple[pd.DataFrame, list[str]]:
    """``df`` with an ``x`` column for the chosen axis, and the units (labels) without it: runs that record
    no ε spent (no formal DP guarantee) when ``x_axis="epsilon"``, runs without epochs or times otherwise."""
    col = {"step": "step", "epoch": "epoch", "elapsed": "elapsed",
           "epsilon": "epsilon_spent" if per_tier else "private_epsilon_spent"}[x_axis]
    x = df[col].to_numpy(float)
    finite = np.isfinite(x)
    out = df[finite].assign(x=x[finite])
    kept = set(out["unit"])
    missing = [u for u in df["unit"].unique() if u not in kept]
    return out, missing
