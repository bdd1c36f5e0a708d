"""The typed records of a researcher's table: the schema it is read with (:class:`TableSchema`) and what loading
it found (:class:`TablePreview`: rows, the encoding rule with its numbers, classes, groups and budget tiers with
their counts, the file's sha256 and size, notes). Each ``to_dict()`` is plain JSON and ``from_dict(to_dict(r)) ==
r`` (tests/test_user_table.py); the CLI's dry run, the Train page's preview and a run's record show the same one.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields

from .errors import DataError

TEST_FRACTION = 0.2  # the stratified split's test share when the table names no split column


def check_bins(bins) -> tuple[float, ...]:
    """The bins rule's upper edges: a non-empty list of finite positive numbers, strictly increasing."""
    if isinstance(bins, (str, bytes)) or not hasattr(bins, "__iter__"):
        raise DataError(f"tiers.bins must be a list of upper edges such as [1, 2, 4, 8], got {bins!r}.")
    edges = list(bins)
    for k, e in enumerate(edges):
        if isinstance(e, bool) or not isinstance(e, (int, float)) or not math.isfinite(e) or e <= 0:
            raise DataError(f"tiers.bins[{k}] must be a finite number > 0, got {e!r}.")
        if k and e <= edges[k - 1]:
            raise DataError(f"tiers.bins must increase: {edges[k - 1]!r} then {e!r}.")
    if not edges:
        raise DataError("tiers.bins is empty: give upper edges such as [1, 2, 4, 8].")
    return tuple(float(e) for e in edges)


