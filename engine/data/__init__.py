"""Dataset registry and loaders of the Privacy Imbalance Lab.

Public API::

    DataError, Dataset, DatasetInfo, LoadReport, DATASETS, data_dir, load_dataset, dataset_names, clear_cache

Files live in ``data_dir()/<folder>/`` (``mnist/``, ``cifar10/``, ``cifar100/``, ``adult/``,
``bank_marketing/``, ``credit_default/``, ``german_credit/``, ``law_school/``, ``utkface/``);
``digits`` needs none and ``adult`` falls back to the copy shipped in ``assets/adult/``.
Every known file is sha256-checked; CIFAR pickles are only unpickled after their tarball's
checksum matched. See the module docstrings of ``images``, ``cifar`` and ``tabular`` for the
exact preprocessing of each dataset.

Layer 1 of data → config → store → models → dp → train → audit → jobs → figures → tools → cli: the bottom; may import nothing else of the engine.
"""

import importlib

from .errors import DataError
from .files import data_dir

# The names below load their module (and torch with it) on first use (PEP 562), so what needs only DataError or
# data_dir — the store's lifecycle, the command line's --help, list and app — starts without importing torch.
_LAZY = {"Dataset": "base", "DatasetInfo": "base", "LoadReport": "base", "DATASETS": "registry",
         "clear_cache": "registry", "dataset_names": "registry", "load_dataset": "registry"}

__all__ = [
    "DataError",
    "Dataset",
    "DatasetInfo",
    "LoadReport",
    "DATASETS",
    "data_dir",
    "load_dataset",
    "dataset_names",
    "clear_cache",
]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value  # once: later lookups are plain module attributes
    return value
