"""The training and audit pipeline never relies on the default device (CPU test; issue 17, item 4).

Every tensor the engine makes must be made where the run's device says (``engine.dp.prepare.resolve_device``
picks it, once), so that a CUDA run never silently does part of its work on the CPU, or fails with a
device mismatch, because of one device-less factory call. ``torch.set_default_device`` would hide exactly
those calls, so this test does the opposite: :class:`DeviceRecorder`, a ``torch.overrides.TorchFunctionMode``,
sees every tensor-factory call (``FACTORIES``: torch.zeros, ones, empty, full, arange, rand, randn, randint,
randperm, tensor, as_tensor, …) and, through a ``torch.Generator`` subclass patched in with ``monkeypatch``
(a Generator is made by its type, not by a torch function), every generator construction, during short real
runs: ``engine.train.loop.train`` for DP-SGD, INO-SGD and DP-SGD-S (digits, 1000 training samples, the
CNN's live module; DP-SGD-S also as a 2-seed job, the stacked model axis), and ``run_audit`` of tiny audits
(R = 2: stacked LR chunks of all four mechanisms with a PA-LOOA record, and a stacked CNN chunk). A call
without an explicit ``device=`` (or a positional ``torch.device``; for ``tensor`` / ``as_tensor`` / ``asarray``
of a tensor, the input's device) fails the test, with its file and line.

What is exempt, by call site (the frame that made the call): only calls made directly from ``engine/dp``,
``engine/train``, ``engine/audit`` and ``engine/models`` are checked. So the CPU-only data loading
(numpy → torch in ``engine/data``, moved to the device by the pipeline) is exempt, and so are tensors torch
makes itself (e.g. ``nn.Linear``'s parameters, which the pipeline builds on the CPU from the seeded CPU
generator and moves with ``.to(device)``). ``*_like`` factories take the device of their input and are not
checked; ``torch.from_numpy`` has no device argument (always CPU) and is not a factory here.

The recorder is shown to work: it catches deliberate device-less calls, and a ``torch.zeros(3)`` "added to the
step" (a wrapper of ``dp_step`` compiled as if it were a line of ``engine/dp/step.py``) fails a real run.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from engine.audit.pa_alooa.config import DEFAULT_RUN, AuditConfig
from engine.audit.pa_alooa.runner import run_audit
from engine.config.run import AlgorithmConfig, RunConfig
from engine.train import loop
from engine.train.loop import train

REPO = Path(__file__).resolve().parents[1]
ENGINE_SITES = tuple(str(REPO / "engine" / p) + "/" for p in ("dp", "train", "audit", "models"))
TORCH_OVERRIDES = str(Path(torch.overrides.__file__))

# Factories whose device is the default device unless given (``*_like`` factories take their input's device:
# not listed, not checked).
FACTORIES = {getattr(torch, name) for name in (
    "zeros", "ones", "empty", "full", "arange", "range", "linspace", "logspace", "eye", "rand", "randn",
    "randint", "randperm", "normal", "tensor", "as_tensor", "asarray", "scalar_tensor", "empty_strided",
    "tril_indices", "triu_indices") if hasattr(torch, name)}
FROM_DATA = {getattr(torch, n) for n in ("tensor", "as_tensor", "asarray") if hasattr(torch, n)}

# One tiny run per algorithm: digits (shipped), 1000 training samples, batch 64, one epoch (~16 steps).
TINY_RUN = RunConfig().replace(**{"data.max_train": 1000, "batch_size": 64, "epochs": 1.0, "eval_every": 8,
                                  "threads": 1})


class DeviceRecorder(TorchFunctionMode):
    """Records tensor-factory calls and Generator constructions made directly from ``sites`` (path prefixes)
    and which of them had no explicit device. ``checked``: every recorded call, ``missing``: the device-less
    ones, each as "file:line name(...)"."""

    def __init__(self, sites=ENGINE_SITES):
        super().__init__()
        self.sites = tuple(sites)
        self.checked: list[str] = []
        self.missing: list[str] = []

    def site(self, frame) -> str | None:
        while frame is not None and frame.f_code.co_filename == TORCH_OVERRIDES:  # handle_torch_function
            frame = frame.f_back
        if frame is None or not frame.f_code.co_filename.startswith(self.sites):
            return None
        path = Path(frame.f_code.co_filename)
        return f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{frame.f_lineno}"

    def note(self, where: str, what: str, has_device: bool) -> None:
        self.checked.append(f"{where} {what}")
        if not has_device:
            self.missing.append(f"{where} {what}")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES:
            where = self.site(sys._getframe(1))
            if where is not None:
                self.note(where, f"torch.{func.__name__}", _factory_has_device(func, args, kwargs))
        return func(*args, **kwargs)

    def generator_class(self):
        """A ``torch.Generator`` subclass that reports its constructions to this recorder."""
        recorder, base = self, torch._C.Generator

        class RecordingGenerator(base):
            def __new__(cls, *args, **kwargs):
                where = recorder.site(sys._getframe(1))
                if where is not None:
                    device = kwargs.get("device", args[0] if args else None)
                    recorder.note(where, "torch.Generator", device is not None)
                return super().__new__(cls, *args, **kwargs)

        RecordingGenerator.__name__ = RecordingGenerator.__qualname__ = "Generator"
        return RecordingGenerator


def _factory_has_device(func, args, kwargs) -> bool:
    if kwargs.get("device") is not None:
        return True
    if any(isinstance(a, torch.device) for a in args):
        return True
    if func in FROM_DATA and args:
        return isinstance(args[0], torch.Tensor)  # a tensor's data keeps its device
    return False


@pytest.fixture
def recorder(monkeypatch):
    """A DeviceRecorder for engine call sites, active for the test (torch.Generator patched too)."""
    rec = DeviceRecorder()
    monkeypatch.setattr(torch, "Generator", rec.generator_class())
    with rec:
        yield rec


def _assert_explicit(rec: DeviceRecorder) -> None:
    assert rec.checked, "the recorder saw no engine factory call: the site filter is broken"
    assert any("torch.Generator" in c for c in rec.checked), "no generator construction was seen"
    assert not rec.missing, ("engine code made tensors or generators on the default device:\n  "
                             + "\n  ".join(sorted(set(rec.missing))))


def _as_if_in(path: Path, source: str, name: str, namespace: dict):
    """The function ``name`` defined by ``source``, compiled as if it were code of ``path`` (so its calls
    come from that file's frames)."""
    exec(compile(source, str(path), "exec"), namespace)
    return namespace[name]


# --- the recorder itself -----------------------------------------------------------------------

def test_recorder_catches_device_less_calls(monkeypatch):
    rec = DeviceRecorder(sites=(str(Path(__file__).resolve()),))
    monkeypatch.setattr(torch, "Generator", rec.generator_class())
    t = torch.ones(2, dtype=torch.float64)  # outside the mode: not recorded
    with rec:
        torch.zeros(3)
        torch.full((2,), 1.0)
        torch.as_tensor(np.arange(3))
        torch.randn(4, generator=torch.Generator().manual_seed(0))  # two: the generator and randn
        torch.arange(5)
        # explicit or inherited devices are fine
        torch.zeros(3, device="cpu")
        torch.as_tensor(np.arange(3), device=t.device)
        torch.as_tensor(t)
        torch.zeros_like(t)
        g = torch.Generator(device=t.device).manual_seed(1)
        torch.rand(2, generator=g, device=t.device)
        torch.nn.Linear(2, 2)  # parameters made by torch itself: not this site's calls
    assert isinstance(g, torch._C.Generator)
    names = [m.split()[-1] for m in rec.missing]
    assert names == ["torch.zeros", "torch.full", "torch.as_tensor", "torch.Generator", "torch.randn", "torch.arange"]
    assert len(rec.checked) == len(names) + 5  # zeros_like and Linear's parameters are not checked
    assert all(m.startswith("tests/test_devices.py:") for m in rec.missing)


def test_site_filter_checks_engine_and_exempts_others(recorder):
    in_step = _as_if_in(REPO / "engine" / "dp" / "step.py", "def f():\n    return torch.zeros(3)\n", "f",
                        {"torch": torch})
    in_data = _as_if_in(REPO / "engine" / "data" / "base.py", "def f():\n    return torch.zeros(3)\n", "f",
                        {"torch": torch})
    in_step()
    in_data()  # engine/data: CPU-only loading, exempt
    torch.zeros(3)  # this test file: exempt
    assert [m.split()[0] for m in recorder.missing] == ["engine/dp/step.py:2"]


def test_a_device_less_call_added_to_the_step_fails_a_run(recorder, monkeypatch):
    """As if someone added ``torch.zeros(3)`` to ``dp_step``: the real run's recording catches it."""
    real = loop.dp_step
    wrapped = _as_if_in(REPO / "engine" / "dp" / "step.py",
                        "def dp_step(*args, **kwargs):\n    torch.zeros(3)\n    return real(*args, **kwargs)\n",
                        "dp_step", {"torch": torch, "real": real})
    monkeypatch.setattr(loop, "dp_step", wrapped)
    train(TINY_RUN.replace(**{"algorithm.name": "dpsgd", "model.name": "lr", "data.max_train": 300}))
    assert recorder.missing and all(m.startswith("engine/dp/step.py:2 torch.zeros") for m in recorder.missing)
    with pytest.raises(AssertionError, match="default device"):
        _assert_explicit(recorder)


# --- the pipeline ------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("algo", ["dpsgd", "ino", "dpsgd_s"])
def test_training_makes_every_tensor_on_the_run_device(recorder, algo):
    result = train(TINY_RUN.replace(**{"algorithm.name": algo}))  # digits → the Papernot CNN, one live module
    assert result.summary["steps"] > 0
    _assert_explicit(recorder)


@pytest.mark.slow
def test_stacked_seeds_make_every_tensor_on_the_run_device(recorder):
    """k = 2 seeds: the model axis (stacked CNN parameters, the layerwise stack) and DP-SGD-S's per-model state."""
    result = train(TINY_RUN.replace(**{"algorithm.name": "dpsgd_s", "seeds": 2, "data.max_train": 600}))
    assert len(result.per_seed) == 2
    _assert_explicit(recorder)


AUDIT_RUN = DEFAULT_RUN.replace(**{"data.name": "digits", "data.max_train": 600, "epochs": 1.0, "batch_size": 64,
                                   "threads": 1})


@pytest.mark.slow
def test_audit_chunks_make_every_tensor_on_the_run_device(recorder):
    """R = 2 (4 models per algorithm, stacked LR chunks: the closed form), one PA-LOOA record, every mechanism."""
    config = AuditConfig(run=AUDIT_RUN, group_by="class", R=2, epsilon=2.0, n_boot=20, null_perms=2, looa_k=1,
                         looa_models=2,
                         algorithms=(AlgorithmConfig(name="dpsgd"), AlgorithmConfig(name="ino"),
                                     AlgorithmConfig(name="dpsgd_s", group_by="class"),
                                     AlgorithmConfig(name="nonprivate")))
    report = run_audit(config)
    assert report.n_models == 4
    _assert_explicit(recorder)


def test_cnn_audit_chunk_makes_every_tensor_on_the_run_device(recorder):
    """A CNN chunk: the layerwise stack (its probe batch included), and the chunk sizing's shape probe
    (engine.audit.pa_alooa.chunks)."""
    config = AuditConfig(run=AUDIT_RUN.replace(**{"model.name": "cnn"}), group_by="class", R=2, epsilon=2.0,
                         n_boot=20, null_perms=2, looa_k=0, algorithms=(AlgorithmConfig(name="dpsgd"),))
    assert run_audit(config).n_models == 4
    _assert_explicit(recorder)


# --- bench/gpu_smoke.py without a GPU ----------------------------------------------------------

@pytest.fixture
def gpu_smoke(monkeypatch):
    import importlib.util

    monkeypatch.syspath_prepend(str(REPO / "bench"))  # its ``datadir`` helper, as ``python bench/...`` has it
    spec = importlib.util.spec_from_file_location("gpu_smoke", REPO / "bench" / "gpu_smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine runs the real smoke check")
def test_gpu_smoke_without_cuda_prints_one_json_line(gpu_smoke, capsys):
    assert gpu_smoke.main(["--json"]) == 0
    assert capsys.readouterr().out == '{"cuda": false}\n'


@pytest.mark.parametrize("argv", [["--bogus"], ["--R", "0"], ["--tol", "abc"], ["--max-train", "10"]])
def test_gpu_smoke_bad_arguments_one_line_exit_2(gpu_smoke, capsys, argv):
    with pytest.raises(SystemExit) as e:
        gpu_smoke.main(["--json", *argv])
    assert e.value.code == 2
    err = capsys.readouterr()
    assert err.out == "" and err.err.count("\n") == 1 and err.err.startswith("gpu_smoke.py: error: ")
