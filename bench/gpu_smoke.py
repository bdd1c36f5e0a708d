"""GPU smoke check: the CUDA path of the engine, end to end, in well under 5 minutes (issue 17, item 4).

On a CUDA machine (``engine.dp.prepare.resolve_device("auto")`` says cuda) it runs, each part on its own
(a part that raises is reported under ``errors`` and the others still run):

1. ``train``: a short INO-SGD MNIST run (``engine.train.loop.train``, Papernot CNN, ``--max-train`` 10000
   training samples, 1 epoch, device cuda), and ``train_seeds``: a 2-seed DP-SGD-S job (the loop's stacked
   model axis, MNIST LR) on cuda;
2. ``audit``: tiny audits (``run_audit``, R = 2: one chunk of 4 models each) on cuda: Adult LR with DP-SGD,
   INO-SGD and DP-SGD-S (the closed form), MNIST CNN with DP-SGD (the stack's layerwise path);
3. ``equality``: per-sample losses and gradient norms, and the clipped weighted sum (``dp_step`` with a fixed
   batch, per-sample clip = the median norm, zero noise), of the same models and batch on CUDA and on the CPU,
   in float64, for the five per-sample forms: the live CNN module (layer hooks), stacked LR and tanh MLP (the
   closed form), the stacked CNN through the layerwise path (both strategies) and through vmap.
   ``norms_equal``: every relative error ≤ ``--tol`` (1e-9);
4. ``step_ms_cpu`` / ``step_ms_gpu``: median ms of one INO-SGD ``dp_step`` + optimizer step (Papernot CNN,
   MNIST, batch 256, the run's Poisson sampler), the two devices interleaved over ``--rounds``.

Prints ONE JSON line with --json: {"cuda": true, "device": name, "step_ms_cpu", "step_ms_gpu", "norms_equal",
"max_rel_err", "peak_gpu_mem_mib", "seconds", ...details}; exit 1 when a part failed or the devices disagree.
Without CUDA: {"cuda": false}, exit 0 (``--cpu-dry-run`` runs every part with the CPU standing in for the GPU,
to test this script on a machine without one: its figures mean nothing). Bad arguments: one line on stderr,
exit 2.

    python bench/gpu_smoke.py [--json] [--max-train 10000] [--rounds 20] [--R 2] [--tol 1e-9] [--cpu-dry-run]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from datadir import interleaved_ms, use_shared_data  # noqa: E402

from engine.audit.pa_alooa.config import DEFAULT_RUN, AuditConfig  # noqa: E402
from engine.audit.pa_alooa.runner import run_audit  # noqa: E402
from engine.config.run import AlgorithmConfig, ModelConfig, RunConfig  # noqa: E402
from engine.data import load_dataset  # noqa: E402
from engine.dp.grad_sample import ModuleGrads  # noqa: E402
from engine.dp.mechanisms import Clipped  # noqa: E402
from engine.dp.prepare import resolve_device, seeded_model  # noqa: E402
from engine.dp.stacked import StackedModels  # noqa: E402
from engine.dp.step import PoissonSampler, dp_step  # noqa: E402
from engine.train.loop import model_axis, prepare, step_generator, train  # noqa: E402


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line on stderr, exit 2
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def parse_args(argv=None):
    ap = _Parser(prog="gpu_smoke.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one JSON line")
    ap.add_argument("--max-train", type=int, default=10000, help="MNIST training samples of the INO-SGD run")
    ap.add_argument("--rounds", type=int, default=20, help="interleaved timing rounds of the step")
    ap.add_argument("--R", type=int, default=2, help="the audits' R (2R models: one chunk)")
    ap.add_argument("--tol", type=float, default=1e-9, help="largest relative error CUDA vs CPU in float64")
    ap.add_argument("--budget-s", type=float, default=240.0, help="parts not started by then are skipped")
    ap.add_argument("--cpu-dry-run", action="store_true", help="no GPU: run every part on the CPU (tests the script)")
    args = ap.parse_args(argv)
    if not 1000 <= args.max_train <= 60000:
        ap.error(f"--max-train must be in [1000, 60000], got {args.max_train}")
    if not 1 <= args.rounds <= 1000:
        ap.error(f"--rounds must be in [1, 1000], got {args.rounds}")
    if not 1 <= args.R <= 16:
        ap.error(f"--R must be in [1, 16], got {args.R}")
    if not (math.isfinite(args.tol) and 0 < args.tol < 1):
        ap.error(f"--tol must be in (0, 1), got {args.tol}")
    if not (math.isfinite(args.budget_s) and args.budget_s > 0):
        ap.error(f"--budget-s must be positive, got {args.budget_s}")
    return args


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


# --- 1. training ---------------------------------------------------------------------------------

def mnist_run(max_train: int, device: str) -> RunConfig:
    return RunConfig().replace(**{"data.name": "mnist", "data.max_train": max_train, "model.name": "cnn",
                                  "algorithm.name": "ino", "epochs": 1.0, "batch_size": 256, "optimizer.lr": 0.5,
                                  "optimizer.momentum": 0.5,
                                  "eval_every": 10, "device": device})


def part_train(args, device: str) -> dict:
    out = {}
    t0 = time.perf_counter()
    r = train(mnist_run(args.max_train, device))
    out["ino_mnist"] = {"seconds": round(time.perf_counter() - t0, 2), "steps": r.summary["steps"],
                        "accuracy": r.summary["accuracy"], "loss": r.summary["loss"],
                        "model_device": str(next(r.model.parameters()).device)}
    t0 = time.perf_counter()
    cfg = mnist_run(2000, device).replace(**{"model.name": "lr", "algorithm.name": "dpsgd_s", "seeds": 2,
                                             "optimizer.lr": 1.0})
    r = train(cfg)
    out["dpsgd_s_2_seeds"] = {"seconds": round(time.perf_counter() - t0, 2), "steps": r.summary["steps"],
                              "accuracy": [p.summary["accuracy"] for p in r.per_seed]}
    ok = all(math.isfinite(v["loss"] if k == "ino_mnist" else min(v["accuracy"])) for k, v in out.items())
    return {**out, "ok": bool(ok and math.isfinite(out["ino_mnist"]["accuracy"]))}


# --- 2. audit chunks -----------------------------------------------------------------------------

def part_audit(args, device: str) -> dict:
    out = {}
    adult = AuditConfig(run=DEFAULT_RUN.replace(**{"data.name": "adult", "data.max_train": 4000, "epochs": 1.0,
                                                   "batch_size": 256, "device": device}),
                        R=args.R, epsilon=4.0, group_by="attribute", n_boot=50, null_perms=2, looa_k=0,
                        algorithms=(AlgorithmConfig(name="dpsgd"), AlgorithmConfig(name="ino"),
                                    AlgorithmConfig(name="dpsgd_s", group_by="attribute")))
    cnn = AuditConfig(run=DEFAULT_RUN.replace(**{"data.name": "mnist", "data.max_train": 2000, "model.name": "cnn",
                                                 "epochs": 1.0, "batch_size": 128, "optimizer.lr": 0.1,
                                                 "device": device}),
                      R=args.R, epsilon=4.0, group_by="class", n_boot=50, null_perms=2, looa_k=0,
                      algorithms=(AlgorithmConfig(name="dpsgd"),))
    ok = True
    for name, cfg in (("adult_lr", adult), ("mnist_cnn", cnn)):
        t0 = time.perf_counter()
        d = run_audit(cfg).to_dict()
        algos = {a["key"]: {"accuracy": a["accuracy"]["mean"], "train_seconds": round(a["train_seconds"], 2),
                            "delta_pp": a["gpr"]["delta"]["value"]} for a in d["algorithms"]}
        ok &= all(math.isfinite(a["accuracy"]) for a in algos.values())
        out[name] = {"seconds": round(time.perf_counter() - t0, 2), "device": d["device"], "n_models": d["n_models"],
                     "chunk_models": d["chunk_models"], "steps_per_model": d["steps_per_model"], "algorithms": algos}
    return {**out, "ok": bool(ok)}


# --- 3. CUDA == CPU in float64 -------------------------------------------------------------------

def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| / max |b| (b the CPU reference); 0 when both are 0."""
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    scale = float(b.abs().max()) if b.numel() else 0.0
    diff = float((a - b).abs().max()) if b.numel() else 0.0
    return diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)


