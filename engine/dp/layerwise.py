"""Per-sample gradients layer by layer, for one live module or for M stacked models in one pass.

Both forms run one forward pass that keeps each trainable layer's input ``a`` and output ``z``, then
``torch.autograd.grad`` of the summed loss with respect to the layer outputs only (b = ∂Σℓ/∂z): the
batch-summed weight gradients a normal backward computes (and we would throw away) are never formed.
Each layer's per-sample squared norms and its share of Σ_i c_i g_i then come from :func:`layer_rule`,
one rule per layer type, applied to ``a`` and ``b`` in the per-sample layout of the ORIGINAL layer:

    n samples of M models packed model after model (model m's the m-th run of sizes[m] rows; one model:
    sizes = (n,)); a (n, *layer input), b (n, *layer output)

and the rule runs on each model's rows alone: a stack of M models and a single model take literally the same
per-layer call, with a working set no larger than one model's.

* :class:`LayerwisePerSampleGrads` — one live ``nn.Module`` (M = 1, the dashboard run): forward hooks.
* :class:`StackedLayers` — M models of one architecture with stacked parameters {name: (M, *shape)} (an audit
  chunk, a k-seed job) run as ONE network on one batch: each model's valid batch entries, packed model after
  model (the per-sample order above, so every layer's a and b are already in it: no copies; a padded entry
  of the step's (M, L) batch is not computed at all). Everything that acts on each sample alone —
  activations, pooling, flattening, residual sums, GroupNorm's normalisation — runs on the packed batch as
  is; only the parameters differ by model: each Linear, Conv2d or GroupNorm layer runs each model's weights
  on that model's contiguous rows (one autograd node joins them). :meth:`StackedLayers.supports` says whether
  a model can run so: no buffers, every parameter in a Linear, a zero-padded Conv2d or an affine GroupNorm,
  and — since ``forward`` is plain code that could mix the samples of a batch — a probe batch's stacked
  logits equal each model's own. Otherwise the caller falls back to vmap over models
  (``engine.dp.grad_sample.VmapGrads``).

Layer rules (``rule(layer, a, b) → (sq (n,), summer(c (n,)) → {parameter name: Σ_i c_i g_i})``, one model's rows):
strategy ``"ghost"`` takes :func:`engine.dp.ghost.ghost_rule` where there is one (Linear, Conv2d with groups 1
and numeric zero padding: the ghost norm or g_i, whichever Bu et al.'s rule says is cheaper); everything else
— and every layer under ``"exact"`` — takes :func:`exact_rule`: Linear on (n, d) inputs factored
(g_i = b_i a_iᵀ is never materialised), a plain Conv2d by a grouped convolution or a strided-window einsum,
any other layer type by Opacus' per-layer grad sampler. Equal to float round-off (tests/test_ghost_clipping.py,
tests/test_stacked_layers.py).
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from engine.dp.ghost import conv2d_per_sample_weight_grad, ghost_rule, linear_ghost
from engine.dp.per_sample import DEFAULT_STRATEGY, STRATEGIES, PerSampleGrads


def trainable_layers(model: nn.Module):
    return [(name, m) for name, m in model.named_modules()
            if any(p.requires_grad for p in m.parameters(recurse=False))]


def _plain_conv(m) -> bool:
    """A Conv2d the vectorised per-sample forms cover: groups 1, numeric zero padding."""
    return (type(m) is nn.Conv2d and m.groups == 1 and not isinstance(m.padding, str)
            and m.padding_mode == "zeros")


def opacus_grad_samplers() -> dict:
    """Opacus' per-layer grad samplers {layer type: sampler}, imported on first use: only a layer type with no rule
    here (GroupNorm, LayerNorm, Embedding, ...) needs them, and ``import opacus`` costs ~2 s of CPU a process."""
    from opacus.grad_sample.grad_sample_module import GradSampleModule

    return GradSampleModule.GRAD_SAMPLERS


def layer_supported(m) -> bool:
    """A layer the layerwise path has a per-sample rule for. Opacus' samplers pad convolutions with zeros
    whatever the padding mode, so a convolution with another padding mode is left to vmap."""
    if isinstance(m, nn.Conv2d):
        return m.padding_mode == "zeros"
    return isinstance(m, nn.Linear) or type(m) in opacus_grad_samplers()


def exact_rule(m: nn.Module, a: torch.Tensor, b: torch.Tensor):
    """The exact per-sample rule of one layer (see the module docstring)."""
    if type(m) is nn.Linear and a.dim() == 2:
        return linear_ghost(m, a, b)  # T = 1: ‖g_i‖ = ‖a_i‖·‖b_i‖, exact and factored
    if _plain_conv(m):
        dense = {"weight": conv2d_per_sample_weight_grad(m, a, b)}
        if m.bias is not None:
            dense["bias"] = b.sum((2, 3))
    else:
        names = {id(p): k for k, p in m.named_parameters(recurse=False)}
        dense = {names[id(p)]: g for p, g in opacus_grad_samplers()[type(m)](m, [a], b).items()}
    n = a.shape[0]
    sq = sum(g.reshape(n, -1).pow(2).sum(1) for g in dense.values())
    return sq, lambda c: {k: torch.tensordot(c, g, dims=1) for k, g in dense.items()}


def layer_rule(m: nn.Module, strategy: str):
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown per-sample strategy {strategy!r}; one of {STRATEGIES}")
    return (ghost_rule(m) if strategy == "ghost" else None) or exact_rule


def per_layer_sums(layers, inputs, backprops, sizes, strategy: str, order):
    """Every layer's rule on each model's rows of its (a, b) (model m's: the m-th run of sizes[m] rows):
    (sq (n,), summer(c (n,)) → {param name: [each model's sum]} in ``order``). The rule runs once per model, on
    that model's rows alone — the very call a single model makes, and a working set no larger than its."""
    sq, summers = 0, []
    for (prefix, m), a, b in zip(layers, inputs, backprops):
        rule = layer_rule(m, strategy)
        parts = [rule(m, a_j, b_j) if len(a_j) else None for a_j, b_j in zip(a.split(sizes), b.split(sizes))]
        sq = sq + torch.cat([p[0] for p in parts if p is not None])
        shapes = {k: v.shape for k, v in m.named_parameters(recurse=False)}
        summers.append(((prefix + ".") if prefix else "", [p[1] if p is not None else None for p in parts], shapes,
                        a.dtype, a.device))

    def summed(c):
        out = {}
        for prefix, per_model, shapes, dtype, device in summers:
            # a model without a row in this pass sums to zero (made only then: ResNet-18's are 45 MB a model)
            sums = [summer(c_j) if summer is not None else
                    {k: torch.zeros(shape, dtype=dtype, device=device) for k, shape in shapes.items()}
                    for summer, c_j in zip(per_model, c.split(sizes))]
            out.update({prefix + k: [s[k] for s in sums] for k in shapes})
        return {k: out[k] for k in order}

    return sq, summed


class LayerwisePerSampleGrads:
    """Per-sample gradients of one live module's batch via forward hooks (M = 1; see the module docstring)."""

    def __init__(self, model: nn.Module, strategy: str = DEFAULT_STRATEGY):
        layer_rule(model, strategy)  # refuses an unknown strategy here, not at the first step
        self.model, self.strategy = model, strategy
        self.layers = trainable_layers(model)
        self.order = [f"{name}.{k}" if name else k
                      for name, m in self.layers for k, _ in m.named_parameters(recurse=False)]
        self._inputs: list = [None] * len(self.layers)
        self._outputs: list = [None] * len(self.layers)
        for k, (_, m) in enumerate(self.layers):
            m.register_forward_hook(self._hook(k))
        self._active = False

    def _hook(self, k):
        def hook(module, inputs, output):
            if self._active:
                self._inputs[k] = inputs[0].detach()
                self._outputs[k] = output
        return hook

    def __call__(self, x, y) -> PerSampleGrads:
        """x (L, ...), y (L,) → one model's (M = 1) per-sample gradients."""
        self._active = True
        try:
            logits = self.model(x)
        finally:
            self._active = False
        losses = F.cross_entropy(logits, y, reduction="none")
        backprops = torch.autograd.grad(losses.sum(), self._outputs)
        sq, summed = per_layer_sums(self.layers, self._inputs, backprops, (len(y),), self.strategy, self.order)
        self._inputs = [None] * len(self.layers)
        self._outputs = [None] * len(self.layers)
        return PerSampleGrads(losses.detach()[None], torch.sqrt(sq).detach()[None],
                              lambda coef: {k: v[0].unsqueeze(0) for k, v in summed(coef[0]).items()})


ELEMENTS_PER_PASS = 4_000_000  # measured (bench/stacked.py): the Papernot CNN ~1000 rows a pass, ResNet-18 ~30


def _stacked_layer(m: nn.Module) -> bool:
    return ((type(m) is nn.Linear) or (type(m) is nn.Conv2d and m.padding_mode == "zeros")
            or (type(m) is nn.GroupNorm and m.affine))


class _Stacked(nn.Module):
    """One trainable layer of M models on the packed batch: model m's parameters act on its own rows (the m-th
    run of ``owner.sizes`` rows). Records (a, z) for the step."""

    def __init__(self, layer: nn.Module, prefix: str, index: int, owner: StackedLayers):
        super().__init__()
        object.__setattr__(self, "layer", layer)  # the original layer (its geometry), not a submodule
        object.__setattr__(self, "owner", owner)
        self.prefix, self.index = prefix, index

    def forward(self, x):
        owner, layer = self.owner, self.layer
        w, bias = owner.params[self.prefix + "weight"], owner.params.get(self.prefix + "bias")
        if type(layer) is nn.Linear:
            run = F.linear
        elif type(layer) is nn.Conv2d:
            run = layer._conv_forward
        else:
            def run(r, w_j, b_j):
                return F.group_norm(r, layer.num_groups, w_j, b_j, layer.eps)
        # each model's layer on its own contiguous rows; one autograd node (a cat) joins them
        parts = [run(r, w[j], None if bias is None else bias[j]) for j, r in enumerate(x.split(owner.sizes)) if len(r)]
        z = torch.cat(parts) if len(parts) > 1 else parts[0]
        if owner.recording:
            if not z.requires_grad:  # the first layer: nothing before it needs a gradient
                z.requires_grad_()
            owner.record(self.index, x.detach(), z)
        return z


class StackedLayers:
    """M models of one architecture as one network on their packed batches (see the module docstring).
    Call with the stacked parameters {name: (M, *shape)} and the step's batch; build it with ``supports(...)``."""

    def __init__(self, base: nn.Module, n_models: int, strategy: str = DEFAULT_STRATEGY):
        layer_rule(base, strategy)
        self.n_models, self.strategy = int(n_models), strategy
        self.net = copy.deepcopy(base)
        self.layers, self.order = [], [k for k, _ in base.named_parameters()]
        for index, (name, layer) in enumerate(trainable_layers(base)):
            parent_name, _, child = name.rpartition(".")
            parent = self.net.get_submodule(parent_name) if parent_name else self.net
            setattr(parent, child, _Stacked(layer, name + ".", index, self))
            self.layers.append((name, layer))
        self._row_elements = None  # numbers in the layer inputs of one row: measured by the first pass
        self.params: dict = {}
        self.sizes: list = []
        self.recording = False
        self._inputs: list = []
        self._outputs: list = []

    @staticmethod
    def structure_supported(base: nn.Module) -> bool:
        """No buffers; every parameter in a Linear, a zero-padded Conv2d or an affine GroupNorm, all trainable."""
        if any(True for _ in base.buffers()):
            return False
        for _, m in base.named_modules():
            own = list(m.parameters(recurse=False))
            if own and not (_stacked_layer(m) and all(p.requires_grad for p in own)):
                return False
        return True

    @classmethod
    def supports(cls, base: nn.Module, params: dict, input_shape, n_models: int,
                 strategy: str = DEFAULT_STRATEGY) -> StackedLayers | None:
        """The stack of ``base`` if it can run so, else None: the structure check, then a probe batch whose
        stacked logits of ``params`` must equal each model's own (``functional_call`` of ``base``), which a
        ``forward`` mixing the samples of a batch would fail."""
        if not cls.structure_supported(base):
            return None
        stack = cls(base, n_models, strategy)
        first = next(iter(params.values()))
        rows = 3  # a different probe batch for each model: a forward mixing rows would mix models
        probe = torch.randn(n_models * rows, *input_shape, generator=torch.Generator(first.device).manual_seed(0),
                            dtype=first.dtype, device=first.device)
        try:
            with torch.no_grad():
                stacked = stack._forward(params, probe, [rows] * n_models)
                own = torch.cat([functional_call(base, {k: v[j] for k, v in params.items()},
                                                 (probe[j * rows:(j + 1) * rows],)) for j in range(n_models)])
        except (RuntimeError, ValueError, IndexError):
            return None
        scale = float(own.abs().max()) + 1.0
        same = stacked.shape == own.shape and bool(torch.allclose(stacked, own, rtol=1e-4, atol=1e-5 * scale))
        return stack if same else None

    def record(self, index: int, a: torch.Tensor, z: torch.Tensor) -> None:
        if self._outputs[index] is not None:
            raise RuntimeError("a stacked layer ran twice in one forward pass")
        self._inputs[index], self._outputs[index] = a, z

    def _forward(self, params: dict, x: torch.Tensor, sizes) -> torch.Tensor:
        """x: the models' packed rows (model m's the m-th run of sizes[m]) → their logits, packed alike."""
        self.params, self.sizes = params, list(sizes)
        try:
            return self.net(x)
        finally:
            self.params, self.sizes = {}, []

    def __call__(self, params: dict, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor,
                 mask: torch.Tensor) -> PerSampleGrads:
        """params {name: (M, *shape)}; the step's batch idx, mask (M, L) of x, y → per-sample gradients. Only
        the valid entries are computed: they are packed model after model (a padded entry costs nothing), in
        passes of consecutive models whose layer inputs hold at most :data:`ELEMENTS_PER_PASS` numbers
        together (one model at least; the very first pass, which measures that, one model): a pass of a few
        small models amortises the per-step overhead, a much larger one loses more to the caches than it
        saves. Passes do not change a single number."""
        sizes = [int(k) for k in mask.sum(1).tolist()]
        m, length = mask.shape
        zeros = torch.zeros(m, length, dtype=x.dtype, device=x.device)
        if sum(sizes) == 0:  # no model drew a sample: nothing to differentiate
            return PerSampleGrads(zeros, zeros, lambda coef: {k: torch.zeros_like(v) for k, v in params.items()})
        packed = idx[mask]
        xs, ys = x.index_select(0, packed), y.index_select(0, packed)
        losses, sq, summers, start, row = [], [], [], 0, 0
        for stop in range(1, m + 1):
            if (stop == m or self._row_elements is None
                    or sum(sizes[start:stop + 1]) * self._row_elements > ELEMENTS_PER_PASS):
                rows, some = sum(sizes[start:stop]), {k: v[start:stop] for k, v in params.items()}
                if rows:
                    pass_losses, pass_sq, summed = self._pass(some, xs[row:row + rows], ys[row:row + rows],
                                                              sizes[start:stop])
                    losses.append(pass_losses)
                    sq.append(pass_sq)
                    summers.append((row, rows, summed))
                else:  # models without a sample in this step: a zero sum each
                    summers.append((row, 0, lambda c, some=some: {k: list(torch.zeros_like(v)) for k, v in some.items()}))
                start, row = stop, row + rows

        def weighted_sum(coef):
            c = coef[mask]
            parts = [summed(c[a:a + n]) for a, n, summed in summers]  # each: {name: [its models' sums]}
            return {k: torch.stack([s for p in parts for s in p[k]]) for k in parts[0]}

        return PerSampleGrads(zeros.masked_scatter(mask, torch.cat(losses)),
                              zeros.masked_scatter(mask, torch.sqrt(torch.cat(sq))), weighted_sum)

    def _pass(self, params: dict, x: torch.Tensor, y: torch.Tensor, sizes):
        """One pass over some models' packed rows: (losses (n,), squared norms (n,), summer of their rows)."""
        self._inputs, self._outputs = [None] * len(self.layers), [None] * len(self.layers)
        self.recording = True
        try:
            logits = self._forward(params, x, sizes)
        finally:
            self.recording = False
        losses = F.cross_entropy(logits, y, reduction="none")
        backprops = torch.autograd.grad(losses.sum(), self._outputs)
        sq, summed = per_layer_sums(self.layers, self._inputs, backprops, sizes, self.strategy, self.order)
        self._row_elements = max(self._row_elements or 1, sum(a[0].numel() for a in self._inputs))
        self._inputs, self._outputs = [], []
        return losses.detach(), sq.detach(), summed

    @torch.no_grad()
    def logits(self, params: dict, x: torch.Tensor, *, budget: int = 4096) -> torch.Tensor:
        """(M, n, classes) logits of every model on the same inputs x (n, ...), ``budget`` model-samples a pass."""
        m, chunk = self.n_models, max(1, budget // self.n_models)
        out = []
        for s in range(0, len(x), chunk):
            xs = x[s:s + chunk]
            out.append(self._forward(params, xs.repeat(m, *([1] * (x.dim() - 1))), [len(xs)] * m)
                       .view(m, len(xs), -1))
        return torch.cat(out, 1)
