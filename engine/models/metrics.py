"""Per-group utility metrics, MID markers and outcome-fairness metrics.

``evaluate`` returns one JSON-able dict per evaluation; the run store keeps the list and the
UI/plots read it. Definitions:

* tier/class **loss**: mean cross-entropy over the group's test samples;
* class **recall**: fraction of the class's samples predicted as that class;
  class **accuracy**: one-vs-rest accuracy of "is this class";
* tier **recall**: macro average of the per-class recalls inside the tier's samples;
  tier **accuracy**: fraction of the tier's samples predicted correctly;
* **MID** (minority initial drop) per tier: onset = first evaluation whose tier test loss
  exceeds the initial one; end = first later evaluation back at or below it;
* **recall AUC** per tier: area under its recall-vs-progress curve, normalised to [0, 1]
  (:func:`recall_auc`; the run summary and the figures' recall-AUC table).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F


@torch.no_grad()
def predict(model, x: torch.Tensor, *, batch: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample log-probabilities (n, K) as numpy."""
    model.eval()
    out = [F.log_softmax(model(x[i:i + batch]), dim=1) for i in range(0, len(x), batch)]
    model.train()
    return torch.cat(out).cpu().numpy()


def _macro_recall(y, pred, classes) -> float:
    recalls = [np.mean(pred[y == c] == c) for c in classes if np.any(y == c)]
    return float(np.mean(recalls)) if recalls else float("nan")


def group_metrics(y: np.ndarray, logp: np.ndarray, groups: np.ndarray | None, n_groups: int, num_classes: int):
    pred = logp.argmax(1)
    loss = -logp[np.arange(len(y)), y]
    classes = []
    for c in range(num_classes):
        m = y == c
        classes.append({
            "loss": float(loss[m].mean()) if m.any() else float("nan"),
            "recall": float(np.mean(pred[m] == c)) if m.any() else float("nan"),
            "accuracy": float(np.mean((pred == c) == m)),
        })
    tiers = []
    if groups is not None:
        for k in range(n_groups):
            m = groups == k
            tiers.append({
                "loss": float(loss[m].mean()) if m.any() else float("nan"),
                "recall": _macro_recall(y[m], pred[m], range(num_classes)) if m.any() else float("nan"),
                "accuracy": float(np.mean(pred[m] == y[m])) if m.any() else float("nan"),
                "n": int(m.sum()),
            })
    overall = {
        "loss": float(loss.mean()),
        "accuracy": float(np.mean(pred == y)),
        "balanced_accuracy": _macro_recall(y, pred, range(num_classes)),
    }
    return overall, tiers, classes, pred


def fairness_metrics(y_true, y_pred, sensitive) -> dict:
    """Demographic parity and equalized odds differences of binary (0/1) labels and predictions, as Fairlearn's
    ``demographic_parity_difference`` and ``equalized_odds_difference`` define them (between groups; equalized
    odds: the larger of the TPR and the FPR gap; a group without positives has TPR 0, one without negatives FPR 0,
    as Fairlearn's row-normalised confusion matrices give): the same numbers (tests/test_tiers_metrics.py checks
    them against Fairlearn), from one count per group instead of Fairlearn's data frames, ~0.4 s per evaluation of
    Adult's test set."""
    y, p = np.asarray(y_true).ravel() == 1, np.asarray(y_pred).ravel() == 1
    _, g = np.unique(np.asarray(sensitive).ravel(), return_inverse=True)
    k = int(g.max()) + 1 if g.size else 0

    def count(mask):
        return np.bincount(g[mask], minlength=k).astype(float)

    n, pos = count(np.ones_like(y)), count(y)
    neg = n - pos
    with np.errstate(divide="ignore", invalid="ignore"):
        selection = count(p) / n
        tpr = np.nan_to_num(count(y & p) / pos)
        fpr = np.nan_to_num(count(~y & p) / neg)

    def gap(rates):
        return float(rates.max() - rates.min())

    return {"demographic_parity_difference": gap(selection),
            "equalized_odds_difference": max(gap(tpr), gap(fpr))}


