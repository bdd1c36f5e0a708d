"""What every per-sample gradient path gives the step: :class:`PerSampleGrads`, and the strategies of the
layerwise path (:mod:`engine.dp.layerwise`).

``"exact"`` materialises what each layer's per-sample gradients need (factored for Linear layers on (n, d)
inputs); ``"ghost"`` takes each Linear and Conv2d layer's norm from its input and output gradient alone where
Bu et al.'s rule says that is cheaper (:mod:`engine.dp.ghost`). Both give the same sums to float round-off;
``"ghost"`` is the default because it is the faster one on every model the lab trains (bench/step_overhead.py
and bench/stacked.py time both side by side, layer by layer).
"""
from __future__ import annotations

import torch

STRATEGIES = ("exact", "ghost")
DEFAULT_STRATEGY = "ghost"


class PerSampleGrads:
    """One step's per-sample quantities of M models: ``losses`` and ``norms`` (M, L) (detached) and
    ``weighted_sum(coef)`` = Σ_i coef[m, i] · g_{m,i} per model, {param name: (M, *shape)}."""

    def __init__(self, losses: torch.Tensor, norms: torch.Tensor, weighted_sum):
        self.losses, self.norms = losses, norms
        self._weighted_sum = weighted_sum

    def weighted_sum(self, coef: torch.Tensor) -> dict:
        return self._weighted_sum(coef)
