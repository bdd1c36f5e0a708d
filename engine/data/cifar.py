"""CIFAR-10 / CIFAR-100 / CIFAR-100-FV from the official python-pickle tarballs.

Safety: the tarball is read into memory and its sha256 (and md5) are compared with
:data:`CIFAR_CHECKSUMS` *before* any member is unpickled; on a mismatch nothing is unpickled.
The checksum table can only be replaced through the explicit ``checksums=`` argument of
:func:`read_cifar_tarball` or by patching this module-level dict (tests do that with fixture
tarballs) - never through environment variables or user files. As a second layer the unpickler
only resolves the few globals a CIFAR batch needs (numpy array reconstruction).

Normalisation: ``(x / 255 - mean_c) / std_c`` with the standard per-channel statistics
(CIFAR-10: mean 0.4914, 0.4822, 0.4465, std 0.2470, 0.2435, 0.2616; CIFAR-100 and FV:
mean 0.5071, 0.4865, 0.4409, std 0.2673, 0.2564, 0.2762).
"""

from __future__ import annotations

import functools
import hashlib
import io
import pickle
import tarfile
from pathlib import Path

import numpy as np

from .base import RawData
from .errors import DataError
from .files import KnownFile, locate_files, read_capped
from .images import channel_normalizer

CIFAR10_FILE = "cifar-10-python.tar.gz"
CIFAR100_FILE = "cifar-100-python.tar.gz"

# Canonical checksums (md5 as listed by torchvision, sha256 as pinned by keras.datasets).
CIFAR_CHECKSUMS: dict[str, dict[str, str]] = {
    CIFAR10_FILE: {
        "sha256": "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
        "md5": "c58f30108f718f92721af3b95e74349a",
        "url": "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    },
    CIFAR100_FILE: {
        "sha256": "85cd44d02ba6437773c5bbd22e183051d648de2e7d6b014e1ef29b855ba677a7",
        "md5": "eb9058c3a382ffc7106e4002c42a8d85",
        "url": "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
    },
}

CIFAR10_MEMBERS = tuple(f"cifar-10-batches-py/data_batch_{i}" for i in range(1, 6)) + (
    "cifar-10-batches-py/test_batch",
    "cifar-10-batches-py/batches.meta",
)
CIFAR100_MEMBERS = ("cifar-100-python/train", "cifar-100-python/test", "cifar-100-python/meta")
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)

# CIFAR-100 fine labels of the "fish" and "vehicles 1" superclasses -> FV labels 0..9
FV_FINE_LABELS = (73, 32, 67, 91, 1, 8, 58, 90, 13, 48)

_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): ("numpy._core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"): ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"): ("numpy", "ndarray"),
    ("numpy", "dtype"): ("numpy", "dtype"),
    ("_codecs", "encode"): ("_codecs", "encode"),  # bytes written by Python 3 at protocol 2
}


class _CifarUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        target = _ALLOWED_GLOBALS.get((module, name))
        if target is None:
            raise pickle.UnpicklingError(f"CIFAR batch references forbidden global {module}.{name}")
        return super().find_class(*target)


def _unpickle(data: bytes):
    """Unpickle one CIFAR batch (bytes keys, as pickle.load(..., encoding="bytes"))."""
    return _CifarUnpickler(io.BytesIO(data), encoding="bytes").load()


def verify_tarball(data: bytes, filename: str, checksums: dict[str, dict[str, str]] | None = None) -> None:
    """Raise :class:`DataError` unless ``data`` matches the pinned checksums of ``filename``."""
    table = CIFAR_CHECKSUMS if checksums is None else checksums
    entry = table.get(filename)
    if not entry or not entry.get("sha256"):
        raise DataError(f"No pinned checksum for {filename}; refusing to unpickle it.")
    sha = hashlib.sha256(data).hexdigest()
    if sha != entry["sha256"]:
        raise DataError(
            f"Checksum mismatch for {filename}: sha256 {sha}, expected {entry['sha256']}. "
            "Refusing to unpickle it. Delete the file and download the original"
            + (f" from {entry['url']}." if entry.get("url") else ".")
        )
    if entry.get("md5"):
        md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
        if md5 != entry["md5"]:
            raise DataError(
                f"Checksum mismatch for {filename}: md5 {md5}, expected {entry['md5']}. Refusing to unpickle it."
            )


def read_cifar_tarball(
    path: str | Path, members: tuple[str, ...], checksums: dict[str, dict[str, str]] | None = None
) -> dict[str, dict]:
    """Verify the tarball at ``path`` and return ``{member: unpickled dict}`` for ``members``."""
    path = Path(path)
    data = read_capped(path)  # refused before reading when larger than any data file can be
    verify_tarball(data, path.name, checksums)  # BEFORE anything is decompressed or unpickled
    wanted = set(members)
    raw: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|gz") as tf:
            for m in tf:
                if m.name in wanted and m.isfile():
                    f = tf.extractfile(m)
                    if f is not None:
                        raw[m.name] = f.read()
    except (tarfile.TarError, OSError, EOFError) as e:
        raise DataError(f"{path} is not a readable .tar.gz archive ({e}).") from e
    missing = [m for m in members if m not in raw]
    if missing:
        raise DataError(f"{path} lacks the member(s) {', '.join(missing)}; is it the python version of CIFAR?")
    out = {}
    for name in members:
        try:
            obj = _unpickle(raw[name])
        except Exception as e:
            raise DataError(f"Cannot parse {name} inside {path}: {e}") from e
        if not isinstance(obj, dict):
            raise DataError(f"{name} inside {path} is not a CIFAR batch dict.")
        out[name] = obj
    return out


