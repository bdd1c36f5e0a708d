"""A researcher's table file (CSV, ``.csv.gz``, Parquet) read into a ``pyarrow.Table``, checked for what makes a
file unusable before any column is looked at: too large, empty, header only, duplicate or unnamed columns.

* Where: :func:`resolve_table_path`: an absolute path is used as is; a relative one resolves in the data folder
  (:func:`engine.data.files.data_dir`), else in the lab's shipped ``assets/`` (the worked example), and may not
  climb out of it with ``..``.
* What is read: only text (CSV) or Parquet's typed columns. Nothing is unpickled or evaluated: CSV cells are
  parsed by Arrow's CSV reader as numbers or strings; Parquet is read by Arrow without its pandas metadata.
* Caps: the stored file at most :data:`MAX_TABLE_BYTES`; a ``.csv.gz`` decompresses under the same cap (streamed:
  a decompression bomb stops there), a Parquet file's stated uncompressed size is checked before it is read.
* The delimiter of a CSV is sniffed from its first :data:`SNIFF_BYTES` (``,`` ``;`` tab ``|``; ``,`` if unclear).
* A CSV is parsed block by block (:data:`BLOCK_BYTES` of text at a time, so the peak stays near the parsed
  columns); the column types Arrow infers from the first block hold for the rest, except that an integer
  column is read as decimals and a column empty there as text (its numbers are found later, in
  :mod:`engine.data.table_encode`). Text further down that is not a number in a numeric column is refused.
* Missing cells: empty, ``NA``, ``N/A``, ``NaN``, ``nan``, ``null``, ``NULL``, ``None`` (:data:`NULL_VALUES`).
"""
from __future__ import annotations

import contextlib
import csv
import gzip
import hashlib
import io
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from .errors import DataError
from .files import ASSETS_DIR, data_dir

MAX_TABLE_BYTES = 1 << 30  # largest table file (stored, and a .csv.gz decompressed): 1 GiB
SNIFF_BYTES = 64 << 10
BLOCK_BYTES = 4 << 20  # CSV text parsed at a time
DELIMITERS = ",;\t|"
NULL_VALUES = ("", "NA", "N/A", "NaN", "nan", "null", "NULL", "None")
FORMATS = ("csv", "csv.gz", "parquet")

_SHA_MEMO: dict[tuple[str, int, int], str] = {}  # (path, mtime_ns, size) -> sha256 of the stored bytes
_LOCK = threading.Lock()


@dataclass(frozen=True)
class TableFile:
    """The identity of a table file as read: where, its sha256 and size (stored bytes), format and delimiter."""

    path: str
    sha256: str
    size_bytes: int
    format: str  # one of FORMATS
    delimiter: str | None = None  # CSV only


def table_format(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".csv.gz") or name.endswith(".tsv.gz") or name.endswith(".txt.gz"):
        return "csv.gz"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith((".csv", ".tsv", ".txt")):
        return "csv"
    raise DataError(f"{path.name}: not a table file the lab reads; give a .csv, .csv.gz or .parquet file.")


def resolve_table_path(file: str | os.PathLike, data_dir_arg: str | os.PathLike | None = None) -> Path:
    """The table file ``file`` names: absolute as is; relative in the data folder, else in the shipped assets/."""
    text = str(file).strip()
    if not text:
        raise DataError("data.file is empty: name a .csv, .csv.gz or .parquet file in the data folder.")
    given = Path(text).expanduser()
    if given.is_absolute():
        candidates = [given]
    else:
        root = data_dir(data_dir_arg)
        candidates = []
        for base in (root, Path(ASSETS_DIR)):
            p = (base / given).resolve()
            if not p.is_relative_to(base.resolve()):
                raise DataError(f"{text}: a relative path stays inside the data folder {root}; give an absolute "
                                "path for a file elsewhere.")
            candidates.append(p)
    for p in candidates:
        if p.is_file():
            return p
    where = candidates[0] if given.is_absolute() else f"{candidates[0]} (the data folder) nor in the lab's assets/"
    raise DataError(f"{text}: no such file: not found at {where}.")