@dataclass(frozen=True)
class TableSchema:
    """How a table is read: which column is the label, which are sensitive attributes, features, the split and
    the owners' budgets. ``features`` None: every other column (all but label, attributes, split and budget).
    ``categorical``: columns read as categories even when they hold numbers (codes such as a zip code).
    ``bins``: upper edges that group the budgets into tiers (:mod:`engine.data.budgets`)."""

    file: str
    label: str
    attributes: tuple[str, ...] = ()
    features: tuple[str, ...] | None = None
    categorical: tuple[str, ...] = ()
    split: str | None = None  # a column of "train" / "test"; None: a seeded stratified split
    budget: str | None = None  # the column of each owner's ε
    bins: tuple[float, ...] | None = None
    seed: int = 0  # the stratified split's seed
    test_fraction: float = TEST_FRACTION

    def __post_init__(self):
        for name in ("attributes", "categorical", "features", "bins"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (list, tuple)):
                raise DataError(f"data.{name} must be a list, got {value!r}.")
        for name in ("attributes", "categorical"):
            object.__setattr__(self, name, tuple(getattr(self, name) or ()))
        if self.features is not None:
            object.__setattr__(self, "features", tuple(self.features))
        if self.bins is not None:
            object.__setattr__(self, "bins", check_bins(self.bins))
        self.check()

    def check(self) -> None:
        """One DataError line for a schema that cannot name a table's columns (checked before the file is read)."""
        for name in ("file", "label"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise DataError(f"data.{name} must name a {'file' if name == 'file' else 'column'}, got {value!r}.")
        for name in ("attributes", "features", "categorical"):
            for v in getattr(self, name) or ():
                if not isinstance(v, str) or not v:
                    raise DataError(f"data.{name} must be column names, got {v!r}.")
        for name in ("split", "budget"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v):
                raise DataError(f"data.{name} must be a column name or null, got {v!r}.")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise DataError(f"data.seed must be a non-negative integer, got {self.seed!r}.")
        if not (isinstance(self.test_fraction, (int, float)) and 0 < self.test_fraction < 1):
            raise DataError(f"data.test_fraction must be in (0, 1), got {self.test_fraction!r}.")
        roles = [self.label, *self.attributes] + [c for c in (self.split, self.budget) if c]
        twice = sorted({c for c in roles if roles.count(c) > 1})
        if twice:
            raise DataError(f"column {twice[0]!r} is named twice among label, attributes, split and budget.")
        for name in ("attributes", "features", "categorical"):
            names = list(getattr(self, name) or ())
            twice = [c for k, c in enumerate(names) if c in names[:k]]
            if twice:
                raise DataError(f"data.{name} names {twice[0]!r} twice.")
        for c in (self.features or ()):
            if c == self.label or c in (self.split, self.budget):
                role = "label" if c == self.label else "split" if c == self.split else "budget"
                raise DataError(f"data.features: {c!r} is the {role} column, never a feature.")

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("attributes", "categorical", "features", "bins"):
            d[k] = None if d[k] is None else list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TableSchema":
        if not isinstance(d, dict):
            raise DataError(f"data must be an object with file and label, got {d!r}.")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise DataError(f"data: unknown field {unknown[0]!r}; known: {', '.join(sorted(known))}.")
        return cls(**d)

    def key(self) -> str:
        """Canonical JSON of what the encoded arrays depend on (the bins only regroup budgets: not in it)."""
        d = self.to_dict()
        d.pop("bins")
        return json.dumps(d, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Count:
    """One class, group value or tier and its rows in the training and the test split."""

    name: str
    train: int
    test: int


@dataclass(frozen=True)
class TierCount:
    """One tier from the owners' budgets: its ε, its budgets' range and its owners (training rows)."""

    name: str
    epsilon: float
    low: float  # the smallest budget in the tier (= epsilon: the tier's owners get no more than they chose)
    high: float  # the largest budget in the tier
    train: int
    test: int


@dataclass(frozen=True)
class NumericScale:
    """A numeric feature: ``(x - mean) / std`` with the training split's mean and std (std 1 for a constant
    column); a missing cell becomes 0 (the training mean)."""

    column: str
    mean: float
    std: float
    missing: int  # missing cells (both splits)


@dataclass(frozen=True)
class CategoricalCode:
    """A categorical feature: one 0/1 column per category seen in the training split, in this order; a test
    row's unseen category is all zeros."""

    column: str
    categories: tuple[str, ...]
    unseen_test: int  # test rows whose category the training split lacks


def _tuple_of(cls, items):
    return tuple(cls(**{**d, **({"categories": tuple(d["categories"])} if "categories" in d else {})})
                 for d in items or ())


@dataclass(frozen=True)
class TablePreview:
    """What loading a table found, with the schema it used (``schema``: features resolved)."""

    file: str  # resolved path
    sha256: str
    size_bytes: int
    format: str
    delimiter: str | None
    rows: int
    rows_train: int
    rows_test: int
    split: str  # how train/test were chosen, in words
    encoded_features: int
    numeric: tuple[NumericScale, ...]
    categorical: tuple[CategoricalCode, ...]
    max_categories: int
    classes: tuple[Count, ...]
    groups: dict  # attribute -> tuple[Count, ...]
    tiers: tuple[TierCount, ...] = ()
    notes: tuple[str, ...] = ()
    schema: TableSchema | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("extra", "schema")}
        for k in ("numeric", "categorical", "classes", "tiers"):
            d[k] = [asdict(x) for x in d[k]]
        for x in d["categorical"]:
            x["categories"] = list(x["categories"])
        d["groups"] = {a: [asdict(c) for c in cs] for a, cs in self.groups.items()}
        d["notes"] = list(self.notes)
        d["schema"] = None if self.schema is None else self.schema.to_dict()
        return {**d, **self.extra}

    @classmethod
    def from_dict(cls, d: dict) -> "TablePreview":
        known = {f.name for f in fields(cls)} - {"extra"}
        args = {k: v for k, v in d.items() if k in known}
        args.update(
            numeric=_tuple_of(NumericScale, d.get("numeric")),
            categorical=_tuple_of(CategoricalCode, d.get("categorical")),
            classes=_tuple_of(Count, d.get("classes")),
            tiers=_tuple_of(TierCount, d.get("tiers")),
            groups={a: _tuple_of(Count, cs) for a, cs in (d.get("groups") or {}).items()},
            notes=tuple(d.get("notes") or ()),
            schema=None if d.get("schema") is None else TableSchema.from_dict(d["schema"]),
        )
        return cls(**args, extra={k: v for k, v in d.items() if k not in known})

    def lines(self) -> list[str]:
        """The preview in words (the CLI's dry run prints these; the page shows the same numbers)."""
        out = [f"{self.file}: {self.rows:,} rows ({self.rows_train:,} train, {self.rows_test:,} test; {self.split}), "
               f"{self.size_bytes:,} bytes, sha256 {self.sha256}",
               f"encoded features: {self.encoded_features} ({len(self.numeric)} numeric standardised with the "
               f"training split's mean and std, {len(self.categorical)} categorical one-hot, at most "
               f"{self.max_categories} categories each)",
               "classes: " + ", ".join(f"{c.name} {c.train:,}/{c.test:,}" for c in self.classes) + " (train/test)"]
        for attr, counts in self.groups.items():
            out.append(f"groups by {attr}: " + ", ".join(f"{c.name} {c.train:,}/{c.test:,}" for c in counts))
        if self.tiers:
            out.append("tiers from budgets: " + ", ".join(f"{t.name} {t.train:,} owners" for t in self.tiers))
        out += [f"note: {n}" for n in self.notes]
        return out
