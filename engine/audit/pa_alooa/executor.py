"""How an audit's chunks of models get trained: one chunk is one call of :func:`train_chunk`, wherever it runs.

    train_chunk(setup, a, members, seeds, gen_seed, …)   train one chunk of stacked models and score them
    ChunkTask                                           one chunk still to train: its checkpoint key, models,
                                                        seeds and generator seed
    LocalChunks                                         the default executor: each chunk in this process, in
                                                        order, progress step by step

The invariant every executor keeps: a chunk's result depends only on (setup, algorithm, task): its models'
initial seeds and its generator seed are in the task, so where and in which order the chunks run changes no
number; the driver (``engine.audit.pa_alooa.runner``) checkpoints each result under its key and places it by its rows,
so results are merged by chunk index, never by arrival. An executor is an object with
``run(setup, a, tasks, prog, should_stop)`` yielding ``(task, result)`` as chunks finish, and ``name``; the Ray
one is ``engine.jobs.ray_backend.RayChunks`` (a layer above: it only ships this module's function to its
workers).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from engine.audit.pa_alooa.chunks import on_device, per_model_step_bytes
from engine.dp.mechanisms import build_mechanism
from engine.dp.stacked import StackedModels, sgd_train
from engine.dp.step import PoissonSampler


@dataclass(frozen=True)
class ChunkTask:
    """One chunk of models to train: rows ``lo:hi`` of its layout (``members``: their membership rows)."""

    key: str  # its checkpoint key, chunk/<algorithm>/<aloo|looa>/<index>
    lo: int
    hi: int
    members: np.ndarray  # (hi - lo, n) bool
    seeds: tuple  # the models' initialisation seeds
    gen_seed: int  # the chunk's generator (batches and noise)
    score_idx: np.ndarray | None = None  # PA-LOOA: score only these training records


def train_chunk(setup, a, members: np.ndarray, init_seeds, gen_seed: int, prog, should_stop, score_idx=None):
    """Train one chunk of models; returns (losses, confs) on ``score_idx`` (all samples), their test predictions
    and (DP-SGD-S) each model's realised noise multiplier."""
    ds, dev = setup.dataset, setup.device
    x, y = on_device(ds.x_train, dev), on_device(ds.y_train, dev)
    model_cfg = setup.config.run.model
    ens = StackedModels(model_cfg, ds.input_shape, ds.num_classes, init_seeds, dev)
    sampler = PoissonSampler(members, a.sample_rates, dev, expected_batch=a.privacy.expected_batch)
    mech = build_mechanism(privacy=a.privacy, members=members, device=dev)
    gen = torch.Generator(device=dev).manual_seed(gen_seed)
    sgd_train(ens, x, y, sampler, mech, steps=setup.steps, lr=setup.config.run.optimizer.lr, gen=gen,
              should_stop=should_stop, on_step=None if prog is None else (lambda _s: prog.advance()))
    chunk = eval_chunk(setup, len(init_seeds))
    if score_idx is not None:  # PA-LOOA: only the target records matter
        ix = torch.as_tensor(score_idx, device=dev)
        losses, confs, _ = ens.score(x[ix], y[ix], chunk=chunk)
        return losses, confs, None, None
    losses, confs, _ = ens.score(x, y, chunk=chunk)
    _, _, pred = ens.score(on_device(ds.x_test, dev), on_device(ds.y_test, dev), chunk=chunk)
    # DP-SGD-S: each model's realised noise multiplier z_Δ · mean_t max_k C_k / C (the noise-matched control's)
    realised = mech.realised_noise_multiplier().cpu().numpy() if hasattr(mech, "realised_noise_multiplier") else None
    return losses, confs, pred, realised


def eval_chunk(setup, n_models: int) -> int:
    """Samples scored at once for ``n_models`` models within the audit's memory budget."""
    model_cfg = setup.config.run.model
    ds = setup.dataset
    per_sample = per_model_step_bytes(model_cfg, ds.input_shape, ds.num_classes, 1) // 2
    return int(max(64, min(8192, setup.budget_bytes // max(1, per_sample * n_models))))


class LocalChunks:
    """Each chunk in this process, in order, its progress advancing step by step."""

    name = "local"

    def run(self, setup, a, tasks, prog, should_stop) -> Iterator[tuple[ChunkTask, tuple]]:
        for t in tasks:
            yield t, train_chunk(setup, a, t.members, t.seeds, t.gen_seed, prog, should_stop, score_idx=t.score_idx)

    def close(self) -> None:
        pass
