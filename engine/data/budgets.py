"""Owners' privacy budgets from a table column → privacy tiers (``tiers.assign = "column"``).

* Every row needs a budget: a number, finite and > 0. A missing, non-finite or non-positive one is refused,
  naming the column and how many rows; a cell that is not a number is refused the same way.
* Without bins, each distinct budget among the training rows is one tier with exactly that ε, in increasing ε.
  More distinct budgets than the run's tier cap is refused with one line saying how many and how to bin them.
* With ``bins`` (upper edges e_1 < … < e_m), the budgets group into ``b ≤ e_1``, ``e_1 < b ≤ e_2``, …,
  ``b > e_m``; each non-empty bin is one tier whose ε is the **smallest** budget of its training rows.
* The cap is the run config's (``engine.config.run.MAX_TIERS``), passed in by the caller: this package is the
  engine's bottom layer and imports nothing above it.

The result's ``train`` (tier index per training row) and ``epsilons`` are what
``engine.dp.tiers.assign_tiers``'s explicit assignment takes (``TiersConfig(assign="explicit",
tiers=(TierConfig(epsilon=ε_k, name=names[k]), …), assignment=tuple(train))``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import DataError
from .table_encode import is_number_text, is_numeric_column, numeric_values, text_codes
from .table_records import TierCount, check_bins


@dataclass(frozen=True, eq=False)
class BudgetTiers:
    """Tiers from the owners' budgets (ascending ε)."""

    column: str
    train: np.ndarray  # tier index per training row
    test: np.ndarray  # tier index per test row; -1: its budget falls in no tier the training rows make
    epsilons: tuple[float, ...]
    names: tuple[str, ...]
    lows: tuple[float, ...]  # each tier's smallest budget (training rows)
    highs: tuple[float, ...]  # each tier's largest budget (training rows)

    def explicit(self) -> tuple[tuple[int, ...], tuple[float, ...], tuple[str, ...]]:
        """(tier index per training row, ε per tier, name per tier): what ``engine.config.run.TiersConfig(
        assign="explicit", assignment=…, tiers=(TierConfig(epsilon=ε_k, name=name_k), …))`` takes."""
        return tuple(int(k) for k in self.train), self.epsilons, self.names

    def counts(self) -> tuple[TierCount, ...]:
        k = len(self.epsilons)
        tr = np.bincount(self.train, minlength=k)
        te = np.bincount(self.test[self.test >= 0], minlength=k)
        return tuple(TierCount(self.names[i], self.epsilons[i], self.lows[i], self.highs[i], int(tr[i]), int(te[i]))
                     for i in range(k))


def budget_values(column, name: str) -> np.ndarray:
    """float64 budget per row; one DataError line for a cell that is not a number or not a usable ε."""
    if is_numeric_column(column):
        b = numeric_values(column, name)
    else:
        codes, values = text_codes(column, name)
        bad = [k for k, v in enumerate(values) if not is_number_text(v) and v != "(missing)"]
        if bad:
            rows = np.isin(codes, bad)
            n, first = int(rows.sum()), int(np.flatnonzero(rows)[0])
            raise DataError(f"budget column {name!r}: {n:,} row{'s are' if n != 1 else ' is'} not a number "
                            f"(first: {values[codes[first]]!r} in data row {first + 1}); each owner's ε must be a "
                            "number > 0.")
        as_float = np.array([float(v) if v != "(missing)" else np.nan for v in values], dtype=np.float64)
        b = as_float[codes]
    unusable = ~(np.isfinite(b) & (b > 0))
    if unusable.any():
        n, first = int(unusable.sum()), int(np.flatnonzero(unusable)[0])
        raise DataError(f"budget column {name!r}: {n:,} row{'s have' if n != 1 else ' has'} a missing, non-finite "
                        f"or non-positive budget (first: data row {first + 1}); each owner's ε must be a number > 0.")
    return b


def too_many_tiers(column: str, n: int, max_tiers: int) -> str:
    return (f"budget column {column!r} has {n:,} distinct budgets, more than the {max_tiers:,} tiers a run may "
            "have: bin them with tiers.bins, a list of upper edges (e.g. [1, 2, 4, 8] makes the tiers ≤ 1, (1, 2], "
            "(2, 4], (4, 8], > 8), each bin's ε its smallest budget.")


def budget_tiers(train_budgets: np.ndarray, test_budgets: np.ndarray, column: str, *, max_tiers: int,
                 bins=None) -> BudgetTiers:
    """Tiers from the training rows' budgets (see the module's rule); ``test_budgets`` are mapped onto them."""
    train_budgets = np.asarray(train_budgets, dtype=np.float64)
    test_budgets = np.asarray(test_budgets, dtype=np.float64)
    if len(train_budgets) == 0:
        raise DataError(f"budget column {column!r}: no training rows.")
    if bins is None:
        eps, train = np.unique(train_budgets, return_inverse=True)
        if len(eps) > max_tiers:
            raise DataError(too_many_tiers(column, len(eps), max_tiers))
        pos = np.clip(np.searchsorted(eps, test_budgets), 0, len(eps) - 1)
        test = np.where(eps[pos] == test_budgets, pos, -1)
        epsilons = tuple(float(e) for e in eps)
        return BudgetTiers(column, train.astype(np.int64), test.astype(np.int64), epsilons,
                           tuple(f"ε={e:g}" for e in epsilons), epsilons, epsilons)
    edges = np.asarray(check_bins(bins))
    train_bin = np.searchsorted(edges, train_budgets, side="left")  # b ≤ e_1 → 0, e_1 < b ≤ e_2 → 1, …, > e_m → m
    used = np.unique(train_bin)
    if len(used) > max_tiers:
        raise DataError(f"tiers.bins makes {len(used):,} tiers, more than the {max_tiers:,} a run may have; "
                        "use fewer edges.")
    tier_of_bin = np.full(len(edges) + 1, -1, dtype=np.int64)
    tier_of_bin[used] = np.arange(len(used))
    train = tier_of_bin[train_bin]
    test = tier_of_bin[np.searchsorted(edges, test_budgets, side="left")]
    order = np.argsort(train, kind="stable")
    starts = np.r_[0, np.cumsum(np.bincount(train))[:-1]]
    lows = tuple(float(v) for v in np.minimum.reduceat(train_budgets[order], starts))
    highs = tuple(float(v) for v in np.maximum.reduceat(train_budgets[order], starts))
    # A bin's ε is its smallest budget, the conservative choice: an owner must never be trained at a larger ε
    # (a weaker guarantee) than the one they chose; owners above the bin's minimum get more privacy than asked.
    epsilons = lows
    names = tuple(f"ε={lo:g}" if lo == hi else f"ε={lo:g} (budgets {lo:g}–{hi:g})" for lo, hi in zip(lows, highs))
    return BudgetTiers(column, train, test, epsilons, names, lows, highs)
