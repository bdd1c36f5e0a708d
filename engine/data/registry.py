"""Dataset registry, :func:`load_dataset` and its in-process caches."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from . import cifar, images, tabular
from .base import DataError, Dataset, DatasetInfo, RawData
from .files import data_dir as _resolve_data_dir
from .files import fingerprint

_UCI_LICENSE = "CC BY 4.0 (UCI)"


def _tabular(loader_name: str):
    """A tabular loader (``engine.data.tabular`` imports pandas + scikit-learn, ~190 MB resident, only inside its
    loaders: an image-only training worker does not pay for them)."""
    return getattr(tabular, loader_name)

DATASETS: dict[str, DatasetInfo] = {
    info.name: info
    for info in [
        DatasetInfo(
            "digits", "image", "scikit-learn's bundled 8x8 handwritten digits (1797 images, 10 classes); "
            "stratified 80/20 split, pixels x/16.",
            images.load_digits_raw, (), None, None, (), True,
            "sklearn.datasets.load_digits (UCI Optical Recognition of Handwritten Digits)", "CC BY 4.0", 10,
        ),
        DatasetInfo(
            "mnist", "image", "MNIST handwritten digits, 60000/10000, 1x28x28, (x/255-0.1307)/0.3081.",
            images.load_mnist_raw, (), None, "mnist", images.MNIST_FILES, True,
            "LeCun, Cortes & Burges, http://yann.lecun.com/exdb/mnist/ (copy shipped in assets/mnist/)",
            "none stated (commonly CC BY-SA 3.0)", 10,
        ),
        DatasetInfo(
            "cifar10", "image", "CIFAR-10, 50000/10000, 3x32x32, 10 classes, per-channel standardised.",
            cifar.load_cifar10_raw, (), None, "cifar10", (cifar.CIFAR10_FILE,), False,
            "Krizhevsky 2009, https://www.cs.toronto.edu/~kriz/cifar.html", "none stated", 10,
        ),
        DatasetInfo(
            "cifar100", "image", "CIFAR-100 (fine labels), 50000/10000, 3x32x32, 100 classes.",
            cifar.load_cifar100_raw, (), None, "cifar100", (cifar.CIFAR100_FILE,), False,
            "Krizhevsky 2009, https://www.cs.toronto.edu/~kriz/cifar.html", "none stated", 100,
        ),
        DatasetInfo(
            "cifar100_fv", "image", "CIFAR-100 subset 'fish' (labels 0-4) + 'vehicles 1' (labels 5-9), "
            "5000/1000, 3x32x32.",
            cifar.load_cifar100_fv_raw, (), None, "cifar100", (cifar.CIFAR100_FILE,), False,
            "Krizhevsky 2009, https://www.cs.toronto.edu/~kriz/cifar.html", "none stated", 10,
        ),
        DatasetInfo(
            "adult", "tabular", "UCI Adult census income (>50K = 1), official split, rows with '?' dropped: "
            "30162/15060.",
            _tabular("load_adult_raw"), ("sex", "race"), "sex", "adult", ("adult.data.gz", "adult.test.gz"), True,
            "Becker & Kohavi 1996, https://doi.org/10.24432/C5XW20 (copy shipped in assets/adult/)",
            _UCI_LICENSE, 2,
        ),
        DatasetInfo(
            "bank", "tabular", "UCI Bank Marketing (bank-full, 45211 rows; term deposit y=yes = 1).",
            _tabular("load_bank_raw"), ("age_group",), "age_group", "bank_marketing", ("bank-full.csv.gz",), False,
            "Moro, Rita & Cortez 2014, https://doi.org/10.24432/C5K306", _UCI_LICENSE, 2,
        ),
        DatasetInfo(
            "credit_default", "tabular", "UCI Default of Credit Card Clients (30000 rows; default next month = 1).",
            _tabular("load_credit_default_raw"), ("sex",), "sex", "credit_default",
            ("default_of_credit_card_clients.csv.gz",), False,
            "Yeh & Lien 2009, https://doi.org/10.24432/C55S3H", _UCI_LICENSE, 2,
        ),
        DatasetInfo(
            "german_credit", "tabular", "UCI Statlog German Credit (1000 rows; bad credit = 1).",
            _tabular("load_german_credit_raw"), ("sex", "age_group"), "sex", "german_credit", ("german.data.gz",),
            False, "Hofmann 1994, https://doi.org/10.24432/C5NC77", _UCI_LICENSE, 2,
        ),
        DatasetInfo(
            "law_school", "tabular", "LSAC law school (Kusner et al. 2017 law_data.csv, 21791 rows; passed "
            "the bar on the first try = 1).",
            _tabular("load_law_school_raw"), ("race", "sex"), "race", "law_school", ("law_data.csv.gz",), False,
            "Wightman 1998 (LSAC); Kusner et al. 2017, https://github.com/mkusner/counterfactual-fairness",
            "none stated", 2,
        ),
        DatasetInfo(
            "utkface", "image", "UTKFace faces from a user folder, 3x32x32; label = gender "
            "(0 male, 1 female), sensitive = race.",
            images.load_utkface_raw, ("race",), "race", "utkface", (), False,
            "Zhang, Song & Qi 2017, https://susanqq.github.io/UTKFace/", "non-commercial research only", 2,
        ),
    ]
}


def dataset_names() -> list[str]:
    """Names of all registered datasets, in registry order."""
    return list(DATASETS)


def _info(name: str) -> DatasetInfo:
    info = DATASETS.get(name) if isinstance(name, str) else None
    if info is None:
        raise DataError(f"Unknown dataset {name!r}. Known datasets: {', '.join(DATASETS)}.")
    return info


def subsample_indices(y: np.ndarray, max_train: int, seed: int) -> np.ndarray | None:
    """Sorted indices of a deterministic stratified subsample of size ``max_train`` (None = keep all)."""
    from sklearn.model_selection import train_test_split

    n = len(y)
    if max_train >= n:
        return None
    idx = np.arange(n)
    try:
        sel, _ = train_test_split(idx, train_size=max_train, stratify=y, random_state=seed)
    except ValueError:  # a class too small to stratify, or max_train < number of classes
        sel = np.random.default_rng(seed).choice(n, size=max_train, replace=False)
    return np.sort(sel)


def _to_tensor(x: np.ndarray, transform) -> torch.Tensor:
    x = transform(x) if transform is not None else np.array(x, dtype=np.float32, copy=True)
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))


@functools.lru_cache(maxsize=3)
def _full_cached(name: str, root: str, fp: tuple) -> Dataset:
    """The whole dataset as tensors (one copy per dataset/folder/file identity)."""
    info = DATASETS[name]
    raw: RawData = info.loader(Path(root))
    return Dataset(
        name=name,
        x_train=_to_tensor(raw.x_train, raw.transform),
        y_train=torch.from_numpy(np.array(raw.y_train, dtype=np.int64)),
        x_test=_to_tensor(raw.x_test, raw.transform),
        y_test=torch.from_numpy(np.array(raw.y_test, dtype=np.int64)),
        class_names=list(raw.class_names),
        sensitive_train={k: np.array(v, dtype=str) for k, v in raw.sensitive_train.items()},
        sensitive_test={k: np.array(v, dtype=str) for k, v in raw.sensitive_test.items()},
        default_sensitive=info.default_sensitive,
        kind=info.kind,
        feature_names=list(raw.feature_names),
        meta={**raw.meta, "seed": None, "max_train": None, "data_dir": root},
        report=raw.report,
    )


@functools.lru_cache(maxsize=8)
def _load_cached(name: str, root: str, fp: tuple, seed: int, max_train: int | None) -> Dataset:
    full = _full_cached(name, root, fp)
    sel = None if max_train is None else subsample_indices(full.y_train.numpy(), max_train, seed)
    if sel is None:
        return full
    t = torch.from_numpy(sel)
    return Dataset(
        name=name,
        x_train=full.x_train[t],
        y_train=full.y_train[t],
        x_test=full.x_test,  # shared with the full dataset (read-only)
        y_test=full.y_test,
        class_names=list(full.class_names),
        sensitive_train={k: v[sel] for k, v in full.sensitive_train.items()},
        sensitive_test=dict(full.sensitive_test),
        default_sensitive=full.default_sensitive,
        kind=full.kind,
        feature_names=list(full.feature_names),
        meta={**full.meta, "seed": seed, "max_train": max_train, "train_indices": sel},
        report=full.report,
    )


def load_dataset(
    name: str, *, data_dir: str | None = None, seed: int = 0, max_train: int | None = None
) -> Dataset:
    """Load a registered dataset (see :data:`DATASETS`).

    ``data_dir``: root data folder (else ``$PRIVACY_LAB_DATA_DIR``, else ~/.cache/privacy-imbalance-lab/data).
    ``max_train``: keep a deterministic stratified subsample of that many training rows, chosen
    with ``seed`` (``seed`` affects nothing else: train/test splits are fixed).
    Results are cached in-process per (name, data folder, file identity, seed, max_train); the
    returned object is shared, so treat its tensors as read-only.
    Raises :class:`DataError` with a user-facing message on any problem.
    """
    info = _info(name)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise DataError(f"seed must be an integer, got {seed!r}.")
    if max_train is not None:
        if isinstance(max_train, bool) or not isinstance(max_train, (int, np.integer)) or max_train < 1:
            raise DataError(f"max_train must be a positive integer or None, got {max_train!r}.")
        max_train = int(max_train)
    root = _resolve_data_dir(data_dir)
    try:
        return _load_cached(name, str(root), fingerprint(info, root), int(seed), max_train)
    except DataError:
        raise
    except MemoryError as e:
        raise DataError(f"Not enough memory to load dataset {name!r}.") from e


def clear_cache() -> None:
    """Drop every in-process dataset cache (not the files)."""
    _load_cached.cache_clear()
    _full_cached.cache_clear()
    cifar._parsed.cache_clear()
