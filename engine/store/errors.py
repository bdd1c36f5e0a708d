"""The run store's one error type and its one-line messages (what failed, which file, what to do)."""
from __future__ import annotations

import os
from pathlib import Path


class StoreError(Exception):
    """The run store cannot be opened, read or written. The message is one line that names the file
    and says what to do; show it as is (CLI: ``error: ...``, exit 2; UI: ``st.error``)."""

    def __init__(self, message: str, path: str | os.PathLike | None = None):
        super().__init__(message)
        self.path = None if path is None else Path(path)


def store_error(path: Path, e: BaseException) -> StoreError:
    """One clear line for an SQLite / OS failure on the store at ``path``."""
    text = str(e) or type(e).__name__
    low = text.lower()
    if "not a database" in low or "malformed" in low or "corrupt" in low:
        msg = (f"run store {path} is damaged ({text}): move it aside or restore it from a backup; "
               "a new run creates a fresh store at that path")
    elif "readonly" in low or "read-only" in low:
        msg = f"run store {path} is read-only ({text}): make the file and its folder writable, or pass another --store"
    elif "full" in low or getattr(e, "errno", None) == 28:
        msg = f"run store {path}: the disk is full ({text}): free some space and run again"
    elif "disk i/o" in low:
        msg = f"run store {path}: disk I/O error ({text}): check that the disk is not full or failing, then run again"
    elif "locked" in low or "busy" in low:
        msg = f"run store {path} is locked by another process ({text}): wait for it to finish and try again"
    elif "unable to open" in low and path.exists() and not (os.access(path, os.W_OK)
                                                            and os.access(path.parent, os.W_OK)):
        msg = (f"run store {path} is read-only ({text}): make the file and its folder writable, or pass another "
               "--store (list, show and export can still read it)")
    elif "unable to open" in low or isinstance(e, OSError):
        msg = (f"cannot open run store {path} ({text}): check that it is a readable file in an existing, "
               "accessible folder, or pass another --store")
    else:
        msg = f"run store {path}: {type(e).__name__}: {text}"
    return StoreError(msg, path)
