"""A persistent cache of privacy plans, so that a plan seen before costs a look-up in any process (the Train page's
server, a standby worker, the CLI) instead of a search: a PLD or PRV plan takes seconds of ε evaluations.

Where: ``$PRIVACY_LAB_PLAN_CACHE`` (a file; ``off`` turns the cache off) else
``~/.cache/privacy-imbalance-lab/plans.sqlite``, beside the data cache (``engine.data.files.DEFAULT_DATA_DIR``).
One SQLite table: a key, the value as JSON text (never pickle), and when it was written. SQLite makes each write
atomic and lets several processes read and write at once; at most :data:`MAX_ENTRIES` rows are kept (the oldest
written go first). A file that is not a readable cache (corrupt, truncated, another format) is removed and
rebuilt; a cache that cannot be used at all (a read-only folder) is skipped: the plan is computed as without it.

The key is the SHA-256 of the request's every input (``kind`` and ``inputs``, canonical JSON) and of
:func:`fingerprint`: the source text of the accounting code and the versions of the libraries it calls, so that a
change of either can never serve a plan the code now would not make. The value is what the caller stored
(``Plan.to_dict()``); :mod:`engine.dp.accounting` checks that it answers the request before it returns it.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sqlite3
import threading
import time
from importlib import metadata
from pathlib import Path

ENV_VAR = "PRIVACY_LAB_PLAN_CACHE"
OFF = "off"
DEFAULT_PATH = Path("~/.cache/privacy-imbalance-lab/plans.sqlite")
MAX_ENTRIES = 4096
#: the files whose text a plan depends on (engine/dp/…), and the libraries whose versions
SOURCES = ("accounting.py", "accountants.py", "fast_rdp.py", "opacus_rdp.py", "plan_cache.py")
LIBRARIES = ("opacus", "dp-accounting", "numpy", "scipy")
_TIMEOUT_S = 10.0  # a writer waits this long for another process's write lock
_MEMORY_MAX = 512
# errors of a file that is a cache but cannot be used now (kept as it is, the plan computed without it)
_TRANSIENT = ("locked", "busy", "readonly", "unable to open", "disk I/O", "full")

_memory: dict = {}  # (path, key) → value: this process's hits without a query
_memory_lock = threading.Lock()  # the app server plans from several threads


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """SHA-256 of the accounting code's source text and of the installed accounting libraries' versions."""
    return fingerprint_of(Path(__file__).resolve().parent)


def fingerprint_of(folder: Path) -> str:
    """:func:`fingerprint` of the :data:`SOURCES` in ``folder``."""
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(name.encode() + b"\0" + (Path(folder) / name).read_bytes() + b"\0")
    for lib in LIBRARIES:
        try:
            version = metadata.version(lib)
        except metadata.PackageNotFoundError:
            version = "absent"
        h.update(f"{lib}=={version}\0".encode())
    return h.hexdigest()


def cache_path() -> Path | None:
    """The cache file, None when ``$PRIVACY_LAB_PLAN_CACHE`` is ``off`` (or the sources to fingerprint cannot be
    read, as in an install without them: no key could tell their versions apart)."""
    env = os.environ.get(ENV_VAR, "")
    if env.strip().lower() == OFF:
        return None
    try:
        fingerprint()
    except OSError:
        return None
    return Path(env or DEFAULT_PATH).expanduser()


def key(kind: str, inputs: dict, code: str | None = None) -> str:
    """The cache key of a request: its kind, every input, and the code's fingerprint (``code``, default
    :func:`fingerprint`)."""
    text = json.dumps({"kind": kind, "inputs": inputs, "code": fingerprint() if code is None else code},
                      sort_keys=True, allow_nan=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def get(kind: str, inputs: dict) -> dict | None:
    """The value stored for this request, or None (not stored, the cache off or unreadable)."""
    path = cache_path()
    if path is None:
        return None
    k = key(kind, inputs)
    hit = _memory.get((str(path), k))
    if hit is not None:
        return hit
    row = _with_db(path, lambda db: db.execute("SELECT value FROM plans WHERE key = ?", (k,)).fetchone())
    if not row:
        return None
    try:
        value = json.loads(row[0])
    except (TypeError, ValueError):  # a row that is not JSON: as if absent (the next put replaces it)
        return None
    if not isinstance(value, dict):
        return None
    _remember(str(path), k, value)
    return value


def put(kind: str, inputs: dict, value: dict) -> None:
    """Store ``value`` (JSON-serialisable) for this request, keeping at most :data:`MAX_ENTRIES` rows."""
    path = cache_path()
    if path is None:
        return
    k = key(kind, inputs)
    text = json.dumps(value, sort_keys=True, allow_nan=True)

    def write(db):
        with db:  # one transaction: the row and the trim together
            db.execute("INSERT OR REPLACE INTO plans (key, value, written) VALUES (?, ?, ?)", (k, text, time.time()))
            db.execute("DELETE FROM plans WHERE key IN (SELECT key FROM plans ORDER BY written DESC LIMIT -1 "
                       "OFFSET ?)", (MAX_ENTRIES,))

    _with_db(path, write)
    _remember(str(path), k, json.loads(text))


def clear_memory() -> None:
    """Forget this process's hits (the file stays): the planner bench's cold timings."""
    with _memory_lock:
        _memory.clear()


def _remember(path: str, k: str, value: dict) -> None:
    with _memory_lock:
        if len(_memory) >= _MEMORY_MAX:
            _memory.pop(next(iter(_memory)))
        _memory[(path, k)] = value


def _with_db(path: Path, action):
    """``action(connection)`` on the cache at ``path``, created if absent; a file that is not a cache is removed
    and made again once; None if the cache cannot be used (the plan is then computed without it)."""
    for attempt in (0, 1):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(str(path), timeout=_TIMEOUT_S)
        except (OSError, sqlite3.Error):
            return None
        try:
            db.execute("CREATE TABLE IF NOT EXISTS plans (key TEXT PRIMARY KEY, value TEXT NOT NULL, "
                       "written REAL NOT NULL)")
            return action(db)
        except sqlite3.DatabaseError as e:  # not a database, malformed, another table layout … or a busy file
            corrupt = not any(word in str(e) for word in _TRANSIENT)
        finally:
            db.close()
        if not corrupt or attempt:
            return None
        _remove(path)
    return None


def _remove(path: Path) -> None:
    for p in (path, path.with_name(path.name + "-journal"), path.with_name(path.name + "-wal"),
              path.with_name(path.name + "-shm")):
        try:
            p.unlink()
        except OSError:
            pass

