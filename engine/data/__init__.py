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

from .base import Dataset, DatasetInfo, LoadReport
from .errors import DataError
from .files import data_dir
from .registry import DATASETS, clear_cache, dataset_names, load_dataset

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