def _batch_arrays(batch: dict, label_key: bytes, where: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        x = np.asarray(batch[b"data"])
        y = np.asarray(batch[label_key], dtype=np.int64)
    except KeyError as e:
        raise DataError(f"{where}: missing key {e.args[0]!r}.") from e
    if x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3 * 32 * 32 or len(y) != len(x):
        raise DataError(f"{where}: unexpected data {x.dtype} {x.shape} / {len(y)} labels.")
    return x.reshape(-1, 3, 32, 32), y


def _names(meta: dict, key: bytes, n: int, default: list[str] | None = None) -> list[str]:
    vals = meta.get(key)
    if isinstance(vals, (list, tuple)) and len(vals) == n:
        return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in vals]
    if default is not None:
        return list(default)
    return [str(i) for i in range(n)]


def _cifar_path(root: Path, dataset: str, folder: str, filename: str) -> Path:
    entry = CIFAR_CHECKSUMS.get(filename, {})
    kf = KnownFile(filename, entry.get("sha256", ""), url=entry.get("url"), info_url=entry.get("url"))
    return locate_files(dataset, root, folder, [kf])[0]


@functools.lru_cache(maxsize=1)
def _parsed(path: str, mtime_ns: int, size: int, members: tuple[str, ...], sha: str, md5: str) -> dict:
    return read_cifar_tarball(path, members)


def _read(path: Path, members: tuple[str, ...]) -> dict:
    st = path.stat()
    e = CIFAR_CHECKSUMS.get(path.name, {})
    return _parsed(str(path), st.st_mtime_ns, st.st_size, members, e.get("sha256", ""), e.get("md5", ""))


def _norm_meta(mean, std) -> dict:
    return {"normalization": {"scale": 255.0, "mean": list(mean), "std": list(std)}}


def load_cifar10_raw(root: Path) -> RawData:
    path = _cifar_path(root, "cifar10", "cifar10", CIFAR10_FILE)
    b = _read(path, CIFAR10_MEMBERS)
    parts = [_batch_arrays(b[m], b"labels", m) for m in CIFAR10_MEMBERS[:5]]
    xte, yte = _batch_arrays(b[CIFAR10_MEMBERS[5]], b"labels", CIFAR10_MEMBERS[5])
    xtr = np.concatenate([p[0] for p in parts])
    ytr = np.concatenate([p[1] for p in parts])
    names = _names(b[CIFAR10_MEMBERS[6]], b"label_names", 10, CIFAR10_CLASSES)
    _check_labels(ytr, yte, 10, path)
    return RawData(
        x_train=xtr, y_train=ytr, x_test=xte, y_test=yte, class_names=names,
        transform=channel_normalizer(CIFAR10_MEAN, CIFAR10_STD, 255.0),
        meta=_norm_meta(CIFAR10_MEAN, CIFAR10_STD),
    )


def _cifar100_arrays(root: Path, dataset: str):
    path = _cifar_path(root, dataset, "cifar100", CIFAR100_FILE)
    b = _read(path, CIFAR100_MEMBERS)
    xtr, ytr = _batch_arrays(b[CIFAR100_MEMBERS[0]], b"fine_labels", CIFAR100_MEMBERS[0])
    xte, yte = _batch_arrays(b[CIFAR100_MEMBERS[1]], b"fine_labels", CIFAR100_MEMBERS[1])
    _check_labels(ytr, yte, 100, path)
    names = _names(b[CIFAR100_MEMBERS[2]], b"fine_label_names", 100)
    return xtr, ytr, xte, yte, names


def _check_labels(ytr, yte, k, path):
    for y in (ytr, yte):
        if len(y) and (y.min() < 0 or y.max() >= k):
            raise DataError(f"{path}: labels outside 0..{k - 1}.")


def load_cifar100_raw(root: Path) -> RawData:
    xtr, ytr, xte, yte, names = _cifar100_arrays(root, "cifar100")
    return RawData(
        x_train=xtr, y_train=ytr, x_test=xte, y_test=yte, class_names=names,
        transform=channel_normalizer(CIFAR100_MEAN, CIFAR100_STD, 255.0),
        meta=_norm_meta(CIFAR100_MEAN, CIFAR100_STD),
    )


def load_cifar100_fv_raw(root: Path) -> RawData:
    xtr, ytr, xte, yte, names = _cifar100_arrays(root, "cifar100_fv")
    lut = np.full(100, -1, dtype=np.int64)
    lut[list(FV_FINE_LABELS)] = np.arange(len(FV_FINE_LABELS))
    mtr, mte = lut[ytr] >= 0, lut[yte] >= 0
    return RawData(
        x_train=xtr[mtr], y_train=lut[ytr[mtr]], x_test=xte[mte], y_test=lut[yte[mte]],
        class_names=[names[i] for i in FV_FINE_LABELS],
        transform=channel_normalizer(CIFAR100_MEAN, CIFAR100_STD, 255.0),
        meta={**_norm_meta(CIFAR100_MEAN, CIFAR100_STD), "fine_labels": list(FV_FINE_LABELS),
              "superclasses": {"fish": [0, 1, 2, 3, 4], "vehicles 1": [5, 6, 7, 8, 9]}},
    )
