"""A standby: a worker process started before its run is known, so that a run starts warm.

The job manager (:mod:`engine.jobs.manager`) keeps one per worker slot. A standby pays the one-off costs of a worker
at once (imports, torch.optim's lazy torch._dynamo import, the first vmap(grad) trace), then reads its stdin:

* ``hint CONFIG_JSON`` — prepare that run config ahead of time (data, tiers, privacy plan, model: what
  ``engine.train.loop.prepare`` returns, which is deterministic); a new hint replaces the last;
* ``run RUN_ID [LOG_PATH]`` — from now on write to the run's log and run exactly the worker's code (``engine.jobs.worker``)
  for that run, using the prepared state if the run's config is the hinted one.

Once warm it creates the file ``--ready`` names (if given): the manager counts ready standbys, so that the
Train page's estimate knows whether a launch starts warm (``engine.jobs.estimates.start_seconds``). It exits when
stdin closes (the manager went away) and touches no run or store before a ``run`` line.
"""
from __future__ import annotations

import argparse
import os
import sys

# Importing the worker (the kinds registry, the training loop, the audit, the data registry) is most of a
# standby's head start: it happens before any run is known.
from engine.config.run import RunConfig
from engine.dp.grad_sample import ModuleGrads
from engine.jobs import worker
from engine.jobs.exiting import exit_process
from engine.models.metrics import predict
from engine.train.loop import prepare


def warm_up() -> None:
    """Pay the one-off costs of a worker before a run is assigned that importing does not: torch.optim's lazy
    torch._dynamo import, the first vmap(grad) trace. Touches no run and no store."""
    try:
        import torch

        torch.set_num_threads(1)
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
        torch.optim.SGD(model.parameters(), lr=0.1)
        ModuleGrads(model).per_sample(torch.zeros(3, 4), torch.zeros(3, dtype=torch.long), torch.arange(3)[None],
                                      torch.ones(1, 3, dtype=torch.bool))
        predict(model, torch.zeros(2, 4))
    except Exception:  # noqa: BLE001 - warming is best effort; the real run reports real errors
        pass


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.jobs.standby",
                                description="(internal) pre-import the engine, then run the worker for a run id read "
                                            "from stdin")
    p.add_argument("--store", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ready", default=None, help="a file to create once warm (the manager counts ready standbys)")
    args = p.parse_args(argv)
    warm_up()
    if args.ready:
        try:
            open(args.ready, "a").close()
        except OSError:  # only the estimate's warm/cold guess depends on it
            pass

    prepared: dict[str, object] = {}  # config JSON -> Prepared, from "hint" lines; each used at most once

    def ready(config):
        return prepared.pop(config.to_json(), None)

    run_line = None
    for line in sys.stdin:
        if line.startswith("hint "):
            try:
                cfg = RunConfig.from_json(line[5:]).validate()
                prepared.clear()
                prepared[cfg.to_json()] = prepare(cfg)
            except Exception:  # noqa: BLE001 - a bad hint only costs the speed-up; the worker reports errors
                prepared.clear()
        elif line.startswith("run "):
            run_line = line[4:]
            break
    if args.ready:  # taken or closed: no longer a ready standby (the manager removes it too; whoever is first)
        try:
            os.unlink(args.ready)
        except OSError:
            pass
    if run_line is None:
        return 0  # stdin closed: the manager went away (or is stopping); exit_process ends it at once
    parts = run_line.split(maxsplit=1)
    run_id = int(parts[0])
    if len(parts) > 1:  # from now on, write to this run's log
        fd = os.open(parts[1].strip(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    return worker.main(args.store, run_id, threads=args.threads, prepared=ready)


if __name__ == "__main__":
    exit_process(main())