def _elementwise_rel(a, b, mask) -> float:
    """max over the valid entries of |a − b| / |b| (b the CPU reference)."""
    a, b, mask = a.detach().cpu().double(), b.detach().cpu().double(), mask.cpu()
    err = ((a - b).abs() / b.abs().clamp(min=1e-300))[mask]
    return float(err.max()) if err.numel() else 0.0


def _forms(ds, m: int):
    """The per-sample forms to compare, each ``make(device) → models`` (float64; same initialisation)."""
    shape, k = ds.input_shape, ds.num_classes

    def live(dev):
        model = seeded_model(ModelConfig(name="cnn"), shape, k, 0).double().to(dev)
        return ModuleGrads(model), 1

    def stacked(name, method="auto", strategy="ghost", **kw):
        def make(dev):
            ens = StackedModels(ModelConfig(name=name, **kw), shape, k, list(range(m)), dev, method=method,
                                strategy=strategy)
            if name == "cnn" and ens.method != ("vmap" if method == "vmap" else "layerwise"):
                raise RuntimeError(f"the stacked CNN took the {ens.method} path")
            for d in (ens.params, ens.buffers):
                for key in d:
                    d[key] = d[key].double()
            return ens, m
        return make

    return {"live_cnn_layerwise": live, "stacked_lr_closed_form": stacked("lr"),
            "stacked_mlp_closed_form": stacked("mlp", hidden=(64,)), "stacked_cnn_layerwise": stacked("cnn"),
            "stacked_cnn_layerwise_exact": stacked("cnn", strategy="exact"), "stacked_cnn_vmap": stacked("cnn", "vmap")}


