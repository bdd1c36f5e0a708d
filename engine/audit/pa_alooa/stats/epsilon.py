"""Empirical ε lower bounds from a threshold attack: Clopper-Pearson bounds on its error rates, overall and per
group (thresholds chosen on half of the model pairs, counted on the other half)."""

from __future__ import annotations


import numpy as np
from scipy.special import _ufuncs as _boost  # scipy.stats.beta.ppf's own kernel (Boost): importing scipy.stats
# costs ~0.5 s a process; tests/test_audit_stats.py checks the same numbers

from engine.audit.pa_alooa.stats.inputs import _as_pair, _group_index, _pairs_of, _split_models
from engine.audit.pa_alooa.stats.thresholds import _BLOCK_ELEMS


# --------------------------------------------------------------------------- #
# 8. empirical epsilon lower bound
# --------------------------------------------------------------------------- #
def _cp_upper(k, n, alpha):
    """One-sided Clopper-Pearson upper bound at level 1 - alpha (vectorised)."""
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        ub = _boost._beta_ppf(1.0 - alpha, k + 1.0, np.maximum(n - k, 1e-300))  # beta.ppf (a, b > 0, 0 < q < 1)
    return np.where(k >= n, 1.0, ub)


def _eps_from_rates(fpr_hi, fnr_hi, delta):
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.log(1.0 - delta - fpr_hi) - np.log(fnr_hi)
        b = np.log(1.0 - delta - fnr_hi) - np.log(fpr_hi)
    a = np.where(np.isnan(a), -np.inf, a)
    b = np.where(np.isnan(b), -np.inf, b)
    return np.maximum(np.maximum(a, b), 0.0)


def epsilon_lower_bound(tp, fn, fp, tn, *, delta: float, confidence: float = 0.95) -> float:
    """Empirical ε lower bound from attack counts (Jagielski et al. 2020;
    Nasr et al. 2021).

    Any (ε, δ)-DP mechanism forces every test to satisfy
    ``FPR + e^ε FNR >= 1 - δ`` and ``FNR + e^ε FPR >= 1 - δ``, hence
    ``ε >= max(ln((1-δ-FPR)/FNR), ln((1-δ-FNR)/FPR))``.  FPR and FNR are replaced
    by one-sided Clopper-Pearson *upper* bounds, each at level
    ``1 - (1 - confidence)/2`` (Bonferroni split), so the returned bound holds
    with probability >= ``confidence``.  Clamped at 0.
    """
    tp, fn, fp, tn = (int(x) for x in (tp, fn, fp, tn))
    if min(tp, fn, fp, tn) < 0 or tp + fn == 0 or fp + tn == 0:
        raise ValueError("need non-negative counts with at least one member and one non-member trial")
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    alpha = (1.0 - confidence) / 2.0
    fpr_hi = _cp_upper(fp, fp + tn, alpha)
    fnr_hi = _cp_upper(fn, tp + fn, alpha)
    return float(_eps_from_rates(fpr_hi, fnr_hi, delta))


def per_group_epsilon_lower_bound(
    scores, membership, groups, *, delta: float, confidence: float = 0.95,
    seed=0, max_thresholds: int = 512, pairs: int | None = None,
) -> dict:
    """Per-group empirical ε lower bound from the threshold attack.

    For each group all (model, sample) pairs of its samples are pooled.  The
    models are split in two halves (the design's ``pairs`` whole, as for ``held_out``); the
    threshold is chosen on the first half (maximising the Clopper-Pearson ε
    bound over up to ``max_thresholds`` candidate thresholds) and the attack is
    *counted on the second half only*, so the selection does not invalidate the
    bound.  Returns ``{g: {"tp", "fn", "fp", "tn", "threshold", "tpr", "fpr",
    "epsilon_lb"}}``.  (Pairs sharing a sample are not independent trials — the
    usual caveat of auditing with many samples per model.)
    """
    s, m = _as_pair(scores, membership)
    values, idx = _group_index(groups, s.shape[1])
    rng = np.random.default_rng(seed)
    ia, ib = _split_models(m, rng, _pairs_of(m, pairs))
    alpha = (1.0 - confidence) / 2.0
    out = {}
    step = max(1, _BLOCK_ELEMS // max(s.shape[1], 1))
    for v, ix in zip(values, idx):
        full = ix.size == s.shape[1]

        def rows(models):  # (scores, membership) of the group's samples, a few models at a time
            for r in range(0, models.size, step):
                sel = models[r:r + step]
                yield (s[sel], m[sel]) if full else (s[np.ix_(sel, ix)], m[np.ix_(sel, ix)])

        P_a = int(np.count_nonzero(m[ia] if full else m[np.ix_(ia, ix)]))
        both = np.empty(ia.size * ix.size)  # half A's member scores, then its non-member scores
        pp, pn = 0, P_a
        for sr, mr in rows(ia):
            k = int(np.count_nonzero(mr))
            np.compress(mr.ravel(), sr.ravel(), out=both[pp:pp + k])
            np.compress(~mr.ravel(), sr.ravel(), out=both[pn:pn + mr.size - k])
            pp, pn = pp + k, pn + mr.size - k
        pos_a, neg_a = both[:P_a], both[P_a:]
        pos_a.sort()
        neg_a.sort()
        merged = np.sort(both, kind="stable")  # the sorted scores of half A: a merge of two sorted runs
        new_value = merged[1:] != merged[:-1]
        n_uniq = int(np.count_nonzero(new_value)) + 1 if merged.size else 0
        if n_uniq > max_thresholds:  # np.unique(sa) at evenly spaced ranks
            pick = np.linspace(0, n_uniq - 1, max_thresholds).round().astype(int)
            if n_uniq < merged.size:
                pick = np.flatnonzero(np.r_[True, new_value])[pick]
            cand = np.unique(merged[pick])
        else:
            cand = merged[np.r_[True, new_value]] if merged.size else merged
        del merged, new_value
        # rule: member if score >= t
        tp_a = pos_a.size - np.searchsorted(pos_a, cand, side="left")
        fp_a = neg_a.size - np.searchsorted(neg_a, cand, side="left")
        if pos_a.size and neg_a.size:
            eps_a = _eps_from_rates(
                _cp_upper(fp_a, neg_a.size, alpha), _cp_upper(pos_a.size - tp_a, pos_a.size, alpha), delta
            )
            t = float(cand[int(np.argmax(eps_a))])
        else:
            t = float("inf")
        del both, pos_a, neg_a
        tp = fp = P_b = N_b = 0
        for sr, mr in rows(ib):  # counted on half B only
            pred = sr >= t
            k = int(np.count_nonzero(mr))
            P_b, N_b = P_b + k, N_b + mr.size - k
            tp += int(np.count_nonzero(pred & mr))
            fp += int(np.count_nonzero(pred)) - int(np.count_nonzero(pred & mr))
        fn, tn = P_b - tp, N_b - fp
        if tp + fn and fp + tn:
            eps = epsilon_lower_bound(tp, fn, fp, tn, delta=delta, confidence=confidence)
            tpr, fpr = tp / (tp + fn), fp / (fp + tn)
        else:
            eps, tpr, fpr = float("nan"), float("nan"), float("nan")
        out[v] = {"tp": tp, "fn": fn, "fp": fp, "tn": tn, "threshold": t,
                  "tpr": tpr, "fpr": fpr, "epsilon_lb": eps}
    return out
