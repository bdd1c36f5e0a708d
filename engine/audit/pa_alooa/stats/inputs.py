"""The statistics' checked inputs and the design's halves: a (scores, membership) pair as float64 / bool, the
group index of the samples, and the models split in two halves — whole complementary pairs when the design hands
its R down (``pairs``), a plain random split otherwise."""

from __future__ import annotations

from typing import Any, Hashable

import numpy as np


def _as_pair(scores, membership) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64)
    m = np.asarray(membership)
    if s.ndim != 2:
        raise ValueError(f"scores must be 2-D (n_models, n_samples), got shape {s.shape}")
    if m.shape != s.shape:
        raise ValueError(f"membership shape {m.shape} != scores shape {s.shape}")
    if m.dtype != np.bool_:
        if not np.isin(m, (0, 1)).all():
            raise ValueError("membership must be boolean (or 0/1)")
        m = m.astype(bool)
    if np.isnan(s).any():
        raise ValueError("scores contain NaN")
    return s, m


def _py(v: Any) -> Hashable:
    """numpy scalar -> plain python scalar (for dict keys)."""
    return v.item() if isinstance(v, np.generic) else v


def _group_index(groups, n: int) -> tuple[list, list[np.ndarray]]:
    g = np.asarray(groups)
    if g.shape != (n,):
        raise ValueError(f"groups must have shape ({n},), got {g.shape}")
    values, inverse = np.unique(g, return_inverse=True)
    idx = [np.flatnonzero(inverse == k) for k in range(len(values))]
    return [_py(v) for v in values], idx


def _is_paired(membership: np.ndarray) -> bool:
    M = membership.shape[0]
    return M >= 2 and M % 2 == 0 and bool(np.all(membership[0::2] != membership[1::2]))


def _pairs_of(membership: np.ndarray, pairs: int | None) -> int:
    """How many complementary pairs (rows 2r, 2r+1) the membership holds: ``pairs`` as the design that made it
    says (the audit hands its R down; a matrix that does not match is a bug upstream, refused), 0 for a design
    without them, and for a bare matrix (``None``) what its rows show."""
    M = membership.shape[0]
    if pairs is None:
        return M // 2 if _is_paired(membership) else 0
    pairs = int(pairs)
    if pairs and (M != 2 * pairs or not _is_paired(membership)):
        raise ValueError(f"the membership's {M} rows are not the design's {pairs} complementary pairs")
    return pairs


def _split_pairs(R: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Random split of ``R`` complementary pairs into two halves (pair indices)."""
    if R < 2:
        raise ValueError("need at least 2 complementary pairs (2R >= 4) to split models")
    perm = rng.permutation(R)
    return np.sort(perm[: R // 2]), np.sort(perm[R // 2:])


def _split_models(membership: np.ndarray, rng: np.random.Generator, pairs: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random split of model indices into two halves.

    With ``pairs`` complementary pairs (:func:`_pairs_of`), whole pairs go to one half (stratified: every
    sample has equally many members and non-members in each half); otherwise a plain random split of the models.
    """
    M = membership.shape[0]
    if pairs:
        a, b = _split_pairs(pairs, rng)
        pa = np.stack([2 * a, 2 * a + 1], axis=1).ravel()
        pb = np.stack([2 * b, 2 * b + 1], axis=1).ravel()
        return pa, pb
    if M < 4:
        raise ValueError("need at least 4 models to split them in halves")
    perm = rng.permutation(M)
    return np.sort(perm[: M // 2]), np.sort(perm[M // 2:])
