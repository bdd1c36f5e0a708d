"""How array artifacts are stored: ``np.save`` bytes, read back without ever unpickling."""
from __future__ import annotations

import io

import numpy as np


def npy_bytes(arr) -> bytes:
    """An array as ``.npy`` bytes (no pickled objects)."""
    buf = io.BytesIO()
    np.save(buf, np.asarray(arr), allow_pickle=False)
    return buf.getvalue()


def load_array(blob: bytes) -> np.ndarray:
    """Inverse of :func:`npy_bytes` (never unpickles)."""
    return np.load(io.BytesIO(blob), allow_pickle=False)