def mid_markers(tier_losses: list[list[float]], steps: list[int]) -> list[dict]:
    """MID onset/end per tier from the evaluation history: the lab's one MID rule (the run summary, the MID chart's
    shading and table, and the Train page's sentence all read it).

    The rule: a tier is in its MID (minority initial drop) from the first evaluation whose test loss is above the
    tier's initial loss (onset) to the first later one back at or below it (end). The loss, not the recall: an
    untrained model's recall of a tier is whatever its first guesses happen to hit (all of a class or none),
    while its loss starts where every tier's does (about ln K), so "above the start" means the same on every tier.

    ``tier_losses[e][k]`` is tier k's test loss at evaluation e (e = 0 is the initial one).
    Returns per tier {"onset_step", "end_step", "peak_step", "peak_increase"}; None where absent.
    """
    if not tier_losses:
        return []
    losses = np.asarray(tier_losses, dtype=float)
    out = []
    for k in range(losses.shape[1]):
        initial = losses[0, k]
        onset = end = peak = None
        peak_inc = 0.0
        for e in range(1, len(losses)):
            if onset is None:
                if losses[e, k] > initial:
                    onset = e
            elif end is None and losses[e, k] <= initial:
                end = e
            if onset is not None and end is None and losses[e, k] - initial > peak_inc:
                peak_inc, peak = float(losses[e, k] - initial), e
        out.append({
            "onset_step": steps[onset] if onset is not None else None,
            "end_step": steps[end] if end is not None else None,
            "peak_step": steps[peak] if peak is not None else None,
            "peak_increase": peak_inc,
        })
    return out


def recall_auc(steps, recalls) -> float:
    """Area under a recall-vs-progress curve, normalised to [0, 1]: the trapezoid rule over progress =
    step / T, T the last step (``steps`` ascending, e.g. a run's evaluation steps 0 … T).

    Degenerate curves, explicitly: no point → nan; one point, or a last step ≤ 0 (only the initial
    evaluation so far) → the last recall (nothing to integrate; the curve is that value). NaN recalls
    (a tier without samples in the split) make the area nan. Sequences, arrays and pandas Series are read
    by position."""
    x, y = np.asarray(steps, dtype=np.float64), np.asarray(recalls, dtype=np.float64)
    if len(y) == 0:
        return float("nan")
    if len(x) < 2 or x[-1] <= 0:
        return float(y[-1])
    return float(np.trapezoid(y, x / x[-1]))


# --- divergence -------------------------------------------------------------------------------------

DIVERGENCE_FACTOR = 10.0  # a loss that stays above 10× its initial value (or is non-finite) is a diverged run


def diverged_step(steps, losses, factor: float = DIVERGENCE_FACTOR):
    """The step from which a loss curve (evaluations in step order, the first the initial one) has diverged, or
    None: the lab's one divergence rule, read by the run's status (:func:`diverged_at`) and by the MID chart.

    * a non-finite loss (nan, ±inf) diverges the curve at once (a model with non-finite weights stays so);
    * a loss above ``factor`` × the initial one diverges it only if the losses stay above it (or non-finite) up to
      the last evaluation so far (a spike the optimizer recovers from is training, not divergence): the step is
      the first of that final stretch — or the first non-finite loss, when that comes earlier;
    * a curve without a finite initial loss (a tier without test samples: its loss is nan throughout) has nothing
      to diverge from: None."""
    losses = np.asarray(losses, dtype=float)
    steps = list(steps)
    if not len(losses) or not math.isfinite(losses[0]):
        return None
    finite = np.isfinite(losses)
    initial = losses[0]
    with np.errstate(invalid="ignore"):
        flagged = ~finite | (losses > factor * max(initial, 1e-12))
    hits = []
    if not finite.all():
        hits.append(int(np.argmax(~finite)))
    if flagged[-1]:
        hits.append(0 if flagged.all() else len(flagged) - int(np.argmin(flagged[::-1])))
    return steps[min(hits)] if hits else None


def diverged_at(steps, tier_losses, factor: float = DIVERGENCE_FACTOR):
    """The first step from which any tier's loss curve has diverged (:func:`diverged_step`; ``tier_losses``:
    one row per evaluation, one column per tier), or None."""
    if not len(tier_losses):
        return None
    rows = np.asarray(tier_losses, dtype=float).reshape(len(tier_losses), -1)
    hits = [s for k in range(rows.shape[1]) if (s := diverged_step(steps, rows[:, k], factor)) is not None]
    return min(hits) if hits else None
