"""THE encoding rule of a researcher's table (written once; :func:`engine.data.user_table.load_user_table` applies
it, the preview states it with its numbers):

* **Label**: its text values are the classes, in numeric order when every value is a number, else in text order;
  class id = place in that order. At least 2 classes, at most :data:`MAX_LABEL_CLASSES`; a row without a label is
  refused.
* **Split**: a named split column holds ``train`` / ``test`` (any case); else a stratified split, seeded, with the
  schema's test fraction (not stratified, with a note, when a class is too small for it).
* **Numeric features** (a column Arrow reads as numbers): standardised ``(x - mean) / std`` with the mean and
  std of the training split only (std 1 for a constant column); a missing cell becomes 0, i.e. the training mean;
  an infinite value is refused.
* **Categorical features** (a text column, or one named in ``categorical``): one 0/1 column per category seen in
  the training split, in text order; a missing cell is the category ``(missing)``; a test row's unseen category
  is all zeros. More than :data:`MAX_CATEGORIES` distinct values in the table is refused, naming the column and
  its count (drop it from the features, or bin it into fewer values).
* **Junk in a numeric column**: a text column whose non-missing cells are numbers in at least
  :data:`NUMERIC_SHARE` of its rows, but not all, is refused naming the column, how many cells are not numbers and
  the first (name it in ``categorical`` if it really is a category).
"""
from __future__ import annotations

import re

import numpy as np

from .errors import DataError
from .table_records import CategoricalCode, NumericScale

MAX_CATEGORIES = 100  # distinct values of one categorical feature
MAX_LABEL_CLASSES = 1000
NUMERIC_SHARE = 0.9
MISSING = "(missing)"
_NUMBER = re.compile(r"^\s*[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?\s*$")


def is_number_text(s: str) -> bool:
    return bool(_NUMBER.match(s))


