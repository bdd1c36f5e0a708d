"""What a comparison of runs may claim: the lab's rules for its headlines, stated once. The frames
(:mod:`engine.figures.frames`, :mod:`engine.figures.talk_frames`) apply them and the headlines (the live sentence
:func:`engine.figures.headline.gain_sentence`, the Results headline :func:`engine.figures.talk_frames.gain_summary`,
the talk table) say them; pages only display what these say.

* **A diverged run wins nothing.** A run has diverged when it ended *diverged* (its summary's step), or, while it
  trains or after it stopped otherwise, when its evaluations so far meet the lab's one divergence rule
  (:func:`engine.models.metrics.diverged_step`, the MID chart's badge). A comparison with a diverged run gives no
  winner: its words name the run and say the pair is not comparable (:func:`not_comparable_sentence`).
* **A rerun is not new evidence.** Runs with the same :func:`engine.jobs.runs.config_hash` (kind, algorithm and
  stored config, the seed included) train the same model on the same batches and noise: bit-identical curves. The
  lowest id (of those that did not stop short) is kept, the others are its reruns (:func:`reruns`): figures may draw
  them, marked "rerun of #12" (:func:`rerun_mark`), and every count, mean ± s.e. over seeds and gain pair counts
  the kept run once (:func:`distinct`).
* **No peak of a noisy curve.** A gain is a recall AUC gain or a gain averaged over evaluations, with its
  uncertainty across seeds; one seed says so (:func:`spread_words`). The largest value along one curve is not a
  headline: between evaluations a single seed's gain swings by tens of points.

Words are raw text (run labels as the user wrote them): pages escape them.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from engine.jobs.runs import config_hash, run_label
from engine.models.metrics import diverged_step

# --- divergence -----------------------------------------------------------------------------------------------


UNKNOWN_STEP = -1  # diverged, at a step nobody recorded (a store row older than its summary's step)


def diverged_at(run: dict, history: pd.DataFrame | None = None) -> int | None:
    """The step from which ``run`` has diverged, or None: its stored step when it ended *diverged*, else the
    lab's one rule on ``history`` (its rows of :func:`engine.figures.frames.tier_history`: ``step``, ``tier``,
    ``raw_loss``), the first step any tier's loss diverged from; :data:`UNKNOWN_STEP` for a run that ended
    diverged with its step neither recorded nor in ``history``."""
    stored = (run.get("summary") or {}).get("diverged_step") if run.get("status") == "diverged" else None
    if stored is not None:
        return int(stored)
    steps = []
    if history is not None and not history.empty:
        for _, g in history.sort_values("step", kind="stable").groupby("tier", sort=False):
            s = diverged_step(g["step"].to_numpy(), g["raw_loss"].to_numpy(float))
            if s is not None:
                steps.append(int(s))
    if steps:
        return min(steps)
    return UNKNOWN_STEP if run.get("status") == "diverged" else None


def diverged_words(runs_steps: list[tuple[dict, int | None]]) -> str:
    """'' when none of the runs diverged; else "INO-SGD #2 diverged at step 13, IDP-SGD (SAMPLE) #1 diverged at
    step 13" (``runs_steps``: (run, :func:`diverged_at`) in the order to name them)."""
    return ", ".join(f"{run_label(r)} diverged" + (f" at step {s}" if s != UNKNOWN_STEP else "")
                     for r, s in runs_steps if s is not None)


def not_comparable_sentence(words: list[str], where: str) -> str:
    """The headline of a comparison with a diverged run (``words``: each pair's :func:`diverged_words`;
    ``where``: "on the ε = 1 tier"): no winner, which runs diverged, and why."""
    named = ", ".join(dict.fromkeys(w for w in words if w))
    return f"No winner {where}: {named}; a pair with a diverged run is not comparable"


# --- reruns ---------------------------------------------------------------------------------------------------

# a run that stopped short gives way to an identical run that did not (the kept run is the whole evidence)
_STOPPED_SHORT = ("cancelled", "failed", "interrupted")


def reruns(runs: list[dict]) -> dict[int, int]:
    """Run id → the id of the run it is a rerun of (same :func:`engine.jobs.runs.config_hash`): of each set of
    identical runs the lowest id is kept (and absent here), one that did not stop short (cancelled, failed,
    interrupted) preferred; stable while they train, so a live legend does not swap its marks."""
    same: dict[str, list[dict]] = {}
    for run in runs:
        same.setdefault(config_hash(run), []).append(run)
    out = {}
    for group in same.values():
        if len(group) < 2:
            continue
        kept = min(group, key=lambda r: (r.get("status") in _STOPPED_SHORT, r["id"]))
        out.update({r["id"]: kept["id"] for r in group if r["id"] != kept["id"]})
    return out


def distinct(runs: list[dict], rerun_of: dict[int, int] | None = None) -> list[dict]:
    """``runs`` without the reruns (:func:`reruns`): each piece of evidence once, in the given order."""
    rerun_of = reruns(runs) if rerun_of is None else rerun_of
    return [r for r in runs if r["id"] not in rerun_of]


def rerun_mark(kept_ids) -> str:
    """" (rerun of #12)" (of the kept runs' ids, :func:`reruns`; "#1–3" for a k-seed job's rows), appended to a
    rerun's label in legends and tables; '' for none."""
    ids = sorted(set(int(i) for i in kept_ids))
    if not ids:
        return ""
    if len(ids) > 1 and ids == list(range(ids[0], ids[-1] + 1)):
        return f" (rerun of #{ids[0]}–{ids[-1]})"
    return " (rerun of " + ", ".join(f"#{i}" for i in ids) + ")"


def rerun_note(runs: list[dict]) -> str | None:
    """One sentence naming the selection's reruns and that each is counted once; None without reruns."""
    rerun_of = reruns(runs)
    if not rerun_of:
        return None
    by_id = {r["id"]: r for r in runs}
    named = ", ".join(f"{run_label(by_id[i])} is a rerun of #{k}" for i, k in sorted(rerun_of.items()))
    return (f"{named} (same config and seed: the same curves); each is counted once in the seed counts, the means "
            "and the gains.")


# --- a gain's uncertainty ---------------------------------------------------------------------------------------

def spread_words(se: float, n: int, *, unit: str = "pp", what: str = "paired seeds") -> str:
    """A mean's uncertainty across seeds in words: "± 0.6 pp (s.e. over 3 paired seeds)"; one seed (or no finite
    s.e.): "1 seed: no spread"."""
    if n < 2 or se is None or not math.isfinite(se):
        return "1 seed: no spread" if n <= 1 else f"{n} {what}: no spread"
    return f"± {abs(se):.1f} {unit} (s.e. over {n} {what})"


def window_mean(steps, values, start, end) -> float:
    """The mean of ``values`` over the evaluations at steps in [start, end) (``end`` None: to the last): a gain
    averaged over a stretch of training, not one evaluation's (nan when the stretch holds none)."""
    s = np.asarray(steps, dtype=float)
    v = np.asarray(values, dtype=float)
    inside = (s >= start) & ((s < end) if end is not None else True) & np.isfinite(v)
    return float(v[inside].mean()) if inside.any() else float("nan")
