"""The audit's membership design: who trains on what, who is grouped how, which seed drives what.

    complementary halves    model 2r trains on one random half, model 2r+1 on the other: R pairs, 2R models;
                            the statistics are handed R (``pairs=``), never left to find the pairs themselves
    group_labels            the GPR group (class / tier / sensitive attribute) of every sample
    looa_targets            PA-LOOA: the records audited one at a time, and the models with / without each
    derived_seed            one independent seed per (purpose, model or chunk) — resumes are bit-identical
    chunks / chunk_layout   which models train together
"""
from __future__ import annotations

import numpy as np

from engine.audit.pa_alooa.config import AuditConfig, single_tier
from engine.config.run import TiersConfig
from engine.config.schema import ConfigError
from engine.dp.groups import sample_groups
from engine.dp.tiers import column_tiers


def resolved_tiers(config: AuditConfig, dataset) -> TiersConfig:
    if config.run.tiers is not None:  # tiers from a budget column: made from the table, once for every algorithm
        try:
            return column_tiers(config.run.tiers, dataset)
        except ConfigError as e:
            raise e.under("run.") from None
    return single_tier(config.epsilon, range(dataset.num_classes))


def group_labels(config, dataset, tiers, by: str, field_name: str):
    """(GPR group label per training sample, ordered label names, label per test sample or None; "" for a test
    sample in no group): the labels of :func:`engine.dp.groups.sample_groups`."""
    train, names, test = sample_groups(by, dataset, tiers, attribute=config.group_attribute, field=field_name)
    labels = np.asarray(names + [""], dtype=object)  # index −1 → ""
    return labels[train].astype(str), names, None if test is None else labels[test].astype(str)


def complementary_membership(n_samples: int, R: int, *, seed) -> np.ndarray:
    """PA-ALOOA membership matrix, bool of shape ``(2R, n_samples)``.

    For each ``r``, a fresh random permutation splits the samples into two
    complementary halves: row ``2r`` and row ``2r+1``.  For odd ``n_samples``
    the extra sample goes to row ``2r`` for even ``r`` and to row ``2r+1`` for
    odd ``r``.  Every sample is a member of exactly ``R`` models.
    """
    n, R = int(n_samples), int(R)
    if n < 1 or R < 1:
        raise ValueError("n_samples and R must be >= 1")
    rng = np.random.default_rng(seed)
    out = np.zeros((2 * R, n), dtype=bool)
    for r in range(R):
        k = n // 2 + (n % 2 if r % 2 == 0 else 0)
        idx = rng.permutation(n)[:k]
        out[2 * r, idx] = True
        out[2 * r + 1] = ~out[2 * r]
    return out


def derived_seed(*parts) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1, dtype=np.uint64)[0] % (2**63 - 1))


def init_seeds(seed: int, lo: int, hi: int) -> list[int]:
    """The initialisation seeds of models lo..hi−1 of the 2R: shared by every algorithm (and the accuracy-matched
    control's pilot), so that model j of each starts from the same weights and the comparisons are paired."""
    return [derived_seed(seed, 1, j) for j in range(lo, hi)]


def chunks(total: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(total, a + size)) for a in range(0, total, size)]


def group_sizes(groups, names) -> dict:
    return {g: int(np.sum(groups == g)) for g in names}


def chunk_layout(setup) -> dict:
    cfg = setup.config
    out = {}
    for a in setup.algos:
        out[f"{a.key}/aloo"] = [list(c) for c in chunks(setup.n_models, setup.chunk_models)]
        if cfg.looa_k:
            looa = (cfg.looa_k + 1) * cfg.looa_models
            out[f"{a.key}/looa"] = [list(c) for c in chunks(looa, setup.chunk_models)]
    return out


def looa_targets(base: np.ndarray, advantage: np.ndarray, k: int) -> np.ndarray:
    """PA-LOOA: the ``k`` records outside model 0's half (``base``) that the ALOOA advantage ranks riskiest."""
    outside = np.flatnonzero(~base)
    score = np.where(np.isnan(advantage[outside]), -np.inf, advantage[outside])
    order = np.lexsort((outside, -score))  # highest advantage first, ties by index
    return outside[order[:k]]


def looa_membership(base: np.ndarray, targets: np.ndarray, models_per_side: int) -> np.ndarray:
    """(k + 1) · m membership rows: m models on ``base`` alone, then m models on ``base`` + each target."""
    m = models_per_side
    members = np.repeat(base[None, :], (len(targets) + 1) * m, axis=0)
    for t, i in enumerate(targets):
        members[(t + 1) * m:(t + 2) * m, i] = True
    return members
