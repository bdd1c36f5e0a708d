"""The lab's embedded default: the Train page's default comparison and the example runs of the first
Results view.

:data:`DEFAULT_TRAIN` is the default comparison: full MNIST (shipped in ``assets/mnist/``, so it works
offline), the paper's class tiers (ε = 1 for {2, 5, 9}, 2 for {3, 7, 8}, 3 for {0, 1, 4, 6}), the
Papernot tanh CNN (``model="auto"`` on images), IDP-SGD (SAMPLE) vs INO-SGD, SGD lr 0.5 with momentum
0.5, expected batch 512, 12 planned epochs, an evaluation every 13 steps, the ε = 1 tier highlighted.

Why these settings (measured with :func:`measure`, ``python -m engine.tools.demo --measure``: each pair of
runs trained as two processes at once, one torch thread each, on a 2-core machine that other jobs were
loading, load average 3–4):

* The 12 planned epochs matter, not the trained ones: the privacy plan (σ, the per-tier rates q) of a
  12-epoch run makes the ε = 1 tier's recall rise at epoch ~0.5 and INO-SGD lead it. Planned for 4
  epochs (σ 0.87) or 1 epoch (σ 0.78) the ε = 1 tier's recall stays at 0 through the first epoch for
  both algorithms (no gain to see). The run goes on for the full 12 epochs (1406 steps, a few minutes);
  the gain shows in its first minute.
* ε = 1 tier recall gain INO − IDP (points) at evaluations 52 / 65 / 78 / 91 / 104 / 117 steps, seeds 0–3:
  seed 0: +0.2 / +1.2 / +4.3 / +4.6 / +2.7 / +1.9; seed 1: +4.1 / +5.3 / +4.1 / +3.6 / +3.1 / +4.1;
  seed 2: +0.3 / +2.2 / +5.4 / +6.7 / +6.5 / +5.5; seed 3: +0.7 / +1.3 / +4.1 / +5.2 / +5.1 / +5.0 —
  positive for every seed from step 52 on, reached after 6–14 s of training (steps 65–78 after 8–22 s),
  about 0.11–0.35 s per step including the evaluations (0.12 s on a quiet core). A worker's start (imports,
  MNIST load and checksum, the privacy plan) adds ~3–5 s. The issue's reference: +5.6 ± 1.3 at epoch 1.
* In the browser (tests/test_browser_demo.py: fresh store, empty data folder, Launch with the defaults),
  with ``--write`` training two more runs on the same 2 cores (load average 6–10): the ε = 1 tier's MID
  and INO's lead (+1.2 points at step 65) were on the live charts 58 s after the click; alone on the
  machine but for the other helpers' work (load average 3–4), 30 s after the click. This needs the
  two runs to train side by side (two workers): with one worker, INO-SGD would start only after IDP-SGD's
  whole run.
* Full MNIST rather than a subset: the four files are needed for any MNIST default anyway (11.6 MB), load
  in under a second, and a subset changes the plan (q depends on N) without shortening the first minute.

:func:`example_runs` loads ``assets/demo/example_runs.json``: run records (the store's run dict plus
``evals``, as ``engine.jobs.runs.run_record`` gives them) of this comparison over :data:`EXAMPLE_SEEDS` seeds,
written by ``python -m engine.tools.demo --write``, which really trains them (about 4 minutes per run on
one core). Each record carries ``"example": True``; its config is exactly what it trained with: the
default comparison's with ``seed = j`` (lone runs, one per algorithm and seed; the figures treat runs
of one group that differ only in their seed as one series, and pair IDP-SGD and INO-SGD by seed).
"""
from __future__ import annotations

import argparse
import copy
import functools
import hashlib
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from engine.config.run import AlgorithmConfig, DataConfig, ModelConfig, OptimizerConfig, RunConfig
from engine.data.files import ASSETS_DIR
from engine.dp.tiers import preset
from engine.figures import frames
from engine.jobs.kinds import execute
from engine.jobs.runs import run_record
from engine.store.db import RunStore

