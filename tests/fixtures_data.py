"""Helpers that generate tiny data fixtures in the real on-disk formats (for tests/test_data.py).

* CIFAR-10 / CIFAR-100 python tarballs (pickled dicts with bytes keys inside a .tar.gz, same
  member names as the official archives).
* A tarball whose pickles would create a marker directory if they were ever unpickled.
* A UTKFace-style folder of real JPEGs (solid colours, so each image can be identified after loading).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np

CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
CIFAR100_FINE_NAMES = (
    "apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly camel can "
    "castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur dolphin "
    "elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster "
    "man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck "
    "pine_tree plain plate poppy porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk "
    "skyscraper snail snake spider squirrel streetcar sunflower sweet_pepper table tank telephone television tiger "
    "tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm"
).split()
assert len(CIFAR100_FINE_NAMES) == 100
CIFAR100_COARSE_NAMES = (
    "aquatic_mammals fish flowers food_containers fruit_and_vegetables household_electrical_devices "
    "household_furniture insects large_carnivores large_man-made_outdoor_things large_natural_outdoor_scenes "
    "large_omnivores_and_herbivores medium_mammals non-insect_invertebrates people reptiles small_mammals trees "
    "vehicles_1 vehicles_2"
).split()


def sha256_md5(path: Path) -> dict[str, str]:
    data = Path(path).read_bytes()
    return {"sha256": hashlib.sha256(data).hexdigest(), "md5": hashlib.md5(data).hexdigest()}


def write_tar_gz(path: Path, members: dict[str, bytes]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1234567890
            tf.addfile(info, io.BytesIO(data))
    path.write_bytes(gzip.compress(buf.getvalue(), mtime=0))
    return path


def _images(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 256, size=(n, 3 * 32 * 32), dtype=np.uint8)


def _batch(x: np.ndarray, label_key: bytes, labels, label: bytes, extra: dict | None = None) -> bytes:
    d = {
        b"batch_label": label,
        label_key: [int(v) for v in labels],
        b"data": x,
        b"filenames": [f"img_{i}.png".encode() for i in range(len(x))],
    }
    d.update(extra or {})
    return pickle.dumps(d, protocol=2)


def make_cifar10_tarball(path: Path, per_batch: int = 3, n_test: int = 5, seed: int = 0) -> dict:
    """Write a CIFAR-10-format tarball with 5 train batches of ``per_batch`` images and a test batch.
    Returns the expected uint8 arrays (N x 3 x 32 x 32) and labels."""
    rng = np.random.default_rng(seed)
    members, xs, ys = {}, [], []
    for i in range(1, 6):
        x = _images(rng, per_batch)
        y = rng.integers(0, 10, size=per_batch)
        members[f"cifar-10-batches-py/data_batch_{i}"] = _batch(x, b"labels", y, f"training batch {i} of 5".encode())
        xs.append(x)
        ys.append(y)
    xt = _images(rng, n_test)
    yt = rng.integers(0, 10, size=n_test)
    members["cifar-10-batches-py/test_batch"] = _batch(xt, b"labels", yt, b"testing batch 1 of 1")
    members["cifar-10-batches-py/batches.meta"] = pickle.dumps(
        {b"label_names": [n.encode() for n in CIFAR10_NAMES], b"num_cases_per_batch": per_batch, b"num_vis": 3072},
        protocol=2,
    )
    members["cifar-10-batches-py/readme.html"] = b"<html></html>"
    write_tar_gz(path, members)
    return {
        "x_train": np.concatenate(xs).reshape(-1, 3, 32, 32), "y_train": np.concatenate(ys),
        "x_test": xt.reshape(-1, 3, 32, 32), "y_test": yt,
    }


def make_cifar100_tarball(path: Path, fine_train, fine_test, seed: int = 0) -> dict:
    """Write a CIFAR-100-format tarball whose train/test batches have the given fine labels."""
    rng = np.random.default_rng(seed)
    fine_train, fine_test = np.asarray(fine_train), np.asarray(fine_test)
    x, xt = _images(rng, len(fine_train)), _images(rng, len(fine_test))
    coarse = {b"coarse_labels": [0] * len(fine_train)}
    members = {
        "cifar-100-python/meta": pickle.dumps(
            {b"fine_label_names": [n.encode() for n in CIFAR100_FINE_NAMES],
             b"coarse_label_names": [n.encode() for n in CIFAR100_COARSE_NAMES]}, protocol=2),
        "cifar-100-python/train": _batch(x, b"fine_labels", fine_train, b"training batch 1 of 1", coarse),
        "cifar-100-python/test": _batch(xt, b"fine_labels", fine_test, b"testing batch 1 of 1",
                                        {b"coarse_labels": [0] * len(fine_test)}),
    }
    write_tar_gz(path, members)
    return {"x_train": x.reshape(-1, 3, 32, 32), "y_train": fine_train,
            "x_test": xt.reshape(-1, 3, 32, 32), "y_test": fine_test}


class _MkdirOnUnpickle:
    """Pickles to a call of os.mkdir(marker): unpickling it would leave a visible side effect."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def make_malicious_cifar10_tarball(path: Path, marker: Path) -> Path:
    """A CIFAR-10-shaped tarball whose every member is a pickle that would create ``marker``."""
    blob = pickle.dumps({b"data": _MkdirOnUnpickle(marker), b"labels": []}, protocol=2)
    names = [f"cifar-10-batches-py/data_batch_{i}" for i in range(1, 6)] + [
        "cifar-10-batches-py/test_batch", "cifar-10-batches-py/batches.meta"]
    return write_tar_gz(path, {n: blob for n in names})


# UTKFace ------------------------------------------------------------------------------------
def utk_color(gender: int, race: int) -> tuple[int, int, int]:
    """A distinct solid colour per (gender, race) so a loaded image can be traced back."""
    return (40 + 170 * gender, 30 + 45 * race, 200 - 40 * race)


def make_utkface_folder(folder: Path) -> dict:
    """Create real JPEGs named like UTKFace plus malformed/unreadable files.
    Returns {"valid": [(name, gender, race)], "malformed": [...], "unreadable": [...]}."""
    from PIL import Image

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    valid = []
    specs = [(g, r) for g in (0, 1) for r in range(5)] + [(0, 0), (1, 2)]
    for i, (g, r) in enumerate(specs):
        name = f"{20 + i}_{g}_{r}_20170116174525{i:03d}.jpg" + (".chip.jpg" if i % 2 else "")
        sub = folder / "UTKFace" if i == 3 else folder
        sub.mkdir(exist_ok=True)
        size = (200, 200) if i % 3 else (61, 47)
        Image.new("RGB", size, utk_color(g, r)).save(sub / name, "JPEG", quality=95)
        valid.append((name, g, r))
    malformed = [
        "39_1_20170116174525125.jpg.chip.jpg",  # race missing (a known UTKFace glitch)
        "25_2_0_20170116174525125.jpg",  # gender 2 does not exist
        "25_0_7_20170116174525125.jpg",  # race 7 does not exist
        "abc.jpg",
        "notes.txt",
    ]
    for name in malformed:
        if name.endswith(".jpg"):
            Image.new("RGB", (32, 32), (0, 0, 0)).save(folder / name, "JPEG")
        else:
            (folder / name).write_text("not an image")
    unreadable = ["30_1_1_20170116174525999.jpg"]
    (folder / unreadable[0]).write_bytes(b"\xff\xd8 definitely not a jpeg")
    return {"valid": valid, "malformed": malformed, "unreadable": unreadable}
