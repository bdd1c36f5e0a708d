"""The lab's headline while a comparison trains: INO-SGD's paired recall gain over IDP-SGD on the most private
tier — as a frame (:func:`private_gain`, the Train page's ``private_gain`` figure in
:mod:`engine.figures.training`) and as one sentence (:func:`gain_sentence`), e.g. "INO-SGD ahead by +2.1 recall
points on the ε = 1 tier at step 117; IDP-SGD still in its MID".

Both read the one gain frame, :func:`engine.figures.frames.recall_gain_over_time` (INO − IDP per seed pair and
INO evaluation, IDP interpolated onto INO's progress), cut to the tier :func:`engine.figures.talk_frames.
most_private_tier` names. Nothing here reads the store or plots.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from engine.figures import frames as fr
from engine.figures import talk_frames as tf
from engine.figures.bands import mean_se
from engine.models.metrics import mid_markers

# A mean gain within this many recall points of zero reads "level": below it the two algorithms' recalls of a
# tier of a few hundred test samples differ by about one sample, and a sign would flicker from one refresh to
# the next.
LEVEL_POINTS = 0.5

CURVE_COLUMNS = ["step", "progress", "gain", "se", "n", "idp_recall", "idp_loss", "tier", "epsilon"]


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
    (nan for one pair), the pairs counted, IDP-SGD's mean recall and mean tier loss, the tier and its ε; in step
    order."""
    if gain.empty:
        return pd.DataFrame(columns=CURVE_COLUMNS)
    rows = []
    for step, g in gain.groupby("step", sort=True):
        m, se, n = mean_se(g["gain"])
        rows.append({"step": int(step), "progress": float(g["progress"].mean()), "gain": m, "se": se, "n": n, "idp_recall": float(g["idp_recall"].mean()),
                     "idp_loss": float(g["idp_loss"].mean()),
                     "tier": g["tier"].iloc[0], "epsilon": float(g["epsilon"].iloc[0])})
    return pd.DataFrame(rows, columns=CURVE_COLUMNS)


def idp_mid(steps, loss, *, finished: bool = False) -> tuple[str | None, int | None]:
    """IDP-SGD's MID of a tier from its test loss (evaluations in step order, the first the initial one) by the
    lab's one MID rule, :func:`engine.models.metrics.mid_markers` (the MID chart's shading, the MID table and the
    run summary read the same): (state, step).

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
    the paired seeds, ± its s.e. when there are several), and IDP-SGD's MID (:func:`idp_mid`) when it can be
    decided (from IDP-SGD's tier loss averaged over the pairs, up to that evaluation; "finished" when INO-SGD's
    progress there is its whole run). A mean gain within ±:data:`LEVEL_POINTS` points (after rounding to one
    decimal, so never "−0.0") is "level". None without a gain."""
    curve = gain_curve(gain).dropna(subset=["gain"])
    if curve.empty:
        return None
    pairs = int(gain["ino_run_id"].nunique()) if "ino_run_id" in gain else int(curve["n"].max())
    full = curve[curve["n"] >= pairs]
    at = (full if not full.empty else curve).iloc[-1]
    points, step = _points(float(at["gain"])), int(at["step"])
    se = _points(float(at["se"])) if math.isfinite(float(at["se"])) else None
    spread = f" ± {abs(se):.1f}" if se is not None and int(at["n"]) > 1 else ""
    seeds = f" (mean of {int(at['n'])} paired seeds)" if int(at["n"]) > 1 else ""
    where = f"on the ε = {float(at['epsilon']):g} tier at step {step}"
    if abs(points) <= LEVEL_POINTS:
        text = f"INO-SGD and IDP-SGD level (within ±{LEVEL_POINTS:g} recall points) {where}{seeds}"
    else:
        leader = "INO-SGD" if points > 0 else "IDP-SGD"
        text = f"{leader} ahead by +{abs(points):.1f}{spread} recall points {where}{seeds}"
    upto = curve[curve["step"] <= step]
    finished = bool(upto["progress"].iloc[-1] >= 1.0 - 1e-9)
    state, mid_step = idp_mid(upto["step"], upto["idp_loss"], finished=finished)
    if state == "ongoing":
        text += "; IDP-SGD still in its MID"
    elif state == "recovered":
        text += f"; IDP-SGD out of its MID since step {mid_step}"
    elif state == "none":
        text += "; IDP-SGD had no MID"
    return text