def text_codes(column, name: str) -> tuple[np.ndarray, list[str]]:
    """(code per row, the distinct texts): a column's values as text, a missing cell as :data:`MISSING`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_floating(arr.type):  # a float NaN is a missing cell, like an empty one
        arr = pc.if_else(pc.is_nan(arr), pa.scalar(None, arr.type), arr)
    if not pa.types.is_string(arr.type) and not pa.types.is_large_string(arr.type):
        try:
            arr = arr.cast(pa.string())
        except pa.ArrowException as e:  # nested Parquet types (lists, structs …)
            raise DataError(f"column {name!r} holds {arr.type} values, which the lab cannot read as numbers or "
                            "categories; leave it out.") from e
    enc = arr.dictionary_encode()
    values = [str(v) for v in enc.dictionary.to_pylist()]
    codes = enc.indices.fill_null(len(values)).to_numpy(zero_copy_only=False).astype(np.int32)
    if (codes == len(values)).any():
        values.append(MISSING)
    return codes, values


def value_counts(codes: np.ndarray, n_values: int) -> np.ndarray:
    return np.bincount(codes, minlength=n_values)


def encode_label(column, name: str) -> tuple[np.ndarray, list[str]]:
    """(class id per row, class names in their stated order)."""
    codes, values = text_codes(column, name)
    if values and values[-1] == MISSING:
        n = int((codes == len(values) - 1).sum())
        raise DataError(f"label column {name!r}: {n:,} row{'s have' if n != 1 else ' has'} no label (empty or NaN); "
                        f"drop {'them' if n != 1 else 'it'} or give {'them' if n != 1 else 'it'} a class.")
    if len(values) < 2:
        only = values[0] if values else "nothing"
        raise DataError(f"label column {name!r} has one class ({only!r}); a classifier needs at least 2.")
    if len(values) > MAX_LABEL_CLASSES:
        raise DataError(f"label column {name!r} has {len(values):,} distinct values, more than the "
                        f"{MAX_LABEL_CLASSES} classes a label may have (a continuous target? bin it into classes).")
    if all(is_number_text(v) for v in values):
        order = sorted(range(len(values)), key=lambda k: (float(values[k]), values[k]))
    else:
        order = sorted(range(len(values)), key=lambda k: values[k])
    rank = np.empty(len(values), dtype=np.int64)
    rank[order] = np.arange(len(values))
    return rank[codes], [values[k] for k in order]


def split_rows(split_column, split_name: str | None, y: np.ndarray, seed: int,
               test_fraction: float) -> tuple[np.ndarray, np.ndarray, str, list[str]]:
    """(training rows, test rows, how in words, notes)."""
    if split_column is not None:
        codes, values = text_codes(split_column, split_name)
        role = {v: v.strip().lower() for v in values}
        bad = [v for v in values if role[v] not in ("train", "test")]
        if bad:
            raise DataError(f"split column {split_name!r} holds {bad[0]!r}; each row must say train or test.")
        is_test = np.array([role[v] == "test" for v in values])[codes]
        tr, te = np.flatnonzero(~is_test), np.flatnonzero(is_test)
        for rows, what in ((tr, "train"), (te, "test")):
            if len(rows) == 0:
                raise DataError(f"split column {split_name!r} names no {what} row.")
        return tr, te, f"split column {split_name!r}", []
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(y))
    how = f"stratified {1 - test_fraction:.0%}/{test_fraction:.0%} split, seed {seed}"
    notes = []
    try:
        tr, te = train_test_split(idx, test_size=test_fraction, stratify=y, random_state=seed)
    except ValueError:  # a class with one row, or fewer test rows than classes
        tr, te = train_test_split(idx, test_size=test_fraction, random_state=seed)
        how = f"random {1 - test_fraction:.0%}/{test_fraction:.0%} split, seed {seed}"
        notes.append("a class is too small for a stratified split: the split is random, not stratified")
    if len(tr) == 0 or len(te) == 0:
        raise DataError(f"the table has {len(y)} rows: too few for a training and a test split.")
    return np.sort(tr), np.sort(te), how, notes


def _junk_check(name: str, codes: np.ndarray, values: list[str]) -> None:
    counts = value_counts(codes, len(values))
    numeric = np.array([is_number_text(v) for v in values])
    present = np.array([v != MISSING for v in values])
    total = int(counts[present].sum())
    good = int(counts[numeric].sum())
    if 0 < good < total and good >= NUMERIC_SHARE * total:
        bad_values = [k for k in range(len(values)) if present[k] and not numeric[k]]
        first_row = int(np.flatnonzero(np.isin(codes, bad_values))[0])
        raise DataError(f"column {name!r} is numeric but {total - good:,} cell{'s are' if total - good != 1 else ' is'}"
                        f" not a number (first: {values[codes[first_row]]!r} in data row "
                        f"{first_row + 1}); fix {'them' if total - good != 1 else 'it'}, or name the column in "
                        "data.categorical if it holds categories.")


def is_numeric_column(column) -> bool:
    import pyarrow as pa

    t = column.type
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)) and not pa.types.is_null(t)


def numeric_values(column, name: str) -> np.ndarray:
    """float64 per row (NaN: missing) of a column Arrow read as numbers."""
    import pyarrow as pa

    return np.asarray(column.cast(pa.float64()).to_numpy(), dtype=np.float64)  # a missing cell: NaN


class FeatureEncoder:
    """Fits the rule on the training rows and writes each feature's columns straight into the preallocated
    float32 train/test matrices (no full-table float copy: the peak stays near the encoded size)."""

    def __init__(self, table, features: list[str], categorical: set[str], tr: np.ndarray, te: np.ndarray):
        self.table, self.tr, self.te = table, tr, te
        self.numeric_cols: list[tuple[str, np.ndarray | None]] = []  # values per row when read from text
        self.categorical_cols: list[tuple[str, np.ndarray, list[str]]] = []
        for name in features:  # classify and check every column before any memory is allocated
            col = table.column(name)
            if name not in categorical and is_numeric_column(col):
                self.numeric_cols.append((name, None))
                continue
            codes, values = text_codes(col, name)
            if name not in categorical:
                _junk_check(name, codes, values)
                number = [is_number_text(v) for v in values if v != MISSING]
                if number and all(number):  # text that is all numbers (a column empty where its type was read)
                    as_float = np.array([float(v) if v != MISSING else np.nan for v in values])
                    self.numeric_cols.append((name, as_float[codes]))
                    continue
            if len(values) > MAX_CATEGORIES:
                raise DataError(f"categorical column {name!r} has {len(values):,} distinct values, more than the "
                                f"{MAX_CATEGORIES} a feature may have; leave it out of data.features or bin it into "
                                "fewer values.")
            self.categorical_cols.append((name, codes, values))
        # keep only the columns still to be read: the text columns' memory goes once their codes are made
        self.table = table.select([name for name, v in self.numeric_cols if v is None])

    def encode(self):
        """(x_train, x_test, feature names, NumericScale records, CategoricalCode records)."""
        tr, te = self.tr, self.te
        names: list[str] = []
        sources = []  # (offset, one-hot?, per training row, per test row): a float32 value or an int32 column
        cats, nums = [], []
        for name, codes, values in self.categorical_cols:
            seen = np.flatnonzero(value_counts(codes[tr], len(values)))
            order = sorted(seen, key=lambda k: values[k])
            column_of = np.full(len(values), -1, dtype=np.int32)
            column_of[order] = np.arange(len(order))
            sources.append((len(names), True, column_of[codes[tr]], column_of[codes[te]]))
            cats.append(CategoricalCode(name, tuple(values[k] for k in order), int((sources[-1][3] < 0).sum())))
            names += [f"{name}={values[k]}" for k in order]
        self.categorical_cols = []
        for name, v in self.numeric_cols:
            v = numeric_values(self.table.column(name), name) if v is None else v
            inf = np.isinf(v)
            if inf.any():
                raise DataError(f"column {name!r} has {int(inf.sum()):,} infinite value(s) (first in data row "
                                f"{int(np.flatnonzero(inf)[0]) + 1}); give finite numbers or leave the cells empty.")
            missing = np.isnan(v)
            known = v[tr][~missing[tr]]  # the training split's statistics only
            mean = float(known.mean()) if len(known) else 0.0
            std = float(known.std()) if len(known) else 1.0
            std = std if std > 0 and np.isfinite(std) else 1.0
            scaled = (v - mean) / std
            scaled[missing] = 0.0
            sources.append((len(names), False, scaled[tr].astype(np.float32), scaled[te].astype(np.float32)))
            nums.append(NumericScale(name, mean, std, int(missing.sum())))
            names.append(name)
        self.table = None  # the parsed columns' memory goes before the matrices are made
        x_train = _fill(len(tr), len(names), sources, 2)
        x_test = _fill(len(te), len(names), sources, 3)
        return x_train, x_test, names, tuple(nums), tuple(cats)


def _fill(n: int, width: int, sources, which: int, block: int = 8192) -> np.ndarray:
    """The float32 matrix, filled a block of rows at a time: each block (a few MB) stays in the cache while its
    columns are written, where a whole column at a time would touch every page of the matrix once per column."""
    x = np.zeros((n, width), dtype=np.float32)
    for r0 in range(0, n, block):
        rows = x[r0:r0 + block]
        for source in sources:
            offset, one_hot, values = source[0], source[1], source[which][r0:r0 + block]
            if one_hot:
                hit = np.flatnonzero(values >= 0)
                rows[hit, offset + values[hit]] = 1.0
            else:
                rows[:, offset] = values
    return x