def file_sha256(path: Path) -> tuple[str, int]:
    """(sha256 of the stored bytes, size); refused over :data:`MAX_TABLE_BYTES` before a byte is read.
    Memoised per (path, mtime, size) within the process."""
    try:
        st = path.stat()
    except OSError as e:
        raise DataError(f"Cannot read {path}: {e}") from e
    if st.st_size > MAX_TABLE_BYTES:
        raise DataError(f"{path.name} is {st.st_size:,} bytes, over the {MAX_TABLE_BYTES:,}-byte cap of a table "
                        "file; use fewer rows or columns.")
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key in _SHA_MEMO:
        return _SHA_MEMO[key], st.st_size
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(4 << 20):
                h.update(chunk)
    except OSError as e:
        raise DataError(f"Cannot read {path}: {e}") from e
    with _LOCK:
        _SHA_MEMO[key] = h.hexdigest()
    return _SHA_MEMO[key], st.st_size


class _CappedReader(io.RawIOBase):
    """A decompressed stream that refuses to yield more than ``cap`` bytes (a decompression bomb stops here)."""

    def __init__(self, raw, cap: int, name: str):
        self._raw, self._cap, self._name, self._n = raw, cap, name, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        try:
            n = self._raw.readinto(b)
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            raise DataError(f"{self._name} is not a valid gzip file ({e}).") from e
        self._n += n
        if self._n > self._cap:
            raise DataError(f"{self._name} decompresses to more than the {self._cap:,}-byte cap of a table file.")
        return n


def _open_text(path: Path, fmt: str):
    if fmt == "csv.gz":
        return io.BufferedReader(_CappedReader(gzip.open(path, "rb"), MAX_TABLE_BYTES, path.name), 1 << 20)
    return open(path, "rb")


def sniff_delimiter(sample: str) -> str:
    """The delimiter of a CSV sample: csv.Sniffer over :data:`DELIMITERS`, else the candidate the header line
    holds most often, else ``,``."""
    try:
        return csv.Sniffer().sniff(sample, delimiters=DELIMITERS).delimiter
    except csv.Error:
        header = sample.splitlines()[0] if sample else ""
        counts = {d: header.count(d) for d in DELIMITERS}
        best = max(counts, key=counts.get)
        return best if counts[best] else ","


def _check_names(names: list[str], where: str) -> None:
    seen: dict[str, int] = {}
    for k, n in enumerate(names):
        if not str(n).strip():
            raise DataError(f"{where}: column {k + 1} has no name; every column needs a header.")
        if n in seen:
            raise DataError(f"{where}: duplicate column name {n!r} (columns {seen[n] + 1} and {k + 1}); "
                            "each column needs its own name.")
        seen[n] = k


def read_table(path: Path, *, string_columns: tuple[str, ...] = ()):
    """``(pyarrow.Table, TableFile)`` of the file at ``path``; ``string_columns`` are read as text, never as numbers
    (categorical codes). One :class:`DataError` line for a file that is too large, empty, header only, or has
    duplicate / unnamed columns."""
    fmt = table_format(path)
    sha, size = file_sha256(path)
    if fmt == "parquet":
        table = _read_parquet(path)
        delimiter = None
    else:
        table, delimiter = _read_csv(path, fmt, string_columns)
    if table.num_rows == 0:
        raise DataError(f"{path.name} has a header but no rows.")
    return table, TableFile(str(path), sha, size, fmt, delimiter)


