"""Image datasets: scikit-learn digits, MNIST (IDX files) and UTKFace (user folder of JPEGs).

Normalisation (documented in ``Dataset.meta["normalization"]``):

* digits: ``x / 16`` (pixel range of load_digits is 0..16); no mean/std step.
* MNIST: ``(x / 255 - 0.1307) / 0.3081``. Read from ``<data_dir>/mnist/``, else the shipped copy in
  ``assets/mnist/`` (checksum-verified like any data file), so MNIST works offline.
* UTKFace: ``(x / 255 - mean_c) / std_c`` with per-channel mean/std of the *training* split.
  Bad files in the folder are skipped and counted in ``Dataset.report`` (malformed names, images over
  :data:`UTK_MAX_PIXELS` or refused by Pillow as decompression bombs, unreadable files).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np

from .base import DataError, LoadReport, RawData
from .files import ASSETS_DIR, KNOWN_FILES, locate_files, read_verified

SPLIT_SEED = 0  # fixed seed of every train/test split made here


def channel_normalizer(mean, std, scale: float):
    """Return ``f(x) = (x / scale - mean[c]) / std[c]`` over axis 1 (channels), as float32."""
    mean = np.asarray(mean, dtype=np.float32).reshape(1, -1, 1, 1)
    std = np.asarray(std, dtype=np.float32).reshape(1, -1, 1, 1)

    def f(x: np.ndarray) -> np.ndarray:
        out = x.astype(np.float32)  # always a copy
        out *= np.float32(1.0 / scale)
        out -= mean
        out /= std
        return out

    return f


def split_stratified(n: int, y: np.ndarray, test_size: float = 0.2, seed: int = SPLIT_SEED):
    """Stratified train/test index split via sklearn (falls back to unstratified when a class is
    too small to stratify)."""
    from sklearn.model_selection import train_test_split

    idx = np.arange(n)
    try:
        tr, te = train_test_split(idx, test_size=test_size, stratify=y, random_state=seed)
    except ValueError:
        tr, te = train_test_split(idx, test_size=test_size, random_state=seed)
    return np.sort(tr), np.sort(te)


# --------------------------------------------------------------------------- digits
def load_digits_raw(root: Path) -> RawData:
    from sklearn.datasets import load_digits  # lazy: sklearn costs ~80 MB resident in an MNIST worker

    d = load_digits()
    x = d.data.astype(np.float32).reshape(-1, 1, 8, 8)
    y = d.target.astype(np.int64)
    tr, te = split_stratified(len(y), y)
    return RawData(
        x_train=x[tr], y_train=y[tr], x_test=x[te], y_test=y[te],
        class_names=[str(i) for i in range(10)],
        transform=channel_normalizer([0.0], [1.0], 16.0),
        meta={"normalization": {"scale": 16.0, "mean": [0.0], "std": [1.0]}},
    )


# --------------------------------------------------------------------------- MNIST
MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def parse_idx(raw: bytes, ndim: int, what: str = "IDX file") -> np.ndarray:
    """Parse an unsigned-byte IDX array (big-endian header: 0, 0, 0x08, ndim, then ndim uint32 dims)."""
    if len(raw) < 4 + 4 * ndim or raw[0:2] != b"\x00\x00" or raw[2] != 0x08 or raw[3] != ndim:
        raise DataError(f"{what} is not a {ndim}-d unsigned-byte IDX file (bad header {raw[:4]!r}).")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    offset = 4 + 4 * ndim
    if len(raw) - offset != int(np.prod(dims)):
        raise DataError(f"{what}: header says {dims} but the file holds {len(raw) - offset} bytes of data.")
    return np.frombuffer(raw, dtype=np.uint8, offset=offset).reshape(dims)


def load_mnist_raw(root: Path) -> RawData:
    kfs = [KNOWN_FILES[f"mnist/{n}"] for n in MNIST_FILES]
    paths = locate_files("mnist", root, "mnist", kfs, fallback_dirs=(ASSETS_DIR / "mnist",))
    xtr, ytr, xte, yte = (
        parse_idx(read_verified(p, kf), 3 if "images" in kf.name else 1, str(p)) for p, kf in zip(paths, kfs)
    )
    for x, y, split in ((xtr, ytr, "train"), (xte, yte, "test")):
        if len(x) != len(y) or x.shape[1:] != (28, 28):
            raise DataError(f"MNIST {split}: {x.shape} images but {len(y)} labels.")
    return RawData(
        x_train=xtr.reshape(-1, 1, 28, 28), y_train=ytr.astype(np.int64),
        x_test=xte.reshape(-1, 1, 28, 28), y_test=yte.astype(np.int64),
        class_names=[str(i) for i in range(10)],
        transform=channel_normalizer([MNIST_MEAN], [MNIST_STD], 255.0),
        meta={"normalization": {"scale": 255.0, "mean": [MNIST_MEAN], "std": [MNIST_STD]}},
    )


# --------------------------------------------------------------------------- UTKFace
# "[age]_[gender]_[race]_[date&time].jpg"; the aligned&cropped release appends ".chip.jpg".
UTK_PATTERN = re.compile(r"^(\d{1,3})_([01])_([0-4])_(\d{8,17})\.jpg(?:\.chip\.jpg)?$", re.IGNORECASE)
UTK_RACES = ("White", "Black", "Asian", "Indian", "Others")
UTK_GENDERS = ("male", "female")
UTK_SIZE = 32
UTK_MAX_PIXELS = 4096 * 4096  # a UTKFace image is 200x200; anything this large is refused before decoding


def parse_utk_name(name: str) -> tuple[int, int, int] | None:
    """``(age, gender, race)`` from a UTKFace file name, or None if the name is malformed."""
    m = UTK_PATTERN.match(name)
    if not m:
        return None
    age = int(m.group(1))
    if age > 130:
        return None
    return age, int(m.group(2)), int(m.group(3))


def load_utkface_raw(root: Path) -> RawData:
    folder = Path(root) / "utkface"
    if not folder.is_dir():
        raise DataError(
            f"Dataset 'utkface' needs a folder of UTKFace images at {folder}/ "
            "(files named [age]_[gender]_[race]_[date].jpg, e.g. from the 'Aligned&Cropped Faces' "
            "release, https://susanqq.github.io/UTKFace/). It is not downloaded automatically."
        )
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError as e:  # pragma: no cover - Pillow usually comes with matplotlib
        raise DataError("Dataset 'utkface' needs Pillow to read JPEGs: pip install pillow") from e

    images, genders, races = [], [], []
    skipped: dict[str, list[str]] = {"malformed_name": [], "decompression_bomb": [], "unreadable": []}
    for p in sorted(q for q in folder.rglob("*") if q.is_file()):
        parsed = parse_utk_name(p.name)
        if parsed is None:
            skipped["malformed_name"].append(p.name)
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                with Image.open(p) as im:  # reads the header only
                    if im.width * im.height > UTK_MAX_PIXELS:
                        raise Image.DecompressionBombError(f"{im.width}x{im.height} pixels")
                    im.draft("RGB", (2 * UTK_SIZE, 2 * UTK_SIZE))  # fast JPEG DCT downscale
                    arr = np.asarray(im.convert("RGB").resize((UTK_SIZE, UTK_SIZE), Image.BILINEAR),
                                     dtype=np.uint8)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            skipped["decompression_bomb"].append(p.name)
            continue
        except (OSError, UnidentifiedImageError, ValueError, SyntaxError, MemoryError):
            skipped["unreadable"].append(p.name)
            continue
        images.append(arr.transpose(2, 0, 1))
        genders.append(parsed[1])
        races.append(parsed[2])
    report = LoadReport.from_counts({k: len(v) for k, v in skipped.items()},
                                    [n for v in skipped.values() for n in v], folder)
    if len(images) < 2:
        raise DataError(
            f"Dataset 'utkface': found {len(images)} usable image(s) in {folder}/ "
            f"({report if report.skipped else 'no other files'}). "
            "Expected JPEGs named [age]_[gender]_[race]_[date].jpg."
        )
    x = np.stack(images)
    y = np.asarray(genders, dtype=np.int64)
    race = np.asarray([UTK_RACES[r] for r in races])
    tr, te = split_stratified(len(y), y)
    mean = x[tr].mean(axis=(0, 2, 3)) / 255.0
    std = x[tr].std(axis=(0, 2, 3)) / 255.0
    std = np.where(std > 1e-6, std, 1.0)
    return RawData(
        x_train=x[tr], y_train=y[tr], x_test=x[te], y_test=y[te],
        class_names=list(UTK_GENDERS),
        sensitive_train={"race": race[tr]}, sensitive_test={"race": race[te]},
        transform=channel_normalizer(mean, std, 255.0),
        meta={
            "normalization": {"scale": 255.0, "mean": mean.tolist(), "std": std.tolist()},
            "n_images": len(images),
            "n_malformed_names": report.count("malformed_name"),
            "malformed_examples": skipped["malformed_name"][:10],
            "n_unreadable": report.count("unreadable"),
            "n_decompression_bombs": report.count("decompression_bomb"),
        },
        report=report,
    )
