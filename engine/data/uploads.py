"""A table uploaded through the browser, stored once under its hash in the data folder, and the check that a
recorded table is still the same file (``rerun``).

* :func:`store_upload`: the bytes go to ``<data dir>/uploads/<sha256>.<ext>`` (the name the user gave is used for
  its extension only, so nothing is ever written outside that folder); the same bytes uploaded twice are one file.
  At most :data:`MAX_UPLOAD_BYTES` (the table cap: a page states it by the upload box).
* :func:`table_changed`: one line when the file a run recorded no longer has the recorded sha256, else None.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .errors import DataError
from .files import data_dir as _resolve_data_dir
from .table_file import MAX_TABLE_BYTES, file_sha256, resolve_table_path, table_format

MAX_UPLOAD_BYTES = MAX_TABLE_BYTES
UPLOADS_FOLDER = "uploads"
_SUFFIX = {"csv": ".csv", "csv.gz": ".csv.gz", "parquet": ".parquet"}


def store_upload(data: bytes, name: str, data_dir=None) -> str:
    """Store an uploaded table; returns its path relative to the data folder (what ``data.file`` records)."""
    fmt = table_format(Path(Path(str(name)).name or "upload"))  # one DataError line for another kind of file
    if len(data) > MAX_UPLOAD_BYTES:
        raise DataError(f"{Path(str(name)).name} is {len(data):,} bytes, over the {MAX_UPLOAD_BYTES:,}-byte cap of "
                        "an uploaded table.")
    if not data:
        raise DataError(f"{Path(str(name)).name} is empty.")
    sha = hashlib.sha256(data).hexdigest()
    relative = f"{UPLOADS_FOLDER}/{sha}{_SUFFIX[fmt]}"
    dest = _resolve_data_dir(data_dir) / relative
    if dest.is_file() and dest.stat().st_size == len(data):
        return relative  # stored before: the name is its hash
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(f".{dest.name}.part{os.getpid()}")
        part.write_bytes(data)
        os.replace(part, dest)  # atomic: a reader sees the whole file or none
    except OSError as e:
        raise DataError(f"Cannot store the upload in {dest.parent}: {e}") from e
    return relative


def table_changed(file: str, recorded_sha256: str, data_dir=None) -> str | None:
    """None when ``file`` still holds the bytes a run recorded; else the one line that says what changed."""
    try:
        path = resolve_table_path(file, data_dir)
    except DataError as e:
        return f"the run's table is gone: {e}"
    sha, size = file_sha256(path)
    if sha == recorded_sha256:
        return None
    return (f"the run's table {file} changed since the run: its sha256 is now {sha[:16]}… ({size:,} bytes), the run "
            f"recorded {recorded_sha256[:16]}…")