def _read_csv(path: Path, fmt: str, string_columns: tuple[str, ...]):
    import pyarrow as pa

    with _open_text(path, fmt) as f:
        head = f.read(SNIFF_BYTES)
    sample = head.decode("utf-8-sig", errors="replace")
    if not sample.strip():
        raise DataError(f"{path.name} is empty.")
    if len(head) == SNIFF_BYTES and "\n" in sample:  # a cut last line would mislead the sniffer
        sample = sample[: sample.rfind("\n")]
    delimiter = sniff_delimiter(sample)
    header = next(csv.reader(io.StringIO(sample.splitlines()[0]), delimiter=delimiter))
    names = [h.strip() for h in header]
    _check_names(names, path.name)
    first = _stream_csv(path, fmt, names, delimiter, {c: "string" for c in string_columns if c in names}, 1)
    types = {}
    for f in first:  # the first block's inferred types, frozen for the rest of the file: an integer column
        t = f.type  # may hold a decimal further down, a column empty in the first block may hold text
        types[f.name] = ("double" if pa.types.is_integer(t) else
                         "string" if not (pa.types.is_floating(t) or pa.types.is_string(t)) else str(t))
    table = _stream_csv(path, fmt, names, delimiter, types, None)
    return table, delimiter


_CONVERSION = re.compile(r"In CSV column #(\d+): CSV conversion error to \w+: invalid value '(.*)'")


def _stream_csv(path: Path, fmt: str, names: list[str], delimiter: str, types: dict, max_batches: int | None):
    """Read the CSV block by block (a block's text is freed once parsed: the peak stays near the parsed table)
    with the given column types; ``max_batches`` 1: only the first block's schema (what Arrow infers)."""
    import pyarrow as pa
    from pyarrow import csv as pacsv

    batches, rows = [], 0
    try:
        # a plain file: Arrow reads it itself; a .csv.gz: through the capped stream
        with _open_text(path, fmt) if fmt == "csv.gz" else contextlib.nullcontext(str(path)) as f:
            with pacsv.open_csv(
                f,
                read_options=pacsv.ReadOptions(column_names=names, skip_rows=1, block_size=BLOCK_BYTES),
                parse_options=pacsv.ParseOptions(delimiter=delimiter, newlines_in_values=False),
                convert_options=pacsv.ConvertOptions(
                    null_values=list(NULL_VALUES), strings_can_be_null=True, quoted_strings_can_be_null=True,
                    column_types={c: pa.type_for_alias(t) for c, t in types.items()}),
            ) as reader:
                if max_batches == 1:
                    return reader.schema
                for batch in reader:
                    batches.append(batch)
                    rows += batch.num_rows
                return pa.Table.from_batches(batches, schema=reader.schema)
    except pa.ArrowInvalid as e:  # a row with the wrong number of cells, a bad quote, bad UTF-8, junk …
        m = _CONVERSION.search(str(e))
        utf8 = re.search(r"In CSV column #(\d+): CSV conversion error to string: invalid UTF8", str(e))
        if utf8 and int(utf8.group(1)) < len(names):
            raise DataError(f"{path.name} is not UTF-8 text (column {names[int(utf8.group(1))]!r}, at or after data "
                            f"row {rows + 1:,}); save it as UTF-8.") from e
        if m and int(m.group(1)) < len(names):
            raise DataError(f"column {names[int(m.group(1))]!r} is numeric in its first rows but holds "
                            f"{m.group(2)!r} further down (at or after data row {rows + 1:,}); fix it, or name the "
                            "column in data.categorical if it holds categories.") from e
        raise DataError(f"{path.name} is not a well-formed CSV table (delimiter {delimiter!r}): "
                        f"{str(e).splitlines()[0]}") from e


def _read_parquet(path: Path):
    import pyarrow as pa
    from pyarrow import parquet as pq

    try:
        pf = pq.ParquetFile(path)
        meta = pf.metadata
        stated = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        if stated > MAX_TABLE_BYTES:
            raise DataError(f"{path.name} states {stated:,} bytes of data, over the {MAX_TABLE_BYTES:,}-byte cap "
                            "of a table file.")
        names = list(pf.schema_arrow.names)
        if not names:
            raise DataError(f"{path.name} is empty.")
        _check_names(names, path.name)
        table = pf.read(use_pandas_metadata=False)
    except DataError:
        raise
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path.name} is not a readable Parquet file: {str(e).splitlines()[0]}") from e
    return table
