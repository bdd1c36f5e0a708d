"""Named audit configurations (``python -m engine audit --preset NAME``; the audit page's preset menu).

    quick        digits (1437 training images), LR, 30 epochs, lr 0.5, batch 64, 2R = 400, groups = the 10
                 digits, non-private vs DP-SGD at ε = 10. A memorising configuration: a few seconds to a
                 minute on 2 cores. Measured: the non-private GPR lies above DP-SGD ε = 10's beyond the
                 CIs, and with ``quick-eps1`` (DP-SGD at ε = 1) below both.
    quick-eps1   the same audit with DP-SGD at ε = 1 (the third point of the ordering).
    adult-paper  Adult, LR, 20 epochs, lr 0.1, clip C = 5, batch 256, 2R = 400, groups = sex; the lab's
                 comparison (IDP-SGD, INO-SGD, DP-SGD-S, DP-SGD, non-private) at ε = 10.
    mnist-paper  MNIST, a 10 000-image stratified subset, LR, the same training as adult-paper, 2R = 400,
                 groups = the 10 digits.

Each is an :class:`~engine.audit.pa_alooa.config.AuditConfig` (change it with ``.replace``).
"""
from __future__ import annotations

import dataclasses

from engine.audit.pa_alooa.config import DEFAULT_RUN, AuditConfig
from engine.config.run import ALGORITHM_LABELS, AlgorithmConfig
from engine.config.schema import ConfigError
from engine.data import DATASETS
from engine.dp.algorithms import algorithm

_QUICK_RUN = DEFAULT_RUN.replace(**{"data.name": "digits", "epochs": 30.0, "batch_size": 64, "optimizer.lr": 0.5})
_PAPER_RUN = DEFAULT_RUN.replace(**{"epochs": 20.0, "batch_size": 256, "optimizer.lr": 0.1, "clip_norm": 5.0})
_COMPARE = (AlgorithmConfig(name="idp_sample"), AlgorithmConfig(name="ino"),
            AlgorithmConfig(name="dpsgd_s", group_by="attribute"), AlgorithmConfig(name="dpsgd"),
            AlgorithmConfig(name="nonprivate"))

PRESETS: dict[str, AuditConfig] = {
    "quick": AuditConfig(run=_QUICK_RUN, epsilon=10.0, R=200, group_by="class", looa_k=0,
                         algorithms=(AlgorithmConfig(name="nonprivate"), AlgorithmConfig(name="dpsgd")),
                         name="quick (digits LR, ε = 10)"),
    "quick-eps1": AuditConfig(run=_QUICK_RUN, epsilon=1.0, R=200, group_by="class", looa_k=0,
                              algorithms=(AlgorithmConfig(name="dpsgd"),), name="quick (digits LR, ε = 1)"),
    "adult-paper": AuditConfig(run=_PAPER_RUN, epsilon=10.0, R=200, group_by="attribute", algorithms=_COMPARE,
                               name="adult-paper (Adult LR, sex)"),
    "mnist-paper": AuditConfig(run=_PAPER_RUN.replace(**{"data.name": "mnist", "data.max_train": 10_000}),
                               epsilon=10.0, R=200, group_by="class",
                               algorithms=tuple(dataclasses.replace(a, group_by="class")  # clips per digit
                                                if algorithm(a.name).grouped else a for a in _COMPARE),
                               name="mnist-paper (MNIST-10k LR, digits)"),
}


def preset(name: str) -> AuditConfig:
    """The named preset; ConfigError ``preset`` naming the known ones otherwise."""
    if name not in PRESETS:
        raise ConfigError("preset", f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]


def describe(config: AuditConfig) -> str:
    """What an audit runs, in one line (the page shows it for a preset, whose settings replace the form's)."""
    run = config.run
    data = run.data.name + (f" ({run.data.max_train:,} training samples)" if run.data.max_train else "")
    tiers = f"one tier at ε = {config.epsilon:g}" if run.tiers is None else \
        f"{len(run.tiers.tiers)} tiers at ε = {', '.join(f'{t.epsilon:g}' for t in run.tiers.tiers)}"
    algos = ", ".join(ALGORITHM_LABELS.get(a.name, a.name) for a in config.algorithms)
    return (f"{data}, {run.model.name.upper()}, {run.epochs:g} epochs, lr {run.optimizer.lr:g}, batch {run.batch_size}, "
            f"C {run.clip_norm:g}; {algos}; {tiers}; 2R = {config.n_models} models each; GPR by {config.group_by}"
            + (f"; PA-LOOA on {config.looa_k} records" if config.looa_k else "")
            + ("; with DP-SGD-S's controls" if config.controls else ""))


def settings(config: AuditConfig) -> list[tuple[str, str]]:
    """What an audit runs, one (setting, value) row each: the page shows a preset's in place of the form's
    fields, so that what the page shows is what runs."""
    run = config.run
    groups = config.group_by
    if config.group_by == "attribute":  # name the attribute: None means the dataset's default (Adult: sex)
        info = DATASETS.get(run.data.name)
        attr = config.group_attribute or (info.default_sensitive if info is not None else None)
        groups += f" ({attr})" if attr else " (the dataset's default attribute)"
    tiers = f"one tier at ε = {config.epsilon:g}" if run.tiers is None else \
        ", ".join(f"{t.name} ε = {t.epsilon:g}" for t in run.tiers.tiers)
    rows = [("dataset", run.data.name + (f", {run.data.max_train:,} training samples" if run.data.max_train
                                         else ", all training samples")),
            ("model", run.model.name.upper()),
            ("groups (GPR per …)", groups),
            ("algorithms", ", ".join(ALGORITHM_LABELS.get(a.name, a.name) for a in config.algorithms)),
            ("privacy", tiers),
            ("R", f"{config.R} (2R = {config.n_models} models per algorithm)"),
            ("training", f"{run.epochs:g} epochs, lr {run.optimizer.lr:g}, batch {run.batch_size}, "
                         f"clip C {run.clip_norm:g}, δ {run.delta:g}, seed {run.seed}"),
            ("thresholds", config.threshold), ("score", config.score),
            ("bootstrap", f"{config.n_boot} resamples, {config.null_perms} membership permutations"),
            ("PA-LOOA records", str(config.looa_k)),
            ("DP-SGD-S controls", "yes" if config.controls else "no")]
    return rows