def _evaluate(models, n_models, x, y, members, clip, dev):
    """Per-sample losses and norms of the fixed batch, and dp_step's clipped weighted sum (zero noise)."""
    sampler = PoissonSampler(members[:n_models], np.ones(members.shape[1]), dev,  # q = 1: the members, in order
                             expected_batch=members[:n_models].sum(1))
    idx, mask = sampler.sample(torch.Generator(device=dev).manual_seed(0))
    work = models.per_sample(x, y, idx, mask)
    losses, norms = work.losses.clone(), work.norms.clone()
    del work
    if clip is None:
        return losses, norms, mask, None
    mech = Clipped(sample_clip_norms=np.full(members.shape[1], clip), noise_std=0.0, n_models=n_models, device=dev)
    out = dp_step(models, x, y, sampler, mech, torch.Generator(device=dev).manual_seed(0))
    return losses, norms, mask, out.grads


def part_equality(args, dev: torch.device) -> dict:
    ds = load_dataset("mnist", max_train=args.max_train)
    n, m, batch = 512, 3, 64
    x_cpu, y_cpu = ds.x_train[:n].double(), ds.y_train[:n]
    x_dev, y_dev = x_cpu.to(dev), y_cpu.to(dev)
    rng = np.random.default_rng(0)
    members = np.zeros((m, n), bool)
    for r in range(m):
        members[r, rng.choice(n, size=batch, replace=False)] = True
    forms, worst = {}, 0.0
    for name, make in _forms(ds, m).items():
        ref_models, k = make(torch.device("cpu"))
        l0, n0, mask, _ = _evaluate(ref_models, k, x_cpu, y_cpu, members, None, torch.device("cpu"))
        clip = float(n0[mask].median())  # about half the batch is clipped
        ref_models, _ = make(torch.device("cpu"))
        l0, n0, mask, g0 = _evaluate(ref_models, k, x_cpu, y_cpu, members, clip, torch.device("cpu"))
        models, _ = make(dev)
        l1, n1, mask1, g1 = _evaluate(models, k, x_dev, y_dev, members, clip, dev)
        assert torch.equal(mask1.cpu(), mask), "the fixed batch differs between the devices"
        errs = {"losses": _elementwise_rel(l1, l0, mask), "norms": _elementwise_rel(n1, n0, mask),
                "clipped_sum": max(_rel(g1[p], g0[p]) for p in g0)}
        grads_device = {str(v.device) for v in g1.values()}
        forms[name] = {**{key: float(f"{v:.3g}") for key, v in errs.items()}, "grads_device": sorted(grads_device),
                       "clip": round(clip, 6)}
        worst = max(worst, *errs.values())
    return {"forms": forms, "max_rel_err": worst, "norms_equal": bool(worst <= args.tol), "tol": args.tol,
            "batch": batch, "models": m, "ok": bool(worst <= args.tol)}


