"""Core types of the dataset layer: :class:`Dataset`, :class:`DatasetInfo`, :class:`LoadReport`
(and :class:`DataError`, defined in :mod:`engine.data.errors`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .errors import DataError
from .files import data_dir as _resolve_data_dir
from .files import dataset_files_present

__all__ = ["DataError", "Dataset", "DatasetInfo", "LoadReport", "RawData"]

# reason -> (singular, plural) as shown to the user
SKIP_REASONS = {
    "malformed_name": ("malformed name", "malformed names"),
    "decompression_bomb": ("decompression bomb", "decompression bombs"),
    "unreadable": ("unreadable file", "unreadable files"),
}


@dataclass(frozen=True)
class LoadReport:
    """Files a loader skipped (one bad file never stops a folder dataset), counted per reason.

    ``str(report)`` is the line shown to the user (CLI: a ``note:`` on stderr; UI: ``st.info``),
    e.g. ``skipped 3 files in /data/utkface: 2 malformed names, 1 decompression bomb``.
    """

    skipped: tuple[tuple[str, int], ...] = ()  # (reason, count), reasons from SKIP_REASONS, count > 0
    examples: tuple[str, ...] = ()  # a few skipped file names
    folder: str | None = None

    @classmethod
    def from_counts(cls, counts: dict[str, int], examples=(), folder=None) -> "LoadReport":
        return cls(tuple((k, int(n)) for k, n in counts.items() if n), tuple(examples)[:10],
                   None if folder is None else str(folder))

    @property
    def total(self) -> int:
        return sum(n for _, n in self.skipped)

    def count(self, reason: str) -> int:
        return dict(self.skipped).get(reason, 0)

    def __str__(self) -> str:
        if not self.skipped:
            return "no files skipped"
        parts = ", ".join(f"{n} {SKIP_REASONS.get(r, (r, r))[n != 1]}" for r, n in self.skipped)
        where = f" in {self.folder}" if self.folder else ""
        return f"skipped {self.total} file{'s' if self.total != 1 else ''}{where}: {parts}"

    def to_dict(self) -> dict:
        return {"skipped": dict(self.skipped), "examples": list(self.examples), "folder": self.folder}


@dataclass(eq=False)
class Dataset:
    """A loaded dataset, already split and preprocessed.

    * Images: ``x`` is float32 ``N x C x H x W``, scaled to [0, 1] and then normalised per
      channel with the constants in ``meta["normalization"]`` (``(x - mean) / std``).
    * Tabular: ``x`` is float32 ``N x D`` (one-hot categoricals + standard-scaled numerics,
      preprocessing fitted on the full training split only; names in ``feature_names``).
    * ``y`` is int64 with values ``0 .. num_classes-1``.
    * ``sensitive_*`` map an attribute name to a string array aligned with the rows.

    Instances returned by :func:`engine.data.load_dataset` are cached and shared: treat the
    tensors as read-only (clone before modifying in place).
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    class_names: list[str]
    sensitive_train: dict[str, np.ndarray]
    sensitive_test: dict[str, np.ndarray]
    default_sensitive: str | None
    kind: str
    feature_names: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    report: LoadReport = field(default_factory=LoadReport)  # files skipped while loading

    @property
    def input_shape(self) -> tuple:
        return tuple(self.x_train.shape[1:])

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def __repr__(self) -> str:  # tensors are large; keep it short
        return (
            f"Dataset(name={self.name!r}, kind={self.kind!r}, train={len(self.y_train)}, "
            f"test={len(self.y_test)}, input_shape={self.input_shape}, "
            f"num_classes={self.num_classes}, sensitive={sorted(self.sensitive_train)})"
        )


@dataclass(frozen=True)
class DatasetInfo:
    """Registry entry describing one dataset (see :data:`engine.data.DATASETS`)."""

    name: str
    kind: str  # "image" | "tabular"
    description: str
    loader: Callable[[Path], Any] = field(repr=False)
    sensitive_attributes: tuple[str, ...]
    default_sensitive: str | None
    folder: str | None  # sub-folder of the data dir; None = needs no files
    files: tuple[str, ...]  # files needed inside ``folder`` (empty: none / user folder)
    offline: bool  # True when it always works without any user-supplied file or download
    source: str  # citation / where to get it
    license: str = ""
    num_classes: int | None = None

    def expected_dir(self, data_dir: str | Path | None = None) -> Path | None:
        return None if self.folder is None else _resolve_data_dir(data_dir) / self.folder

    def is_available(self, data_dir: str | Path | None = None) -> bool:
        """Cheap presence check (no checksum, no download)."""
        return dataset_files_present(self, data_dir)


@dataclass(eq=False)
class RawData:
    """What a loader returns (cached in-process): arrays before subsampling / normalisation.

    ``transform`` maps a slice of ``x_*`` to the final float32 array (e.g. uint8 images ->
    normalised floats); ``None`` means ``x_*`` is already final (tabular).
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    class_names: list[str]
    sensitive_train: dict[str, np.ndarray] = field(default_factory=dict)
    sensitive_test: dict[str, np.ndarray] = field(default_factory=dict)
    feature_names: list[str] = field(default_factory=list)
    transform: Callable[[np.ndarray], np.ndarray] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    report: LoadReport = field(default_factory=LoadReport)
