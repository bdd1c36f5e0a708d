"""A researcher's own table as the lab's :class:`~engine.data.base.Dataset`: :func:`load_user_table`.

    schema = TableSchema(file="loans.csv", label="default", attributes=("region", "sex"), budget="eps")
    table = load_user_table(schema, max_tiers=MAX_TIERS)   # engine.config.run.MAX_TIERS
    table.dataset   # Dataset: x/y tensors, class names, sensitive_* = the attributes' groups
    table.tiers     # BudgetTiers (budget column only): .train tier index per training row, .epsilons
    table.preview   # TablePreview: rows, encoding rule with its numbers, classes, groups, tiers, sha256, notes

Reading: :mod:`engine.data.table_file`; the encoding rule: :mod:`engine.data.table_encode`; budgets → tiers:
:mod:`engine.data.budgets`; the records: :mod:`engine.data.table_records`.

Caching: the encoded arrays are saved under ``<data dir>/cache/tables/<file sha256>-<schema hash>/`` as ``.npy``
files and one JSON (read back with ``allow_pickle=False``, memory-mapped copy-on-write), so a second load of the same
bytes with the same schema does not parse the file (it only hashes it). A cache that cannot be written (a read-only data folder) is skipped;
one that cannot be read is rebuilt.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .base import Dataset
from .budgets import BudgetTiers, budget_tiers, budget_values
from .errors import DataError
from .files import data_dir as _resolve_data_dir
from .registry import subsample_indices
from .table_encode import MAX_CATEGORIES, FeatureEncoder, encode_label, split_rows, text_codes
from .table_file import TableFile, file_sha256, read_table, resolve_table_path
from .table_records import CategoricalCode, Count, NumericScale, TablePreview, TableSchema

ENCODING_VERSION = 1  # bump when the encoding rule changes: old cache entries are then never read
CACHE_FOLDER = ("cache", "tables")
MAX_CACHE_BYTES = 8 << 30  # the cache's size on disk, least recently used entries dropped first
# A group with fewer training rows than this is said in a note: PA-ALOOA's group risk is a mean over the group's
# samples and its bootstrap interval at a few dozen samples is too wide to tell groups apart.
MIN_AUDIT_GROUP_ROWS = 50
SPREADSHEET_TRIGGERS = ("=", "+", "-", "@", "\t", "\r")

_counters = {"parses": 0}  # tables parsed and encoded in this process (the cache test reads it)


def parse_count() -> int:
    """How many times this process parsed and encoded a table (a cache hit does not count)."""
    return _counters["parses"]


def spreadsheet_safe(text) -> str:
    """A cell for an exported CSV that a spreadsheet will not run as a formula: text starting with ``=``, ``+``,
    ``-``, ``@`` (or a tab / carriage return) gets a leading ``'`` (OWASP's CSV-injection rule). The one escaping
    function for group names, tier names and any other table text written to CSV."""
    s = str(text)
    return "'" + s if s.startswith(SPREADSHEET_TRIGGERS) else s


@dataclass(eq=False)
class UserTable:
    dataset: Dataset
    preview: TablePreview  # the whole table's (a subsample keeps it)
    tiers: BudgetTiers | None  # None: the schema names no budget column
    budgets_train: np.ndarray | None  # each training row's own budget (float64)
    budgets_test: np.ndarray | None
    max_tiers: int = 0
    bins: tuple[float, ...] | None = None

    def subsample(self, max_train: int | None, seed: int) -> "UserTable":
        """The registry's deterministic stratified subsample of the training rows (``data.max_train``), with the
        budget tiers made again from the owners kept (a tier whose owners all left is gone, never empty)."""
        ds = self.dataset
        sel = None if max_train is None else subsample_indices(ds.y_train.numpy(), int(max_train), int(seed))
        if sel is None:
            return self
        t = torch.from_numpy(sel)
        sub = Dataset(name=ds.name, x_train=ds.x_train[t], y_train=ds.y_train[t], x_test=ds.x_test, y_test=ds.y_test,
                      class_names=list(ds.class_names),
                      sensitive_train={k: v[sel] for k, v in ds.sensitive_train.items()},
                      sensitive_test=dict(ds.sensitive_test), default_sensitive=ds.default_sensitive, kind=ds.kind,
                      feature_names=list(ds.feature_names),
                      meta={**ds.meta, "seed": seed, "max_train": max_train, "train_indices": sel})
        budgets = None if self.budgets_train is None else self.budgets_train[sel]
        tiers = None if budgets is None else budget_tiers(budgets, self.budgets_test, self.tiers.column,
                                                          max_tiers=self.max_tiers, bins=self.bins)
        return UserTable(sub, self.preview, tiers, budgets, self.budgets_test, self.max_tiers, self.bins)


CACHE_ENV_VAR = "PRIVACY_LAB_TABLE_CACHE"  # a folder for the encoded tables instead of the data folder's (tests)


def cache_root(data_dir=None) -> Path:
    """Where encoded tables are cached: ``$PRIVACY_LAB_TABLE_CACHE`` when set, else ``<data dir>/cache/tables``."""
    if os.environ.get(CACHE_ENV_VAR):
        return Path(os.environ[CACHE_ENV_VAR]).expanduser()
    return _resolve_data_dir(data_dir).joinpath(*CACHE_FOLDER)


def _cache_key(sha256: str, schema: TableSchema) -> str:
    what = json.loads(schema.key())
    what.pop("file")  # the same bytes under another name encode the same
    what["version"], what["max_categories"] = ENCODING_VERSION, MAX_CATEGORIES
    h = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()
    return f"{sha256[:32]}-{h[:16]}"


def _columns_needed(schema: TableSchema, names: list[str]) -> list[str]:
    """The feature columns, after checking that every column the schema names exists."""
    named = [schema.label, *schema.attributes, *(c for c in (schema.split, schema.budget) if c),
             *(schema.features or ()), *schema.categorical]
    missing = list(dict.fromkeys(c for c in named if c not in names))
    if missing:
        shown = ", ".join(names[:40]) + (f", … ({len(names)} in all)" if len(names) > 40 else "")
        raise DataError(f"the table has no column {', '.join(map(repr, missing))}; its columns: {shown}.")
    if schema.features is not None:
        features = list(schema.features)
    else:
        roles = {schema.label, *schema.attributes, schema.split, schema.budget}
        features = [c for c in names if c not in roles]
    if not features:
        raise DataError("the table has no feature column left after the label, attributes, split and budget.")
    return features


def _parse(path: Path, schema: TableSchema) -> dict:
    """Read and encode the table: every array and fact of a load except the budget tiers."""
    _counters["parses"] += 1
    strings = (schema.label, *schema.attributes, *(c for c in (schema.split,) if c), *schema.categorical)
    table, tf = read_table(path, string_columns=tuple(strings))
    features = _columns_needed(schema, list(table.column_names))
    y, class_names = encode_label(table.column(schema.label), schema.label)
    budgets = None if schema.budget is None else budget_values(table.column(schema.budget), schema.budget)
    tr, te, how, notes = split_rows(None if schema.split is None else table.column(schema.split), schema.split, y,
                                    schema.seed, schema.test_fraction)
    encoder = FeatureEncoder(table, features, set(schema.categorical), tr, te)
    groups = {a: text_codes(table.column(a), a) for a in schema.attributes}
    del table
    x_train, x_test, names, nums, cats = encoder.encode()
    arrays = {"x_train": x_train, "x_test": x_test, "y_train": y[tr], "y_test": y[te]}
    for k, (codes, _) in enumerate(groups.values()):
        arrays[f"group{k}_train"], arrays[f"group{k}_test"] = codes[tr].astype(np.int32), codes[te].astype(np.int32)
    if budgets is not None:
        arrays["budgets_train"], arrays["budgets_test"] = budgets[tr], budgets[te]
    facts = {"file": tf.__dict__, "rows": int(len(y)), "split": how, "notes": notes, "features": features,
             "feature_names": names, "class_names": class_names,
             "groups": {a: values for a, (_, values) in groups.items()},
             "numeric": [n.__dict__ for n in nums], "categorical": [{**c.__dict__, "categories": list(c.categories)}
                                                                   for c in cats]}
    return {"arrays": arrays, "facts": facts}


def _save(folder: Path, parsed: dict) -> None:
    tmp = folder.with_name(f".{folder.name}.tmp{os.getpid()}")
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        for name, a in parsed["arrays"].items():
            np.save(tmp / f"{name}.npy", a, allow_pickle=False)
        (tmp / "facts.json").write_text(json.dumps(parsed["facts"]), encoding="utf-8")  # last: marks it complete
        os.replace(tmp, folder)
    except OSError:  # a read-only data folder, a full disk, another process that wrote it first: no cache
        pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _evict(root: Path, keep: Path) -> None:
    """Drop the least recently used cache entries beyond :data:`MAX_CACHE_BYTES` (never ``keep``, the newest)."""
    try:
        entries = [(p.joinpath("facts.json").stat().st_mtime_ns, p) for p in root.iterdir()
                   if p.is_dir() and not p.name.startswith(".") and (p / "facts.json").is_file()]
        total = 0
        for _, p in sorted(entries, reverse=True):
            total += sum(f.stat().st_size for f in p.iterdir())
            if total > MAX_CACHE_BYTES and p != keep:
                shutil.rmtree(p, ignore_errors=True)
    except OSError:
        pass


def _load_cached(folder: Path) -> dict | None:
    try:
        (folder / "facts.json").touch()  # its time orders the entries for eviction
    except OSError:  # absent, or a read-only data folder: read it all the same
        pass
    try:
        facts = json.loads((folder / "facts.json").read_text(encoding="utf-8"))
        # memory-mapped copy-on-write: the tensors are ready at once, their pages read from the file as used
        arrays = {p.stem: np.load(p, allow_pickle=False, mmap_mode="c") for p in folder.glob("*.npy")}
    except (OSError, ValueError):
        return None
    need = {"x_train", "x_test", "y_train", "y_test"} | {f"group{k}_{s}" for k in range(len(facts.get("groups", {})))
                                                         for s in ("train", "test")}
    if not need <= set(arrays) or arrays["x_train"].shape[0] != arrays["y_train"].shape[0]:
        return None
    return {"arrays": arrays, "facts": facts}


def _counts(train_codes: np.ndarray, test_codes: np.ndarray, names: list[str]) -> tuple[Count, ...]:
    tr = np.bincount(train_codes, minlength=len(names))
    te = np.bincount(test_codes, minlength=len(names))
    return tuple(Count(n, int(a), int(b)) for n, a, b in zip(names, tr, te) if a or b)


def _assemble(parsed: dict, schema: TableSchema, max_tiers: int, root: Path) -> UserTable:
    a, f = parsed["arrays"], parsed["facts"]
    tf = TableFile(**f["file"])
    notes = list(f["notes"])
    sens_train, sens_test, groups = {}, {}, {}
    for k, (attr, values) in enumerate(f["groups"].items()):
        values_arr = np.asarray(values, dtype=str)
        gtr, gte = a[f"group{k}_train"], a[f"group{k}_test"]
        sens_train[attr], sens_test[attr] = values_arr[gtr], values_arr[gte]
        groups[attr] = _counts(gtr, gte, values)
        small = [c.name for c in groups[attr] if c.train < MIN_AUDIT_GROUP_ROWS]
        if small:
            notes.append(f"{attr}: {len(small)} group(s) with fewer than {MIN_AUDIT_GROUP_ROWS} training rows "
                         f"({', '.join(small[:5])}{', …' if len(small) > 5 else ''}): too small for an audit to "
                         "resolve their risk")
    nums = tuple(NumericScale(**n) for n in f["numeric"])
    cats = tuple(CategoricalCode(**{**c, "categories": tuple(c["categories"])}) for c in f["categorical"])
    missing = sum(n.missing for n in nums)
    if missing:
        notes.append(f"{missing:,} missing numeric cell(s) encoded as the training mean (0 after scaling)")
    unseen = sum(c.unseen_test for c in cats)
    if unseen:
        notes.append(f"{unseen:,} test cell(s) hold a category the training split lacks: encoded as all zeros")
    tiers = None
    if schema.budget is not None:
        tiers = budget_tiers(a["budgets_train"], a["budgets_test"], schema.budget, max_tiers=max_tiers,
                             bins=schema.bins)
    y_tr, y_te = a["y_train"], a["y_test"]
    resolved = TableSchema(**{**schema.to_dict(), "features": f["features"]})
    preview = TablePreview(
        file=tf.path, sha256=tf.sha256, size_bytes=tf.size_bytes, format=tf.format, delimiter=tf.delimiter,
        rows=f["rows"], rows_train=len(y_tr), rows_test=len(y_te), split=f["split"],
        encoded_features=int(a["x_train"].shape[1]), numeric=nums, categorical=cats, max_categories=MAX_CATEGORIES,
        classes=tuple(Count(n, int(p), int(q)) for n, p, q in zip(
            f["class_names"], np.bincount(y_tr, minlength=len(f["class_names"])),
            np.bincount(y_te, minlength=len(f["class_names"])))),
        groups=groups, tiers=() if tiers is None else tiers.counts(), notes=tuple(notes), schema=resolved)
    dataset = Dataset(
        name=Path(schema.file).name,
        x_train=torch.from_numpy(np.ascontiguousarray(a["x_train"], dtype=np.float32)),
        y_train=torch.from_numpy(np.ascontiguousarray(y_tr, dtype=np.int64)),
        x_test=torch.from_numpy(np.ascontiguousarray(a["x_test"], dtype=np.float32)),
        y_test=torch.from_numpy(np.ascontiguousarray(y_te, dtype=np.int64)),
        class_names=list(f["class_names"]), sensitive_train=sens_train, sensitive_test=sens_test,
        default_sensitive=schema.attributes[0] if schema.attributes else None, kind="tabular",
        feature_names=list(f["feature_names"]),
        meta={"categorical": [c.column for c in cats], "numeric": [n.column for n in nums], "seed": None,
              "max_train": None, "data_dir": str(root), "table": {"sha256": tf.sha256, "size_bytes": tf.size_bytes,
                                                                   "schema": resolved.to_dict()}})
    return UserTable(dataset, preview, tiers, a.get("budgets_train"), a.get("budgets_test"), max_tiers,
                     schema.bins)


def load_user_table(schema: TableSchema | dict, *, max_tiers: int, data_dir=None, use_cache: bool = True) -> UserTable:
    """The table ``schema.file`` as a Dataset with its preview and budget tiers; one DataError line for a bad
    table or schema. ``max_tiers``: the run's tier cap (``engine.config.run.MAX_TIERS``). ``use_cache``: read
    and write the encoded arrays under the data folder's cache (False: parse, write nothing)."""
    if isinstance(schema, dict):
        schema = TableSchema.from_dict(schema)
    root = _resolve_data_dir(data_dir)
    path = resolve_table_path(schema.file, root)
    st = path.stat()
    return _load(schema, str(path), st.st_mtime_ns, st.st_size, str(root), int(max_tiers), bool(use_cache))


@functools.lru_cache(maxsize=2)
def _load(schema: TableSchema, path: str, mtime_ns: int, size: int, root: str, max_tiers: int,
          use_cache: bool) -> UserTable:
    """One load per file identity and schema in a process (shared: treat the tensors as read-only)."""
    sha, _ = file_sha256(Path(path))
    folder = cache_root(root) / _cache_key(sha, schema)
    parsed = _load_cached(folder) if use_cache else None
    if parsed is None:
        try:
            parsed = _parse(Path(path), schema)
        except MemoryError as e:
            raise DataError(f"Not enough memory to load {Path(path).name}.") from e
        if use_cache:
            shutil.rmtree(folder, ignore_errors=True)  # an entry that could not be read
            _save(folder, parsed)
            _evict(folder.parent, folder)
    return _assemble(parsed, schema, max_tiers, Path(root))


def preview_table(schema: TableSchema | dict, *, max_tiers: int, data_dir=None) -> TablePreview:
    """The preview of a table (the CLI's dry run and the Train page): loads it, so the cache is warm for training."""
    return load_user_table(schema, max_tiers=max_tiers, data_dir=data_dir).preview


def clear_table_cache() -> None:
    """Forget the loads held in this process (not the cache on disk)."""
    _load.cache_clear()