EXAMPLE_PATH = ASSETS_DIR / "demo" / "example_runs.json"
EXAMPLE_SEEDS = 3
SEED_FIELDS = ("seed", "seeds", "seed_index")  # what differs between the replicates of one series


@dataclass(frozen=True)
class DemoDefaults:
    """The Train page's default widget values (``max_train`` 0 = all, as the widget reads it)."""

    dataset: str = "mnist"
    max_train: int = 0
    model: str = "auto"  # the Papernot tanh CNN on images
    epochs: float = 12.0
    batch: int = 512
    lr: float = 0.5
    momentum: float = 0.5
    eval_every: int = 13
    algos: tuple[str, ...] = ("idp_sample", "ino")
    preset: str = "paper"  # engine.dp.tiers.preset name
    highlight_tier: str = "ε=1"  # the most private tier's name (the preset's tier 0)
    seed: int = 0

    def run_configs(self, seed: int | None = None) -> list[RunConfig]:
        """The run configs the Train page launches with its defaults, one per algorithm (validated)."""
        base = RunConfig(data=DataConfig(name=self.dataset, max_train=self.max_train or None),
                         tiers=preset(self.preset), model=ModelConfig(name=self.model), algorithm=AlgorithmConfig(),
                         optimizer=OptimizerConfig(lr=self.lr, momentum=self.momentum), epochs=self.epochs,
                         batch_size=self.batch, seed=self.seed if seed is None else seed,
                         eval_every=self.eval_every)
        return [base.replace(**{"algorithm.name": a}).validate() for a in self.algos]


DEFAULT_TRAIN = DemoDefaults()


def config_key(config: dict | RunConfig) -> str:
    """sha256 of a run config's canonical JSON without the seed fields: equal for every replicate of one
    series (the example file is checked against :data:`DEFAULT_TRAIN` with it). A stored dict is parsed
    first, so a field added to RunConfig later (at its default) leaves the key as it was."""
    d = config.to_dict() if isinstance(config, RunConfig) else dict(config)
    d = RunConfig.from_dict({k: v for k, v in d.items() if k not in SEED_FIELDS}).to_dict()
    d = {k: v for k, v in d.items() if k not in SEED_FIELDS}
    return hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# --- example runs ---------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=2)
def _load(path: str, mtime_ns: int) -> tuple[dict, ...]:
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    return tuple(doc["runs"])


def example_runs(path: str | Path | None = None) -> list[dict]:
    """Run records with evals of the default comparison (IDP-SGD and INO-SGD, :data:`EXAMPLE_SEEDS`
    seeds, one group), each marked ``"example": True``; fresh copies (callers may change them)."""
    p = Path(path or EXAMPLE_PATH)
    return copy.deepcopy(list(_load(str(p), p.stat().st_mtime_ns)))


def _train_one(config_json: str, store_path: str, run_id: int) -> None:
    """One run into the shared store, in a worker process with one torch thread."""
    import torch

    torch.set_num_threads(1)
    execute(RunStore(store_path), run_id, RunConfig.from_json(config_json), kind="train")


