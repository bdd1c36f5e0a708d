"""The lab's headline while a comparison trains: INO-SGD's paired recall gain over IDP-SGD on the most private
tier — as a frame (:func:`private_gain`, the Train page's ``private_gain`` figure in
:mod:`engine.figures.training`) and as one sentence (:func:`gain_sentence`), e.g. "INO-SGD ahead by +2.1 recall
points on the ε = 1 tier at step 117 (1 seed: no spread); IDP-SGD still in its MID", by the lab's headline rules
(:mod:`engine.figures.evidence`: a pair with a diverged run has no winner, a rerun is no second pair, one seed
says it has no spread).

Both read the one gain frame, :func:`engine.figures.frames.recall_gain_over_time` (INO − IDP per seed pair and
INO evaluation, IDP interpolated onto INO's progress), cut to the tier :func:`engine.figures.talk_frames.
most_private_tier` names. Nothing here reads the store or plots.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from engine.figures import evidence as ev
from engine.figures import frames as fr
from engine.figures import talk_frames as tf
from engine.figures.bands import mean_se
from engine.models.metrics import mid_markers
from engine.train.records import PlanRecord

# A mean gain within this many recall points of zero reads "level": below it the two algorithms' recalls of a
# tier of a few hundred test samples differ by about one sample, and a sign would flicker from one refresh to
# the next.
LEVEL_POINTS = 0.5

CURVE_COLUMNS = ["step", "progress", "gain", "se", "n", "idp_recall", "idp_loss", "ino_loss", "tier", "epsilon"]


def private_gain(runs: list[dict], gain: pd.DataFrame | None = None, memo: dict | None = None) -> pd.DataFrame:
    """The gain frame's rows of the most private tier (all its columns; empty without an INO/IDP pair or before
    the first evaluations). ``gain``: the runs' :func:`engine.figures.frames.recall_gain_over_time` when the
    caller has it."""
    gain = fr.recall_gain_over_time(runs, memo=memo) if gain is None else gain
    tier = tf.most_private_tier(runs, memo)
    if tier is None or gain.empty:
        return gain.iloc[0:0]
    return gain[gain["tier"] == tier[0]].reset_index(drop=True)


def gain_curve(gain: pd.DataFrame) -> pd.DataFrame:
    """Per INO evaluation step of a one-tier gain frame: the mean paired gain, its standard error over the pairs
    (nan for one pair), the pairs counted, IDP-SGD's mean recall and mean tier loss, INO-SGD's mean tier loss, the
    tier and its ε; in step order."""
    if gain.empty:
        return pd.DataFrame(columns=CURVE_COLUMNS)
    rows = []
    for step, g in gain.groupby("step", sort=True):
        m, se, n = mean_se(g["gain"])
        rows.append({"step": int(step), "progress": float(g["progress"].mean()), "gain": m, "se": se, "n": n, "idp_recall": float(g["idp_recall"].mean()),
                     "idp_loss": float(g["idp_loss"].mean()),
                     "ino_loss": float(g["ino_loss"].mean()) if "ino_loss" in g else float("nan"),
                     "tier": g["tier"].iloc[0], "epsilon": float(g["epsilon"].iloc[0])})
    return pd.DataFrame(rows, columns=CURVE_COLUMNS)


def mid_state(steps, loss, *, finished: bool = False) -> tuple[str | None, int | None]:
    """An algorithm's MID of a tier (IDP-SGD's or INO-SGD's) from its test loss (evaluations in step order, the
    first the initial one) by the lab's one MID rule, :func:`engine.models.metrics.mid_markers` (the MID chart's
    shading, the MID table and the run summary read the same): (state, step).

    * ``"ongoing"`` (step: the onset) — the loss rose above its initial value and is still above it;
    * ``"recovered"`` (step: the end, the first evaluation back at or below it);
    * ``"none"`` (step None) — a finished run whose loss never rose above it;
    * ``None`` (step None) — not decidable: fewer than two evaluations, a non-finite loss, or a running run whose
      loss has not risen yet (its MID may be ahead).
    """
    x = np.asarray(loss, dtype=float)
    if len(x) < 2 or not np.isfinite(x).all():
        return None, None
    m = mid_markers([[v] for v in x], list(steps))[0]
    if m["onset_step"] is None:
        return ("none", None) if finished else (None, None)
    if m["end_step"] is not None:
        return "recovered", int(m["end_step"])
    return "ongoing", int(m["onset_step"])


def _points(value: float) -> float:
    """Recall (a fraction) in points rounded to one decimal, never −0.0."""
    p = round(100.0 * value, 1)
    return 0.0 if p == 0 else p


def gain_sentence(gain: pd.DataFrame) -> str | None:
    """One sentence on a one-tier gain frame (:func:`private_gain`): who leads at the latest evaluation every
    pair has reached (the latest one when the pairs have none in common), by how many recall points (mean over
    the paired seeds, ± its s.e. when there are several), and each algorithm's MID (:func:`mid_state`, IDP-SGD's
    then INO-SGD's) where it can be decided (from the tier's loss averaged over the pairs, up to that evaluation;
    "finished" when INO-SGD's progress there is its whole run). A mean gain within ±:data:`LEVEL_POINTS` points
    (after rounding to one decimal, so never "−0.0") is "level"; one pair says it has no spread
    (:func:`engine.figures.evidence.spread_words`). A pair with a diverged run (the frame's ``diverged``) gives
    no winner: the sentence names the run (:func:`engine.figures.evidence.not_comparable_sentence`). None
    without a gain."""
    curve = gain_curve(gain).dropna(subset=["gain"])
    if curve.empty:
        return None
    diverged = [w for w in gain["diverged"].dropna().unique() if w] if "diverged" in gain else []
    if diverged:
        return ev.not_comparable_sentence(diverged, f"on the ε = {float(curve['epsilon'].iloc[-1]):g} tier")
    pairs = int(gain["ino_run_id"].nunique()) if "ino_run_id" in gain else int(curve["n"].max())
    full = curve[curve["n"] >= pairs]
    at = (full if not full.empty else curve).iloc[-1]
    points, step = _points(float(at["gain"])), int(at["step"])
    se = _points(float(at["se"])) if math.isfinite(float(at["se"])) else None
    spread = f" ± {abs(se):.1f}" if se is not None and int(at["n"]) > 1 else ""
    seeds = f" (mean of {int(at['n'])} paired seeds)" if int(at["n"]) > 1 else f" ({ev.spread_words(math.nan, 1)})"
    where = f"on the ε = {float(at['epsilon']):g} tier at step {step}"
    if abs(points) <= LEVEL_POINTS:
        text = f"INO-SGD and IDP-SGD level (within ±{LEVEL_POINTS:g} recall points) {where}{seeds}"
    else:
        leader = "INO-SGD" if points > 0 else "IDP-SGD"
        text = f"{leader} ahead by +{abs(points):.1f}{spread} recall points {where}{seeds}"
    upto = curve[curve["step"] <= step]
    finished = bool(upto["progress"].iloc[-1] >= 1.0 - 1e-9)
    for who, loss in (("IDP-SGD", "idp_loss"), ("INO-SGD", "ino_loss")):
        text += _mid_words(who, *mid_state(upto["step"], upto[loss], finished=finished))
    return text


def _mid_words(who: str, state: str | None, step: int | None) -> str:
    """One algorithm's MID in the sentence ("; IDP-SGD still in its MID"), '' when it cannot be decided."""
    if state == "ongoing":
        return f"; {who} still in its MID"
    if state == "recovered":
        return f"; {who} out of its MID since step {step}"
    if state == "none":
        return f"; {who} had no MID"
    return ""


# A tier whose samples are drawn less than this many times each, on average, over the steps a run trains (q_k · T)
# barely trains: most of its data is never seen, and its recall (and any gain on it) stays near where it started.
UNDERSAMPLED_DRAWS = 1.0


def undersampled_note(runs: list[dict]) -> str | None:
    """The sentence that says a compared run's tier barely trained because its sampling rate is tiny (IDP-SGD
    SAMPLE's most private tier on short runs: q = 0.0009 over 234 steps draws each of its samples 0.2 times), so
    that a gain of 0.0 pp there is not read as "no difference between the algorithms". One sentence per tier name
    (the run that draws it least), most private first; None when every tier of every run is drawn at least
    :data:`UNDERSAMPLED_DRAWS` times per sample."""
    worst: dict[str, tuple[float, float, float, int, str]] = {}
    for run in runs:
        plan = PlanRecord.of(run.get("plan"))
        rates, steps = plan.sample_rates, plan.trained_steps or plan.steps
        if not rates or not steps or len(set(rates)) < 2:  # one rate for all: the run's length, not the tiers
            continue
        for name, q, eps in zip(plan.tier_names, rates, plan.target_epsilons or [math.nan] * len(rates)):
            draws = q * steps
            if draws < UNDERSAMPLED_DRAWS and (name not in worst or draws < worst[name][1]):
                others = [r * steps for r in rates if r != q]
                worst[name] = (eps, draws, q, steps, f"{min(others):.1f}–{max(others):.1f}")
    if not worst:
        return None
    out = []
    for name, (eps, draws, q, steps, others) in sorted(worst.items(), key=lambda kv: kv[1][0]):
        out.append(f"The {name} tier barely trains: sampled at q = {q:.2g}, each of its samples is drawn {draws:.1g} "
                   f"times on average over {steps} steps (the other tiers' {others}), so its recall stays near its "
                   "start and a gain there of about 0 pp says nothing; train more epochs to see it move.")
    return " ".join(out)