# --- 4. step time --------------------------------------------------------------------------------

def _step_fn(prep):
    models = model_axis(prep)
    dev = prep.device
    x, y = prep.dataset.x_train.to(dev), prep.dataset.y_train.to(dev)
    sampler = PoissonSampler(np.ones((1, len(y)), bool), prep.sample_rates, dev, expected_batch=prep.expected_batch)
    gen = step_generator(prep.config, dev)
    opt = torch.optim.SGD(models.params, lr=prep.config.optimizer.lr)

    def step():
        out = dp_step(models.grads_of, x, y, sampler, prep.mechanism, gen)
        opt.zero_grad(set_to_none=True)
        models.set_grads(out.grads)
        opt.step()
        sync(dev)

    return step


def part_steps(args, device: str) -> dict:
    base = mnist_run(args.max_train, device)
    steps = {"cpu": _step_fn(prepare(base.replace(device="cpu"))), "gpu": _step_fn(prepare(base))}
    ms = interleaved_ms(steps, args.rounds)  # the warm-up covers lazy initialisation, cuDNN's algorithm choice
    return {"step_ms_cpu": round(ms["cpu"], 3), "step_ms_gpu": round(ms["gpu"], 3), "rounds": args.rounds,
            "batch": base.batch_size, "threads": torch.get_num_threads(), "ok": True}


# --- main ----------------------------------------------------------------------------------------

def main(argv=None) -> int:
    args = parse_args(argv)
    use_shared_data()
    warnings.filterwarnings("ignore")
    dev = torch.device("cpu") if args.cpu_dry_run else resolve_device("auto")
    if dev.type != "cuda" and not args.cpu_dry_run:
        print(json.dumps({"cuda": False}) if args.json else "no CUDA device: nothing to check (--cpu-dry-run tests "
                                                             "this script on the CPU)")
        return 0
    device = "cpu" if args.cpu_dry_run else "cuda"
    started = time.perf_counter()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    results, errors, skipped = {}, {}, []
    parts = (("equality", lambda: part_equality(args, dev)), ("train", lambda: part_train(args, device)),
             ("audit", lambda: part_audit(args, device)), ("steps", lambda: part_steps(args, device)))
    for name, fn in parts:
        if time.perf_counter() - started > args.budget_s:
            skipped.append(name)
            continue
        try:
            results[name] = fn()
        except Exception as e:  # noqa: BLE001 - a smoke check reports every part's failure, then goes on
            where = traceback.extract_tb(e.__traceback__)[-1]
            errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} " \
                           f"({Path(where.filename).name}:{where.lineno})"[:400]
    eq, st = results.get("equality", {}), results.get("steps", {})
    out = {"cuda": dev.type == "cuda", "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
           "step_ms_cpu": st.get("step_ms_cpu"), "step_ms_gpu": st.get("step_ms_gpu"),
           "norms_equal": eq.get("norms_equal", False), "max_rel_err": eq.get("max_rel_err"),
           "peak_gpu_mem_mib": round(torch.cuda.max_memory_allocated(dev) / 2**20, 1) if dev.type == "cuda" else None,
           "seconds": round(time.perf_counter() - started, 2), "torch": torch.__version__,
           "cuda_version": torch.version.cuda, "dry_run": bool(args.cpu_dry_run), "errors": errors,
           "skipped": skipped, **{k: v for k, v in results.items() if k != "steps"}}
    failed = bool(errors or skipped or not out["norms_equal"] or not all(r.get("ok") for r in results.values()))
    out["ok"] = not failed
    if args.json:
        print(json.dumps(out, sort_keys=True, default=str))
    else:
        print(f"{out['device']}: step {out['step_ms_cpu']} ms CPU vs {out['step_ms_gpu']} ms GPU; CUDA == CPU "
              f"(float64, rel err ≤ {args.tol:g}): {out['norms_equal']} (max {out['max_rel_err']}); peak GPU memory "
              f"{out['peak_gpu_mem_mib']} MiB; {out['seconds']} s")
        for name, err in errors.items():
            print(f"  {name} FAILED: {err}")
        for name in skipped:
            print(f"  {name} skipped (over --budget-s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
