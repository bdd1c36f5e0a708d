"""Privacy tiers: which data owner (training sample) gets which (ε, δ).

A tier assignment turns a :class:`~engine.config.run.TiersConfig` and a dataset into one
tier index per training sample (and per test sample where the rule is defined on test
data too: by class or by attribute value), so per-tier utility can be measured.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.config.run import MAX_TIERS, PAPER_TIERS, TierConfig, TiersConfig
from engine.config.schema import ConfigError
from engine.data.budgets import BudgetTiers, budget_tiers
from engine.data.errors import DataError


@dataclass(frozen=True)
class TierAssignment:
    train: np.ndarray  # tier index per training sample
    test: np.ndarray | None  # tier index per test sample; None when the rule is per-sample (random/explicit)
    epsilons: tuple[float, ...]
    names: tuple[str, ...]

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(int(n) for n in np.bincount(self.train, minlength=len(self.epsilons)))


def tier_names(tiers: TiersConfig) -> tuple[str, ...]:
    out = []
    for k, t in enumerate(tiers.tiers):
        if t.name:
            out.append(t.name)
        elif t.classes:
            out.append(f"ε={t.epsilon:g} ({','.join(map(str, t.classes))})")
        elif t.values:
            out.append(f"ε={t.epsilon:g} ({','.join(t.values)})")
        else:
            out.append(f"tier {k} (ε={t.epsilon:g})")
    return tuple(out)


def budget_tiers_of(tiers: TiersConfig, dataset) -> BudgetTiers:
    """``assign="column"``: the tiers of the owners' budgets the dataset (a table loaded with ``tiers.column`` as
    its budget column) carries per row, one per distinct budget or bin (:mod:`engine.data.budgets`' rule)."""
    meta = getattr(dataset, "meta", {}) or {}
    loaded = ((meta.get("table") or {}).get("schema") or {}).get("budget")
    if meta.get("budgets_train") is None or loaded != tiers.column:
        raise ConfigError("tiers.column", f"{dataset.name} carries no budget column {tiers.column!r}: tiers from a "
                                          "column need a table (data.file) loaded with it")
    try:
        return budget_tiers(meta["budgets_train"], meta["budgets_test"], tiers.column, max_tiers=MAX_TIERS,
                            bins=tiers.bins)
    except DataError as e:
        raise ConfigError("tiers.bins" if str(e).startswith("tiers.bins") else "tiers.column",
                          str(e).rstrip(".")) from None


def column_tiers(tiers: TiersConfig, dataset) -> TiersConfig:
    """``tiers`` with its ``tiers`` made from the table's budgets (one TierConfig per tier: its ε and name), what
    the planner and every page read; ``tiers`` unchanged unless ``assign="column"``."""
    if tiers.assign != "column":
        return tiers
    made = budget_tiers_of(tiers, dataset)
    return TiersConfig(assign="column", column=tiers.column, bins=tiers.bins,
                       tiers=tuple(TierConfig(epsilon=e, name=n) for e, n in zip(made.epsilons, made.names)))


def assign_tiers(tiers: TiersConfig, dataset, *, seed: int = 0) -> TierAssignment:
    """Per-sample tier indices; raises ConfigError for empty tiers or unassigned classes/values.

    ``tiers.validate()`` runs first, so classes are ints, values strings and assignments in-range
    ints: nothing here converts a value validation has not typed."""
    tiers.validate()
    y_train = dataset.y_train.numpy()
    y_test = dataset.y_test.numpy()
    k_tiers = len(tiers.tiers)
    test = None
    if tiers.assign == "class":
        lookup = np.full(dataset.num_classes, -1)
        for k, t in enumerate(tiers.tiers):
            for j, c in enumerate(t.classes):
                if not (0 <= c < dataset.num_classes):
                    raise ConfigError(f"tiers.tiers[{k}].classes[{j}]",
                                      f"class {c} out of range 0..{dataset.num_classes - 1} for {dataset.name}")
                lookup[c] = k
        missing = [c for c in range(dataset.num_classes) if lookup[c] < 0]
        if missing:
            raise ConfigError("tiers.tiers", f"class {missing[0]} is assigned to no tier")
        train, test = lookup[y_train], lookup[y_test]
    elif tiers.assign == "attribute":
        attr = tiers.attribute or dataset.default_sensitive
        if attr is None or attr not in dataset.sensitive_train:
            known = ", ".join(dataset.sensitive_train) or "none"
            raise ConfigError("tiers.attribute", f"{dataset.name} has no sensitive attribute {attr!r}; known: {known}")
        values = {}
        for k, t in enumerate(tiers.tiers):
            for v in t.values:
                values[v] = k
        present = sorted(set(map(str, dataset.sensitive_train[attr])))
        missing = [v for v in present if v not in values]
        if missing:
            raise ConfigError("tiers.tiers", f"{attr} value {missing[0]!r} is assigned to no tier")
        unknown = [v for v in values if v not in present]
        if unknown:
            raise ConfigError("tiers.tiers", f"{attr} has no value {unknown[0]!r}; values: {', '.join(present)}")
        train = np.array([values[str(v)] for v in dataset.sensitive_train[attr]])
        test = np.array([values.get(str(v), -1) for v in dataset.sensitive_test[attr]])
    elif tiers.assign == "column":  # each owner's own budget: the table's tiers, whatever `tiers` says
        made = budget_tiers_of(tiers, dataset)
        if tiers.tiers and tuple(float(t.epsilon) for t in tiers.tiers) != made.epsilons:
            # a config's tiers beside a budget column could plan another ε than the owners chose: never
            raise ConfigError("tiers.tiers", f"tiers from the column {tiers.column!r} are the table's ("
                                             f"ε = {', '.join(f'{e:g}' for e in made.epsilons)}): leave tiers.tiers "
                                             "out")
        return TierAssignment(train=made.train.astype(np.int64), test=made.test.astype(np.int64),
                              epsilons=made.epsilons, names=made.names)
    elif tiers.assign == "random":
        n = len(y_train)
        rng = np.random.default_rng(seed)
        counts = np.floor(np.array([t.ratio for t in tiers.tiers]) * n).astype(int)
        counts[np.argmax(counts)] += n - counts.sum()
        train = rng.permutation(np.repeat(np.arange(k_tiers), counts))
    else:  # explicit
        train = np.asarray(tiers.assignment, dtype=int)
        if len(train) != len(y_train):
            raise ConfigError("tiers.assignment",
                              f"has {len(train)} entries but {dataset.name} has {len(y_train)} training samples")
    sizes = np.bincount(train, minlength=k_tiers)
    for k in range(k_tiers):
        if sizes[k] == 0:
            raise ConfigError(f"tiers.tiers[{k}]", "this tier has no training samples")
    return TierAssignment(train=train.astype(np.int64), test=None if test is None else test.astype(np.int64),
                          epsilons=tuple(float(t.epsilon) for t in tiers.tiers), names=tier_names(tiers))


# --- presets -------------------------------------------------------------------------------
PRESETS = ("paper", "two_tier_attribute", "random_54_37_9", "single")


def preset_names(dataset) -> list[str]:
    out = []
    if dataset.num_classes == 10 and dataset.kind == "image":
        out.append("paper")
    if dataset.sensitive_train:
        out.append("two_tier_attribute")
    out += ["random_54_37_9", "single"]
    return out


def preset(name: str, dataset=None) -> TiersConfig:
    """Named tier splits. ``paper``: ε=1 {2,5,9}, ε=2 {3,7,8}, ε=3 {0,1,4,6} (MNIST/digits);
    ``two_tier_attribute``: the smallest group of the default sensitive attribute at ε=1,
    the rest at ε=3; ``random_54_37_9``: 54/37/9 % of samples at random with ε = 3/2/1.
    ``paper`` and ``random_54_37_9`` need no ``dataset``; the others read it."""
    if name == "paper":
        return TiersConfig(assign="class", tiers=PAPER_TIERS)
    if name in ("two_tier_attribute", "single") and dataset is None:
        raise ConfigError("tiers", f"preset {name!r} needs the dataset")
    if name == "two_tier_attribute":
        attr = dataset.default_sensitive
        if attr is None:
            raise ConfigError("tiers", f"{dataset.name} has no sensitive attribute for a two-tier split")
        vals, counts = np.unique(np.asarray(dataset.sensitive_train[attr]).astype(str), return_counts=True)
        minority = str(vals[np.argmin(counts)])
        rest = tuple(str(v) for v in vals if str(v) != minority)
        return TiersConfig(assign="attribute", attribute=attr, tiers=(
            TierConfig(epsilon=1.0, values=(minority,), name=f"ε=1 ({attr}={minority})"),
            TierConfig(epsilon=3.0, values=rest, name=f"ε=3 ({attr}≠{minority})"),
        ))
    if name == "random_54_37_9":
        return TiersConfig(assign="random", tiers=(
            TierConfig(epsilon=3.0, ratio=0.54, name="ε=3 (54%)"),
            TierConfig(epsilon=2.0, ratio=0.37, name="ε=2 (37%)"),
            TierConfig(epsilon=1.0, ratio=0.09, name="ε=1 (9%)"),
        ))
    if name == "single":
        return TiersConfig(assign="class", tiers=(
            TierConfig(epsilon=1.0, classes=tuple(range(dataset.num_classes)), name="all (ε=1)"),))
    allowed = preset_names(dataset) if dataset is not None else PRESETS
    raise ConfigError("tiers", f"unknown preset {name!r}; allowed: {', '.join(allowed)}")