def _parallel(jobs, workers: int) -> None:
    """Train ``(config, store_path, run_id)`` jobs ``workers`` at a time (spawned processes)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        for f in [pool.submit(_train_one, c.to_json(), s, r) for c, s, r in jobs]:
            f.result()


def _rounded(x, digits: int = 5):
    if isinstance(x, float):
        return float(f"{x:.{digits}g}") if x == x and abs(x) != float("inf") else x
    if isinstance(x, dict):
        return {k: _rounded(v, digits) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v, digits) for v in x]
    return x


def train_examples(seeds: int = EXAMPLE_SEEDS, *, workers: int = 2, defaults: DemoDefaults = DEFAULT_TRAIN,
                   train_epochs: float | None = None) -> list[dict]:
    """Really train the default comparison over ``seeds`` seeds (IDP-SGD and INO-SGD of seed j share the
    seed, hence batches and noise) into a temporary store; its run records, example-marked."""
    with tempfile.TemporaryDirectory(prefix="privacy-lab-demo-") as tmp:
        path = str(Path(tmp) / "runs.sqlite")
        store = RunStore(path)
        jobs = []
        for j in range(seeds):
            for cfg in defaults.run_configs(seed=defaults.seed + j):
                if train_epochs is not None:
                    cfg = cfg.replace(train_epochs=train_epochs)
                jobs.append((cfg, path, store.create_run(cfg, group_id="example")))
        _parallel(jobs, workers)
        records = []
        for j, (cfg, _, rid) in enumerate(jobs):
            r = run_record(store, rid)  # its config is what it trained with: a lone run with seed base + j
            r.update(example=True, pid=None, host=None)  # nothing of the machine that wrote it
            records.append(r)
    return records


def keep_last_individual_epsilon(run: dict) -> dict:
    """The run record with individual ε at its last evaluation only (the summary holds it too): what Results draws
    of it, in a shipped file that stays small (every evaluation's copy tripled it, 0.8 → 2.8 MB)."""
    last = max((k for k, e in enumerate(run["evals"]) if e.get("individual_epsilon")), default=None)
    for k, e in enumerate(run["evals"]):
        if k != last:
            e.pop("individual_epsilon", None)
    return run


def write_examples(path: str | Path = EXAMPLE_PATH, seeds: int = EXAMPLE_SEEDS, workers: int = 2) -> Path:
    started = time.time()
    runs = [keep_last_individual_epsilon(r) for r in train_examples(seeds, workers=workers)]
    doc = {"about": "Example runs of engine.tools.demo.DEFAULT_TRAIN (IDP-SGD vs INO-SGD on MNIST, paper tiers), "
                    "written by `python -m engine.tools.demo --write`; floats rounded to 5 significant digits.",
           "config_keys": {c.algorithm.name: config_key(c) for c in DEFAULT_TRAIN.run_configs()},
           "seeds": seeds, "train_seconds": round(time.time() - started, 1), "runs": _rounded(runs)}
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n", encoding="utf-8")
    return p


# --- measurement ----------------------------------------------------------------------------------------

def tier_gains(runs: list[dict], tier: str = DEFAULT_TRAIN.highlight_tier):
    """INO − IDP recall gain of ``tier`` at each INO evaluation, per IDP/INO pair (the charts' frame)."""
    g = frames.recall_gain_over_time(runs)
    return g[g.tier == tier]


def measure(seeds: int = 2, train_epochs: float = 1.0, workers: int = 2) -> dict:
    """Train the default comparison's first ``train_epochs`` epochs (its 12-epoch privacy plan) for
    ``seeds`` seeds, ``workers`` runs at a time, one thread each; per pair the highlighted tier's gain at
    each evaluation with the INO run's elapsed training seconds, and the seconds per step."""
    runs = train_examples(seeds, workers=workers, train_epochs=train_epochs)
    gains = tier_gains(runs)
    by_id = {r["id"]: r for r in runs}
    out = {"per_step_seconds": {}, "pairs": {}}
    for r in runs:
        last = frames.last_eval(r)
        out["per_step_seconds"][f"{r['algorithm']}/seed{r['config']['seed']}"] = round(
            last.elapsed / max(1, last.step), 4)
    for (ino_id, _), g in gains.groupby(["ino_run_id", "idp_run_id"]):
        elapsed = {e.step: e.elapsed for e in frames.run_evals(by_id[ino_id])}
        out["pairs"][f"seed{by_id[ino_id]['config']['seed']}"] = [
            (int(s), round(elapsed[int(s)], 1), round(100 * float(v), 1)) for s, v in zip(g.step, g.gain)]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.tools.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help=f"train the example runs and write {EXAMPLE_PATH}")
    p.add_argument("--measure", action="store_true",
                   help="train the first epoch of the default comparison and print the ε = 1 tier's gain per eval")
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", default=str(EXAMPLE_PATH))
    a = p.parse_args(argv)
    if a.write == a.measure:
        p.error("give one of --write, --measure")
    if a.measure:
        print(json.dumps(measure(a.seeds or 2, workers=a.workers)))
    else:
        print(write_examples(a.out, a.seeds or EXAMPLE_SEEDS, a.workers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
