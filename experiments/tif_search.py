"""TIF search: the INO-SGD importance function that best serves the most private tier, at bounded accuracy cost.

    python experiments/tif_search.py --quick               MNIST, 2 epochs, 8 trials of 2 seeds, 2 at a time
    python experiments/tif_search.py --backend ray:auto    the paper's 12 epochs, 32 trials of 3 seeds, 8 at a time
    python experiments/tif_search.py --smoke --trials 4    digits, seconds (the tests)

Objective: the most private tier's recall AUC (%, mean over the seeds), maximised over the Beta(α, β) TIF's α, β
and its tail γ (``tail_fraction``, of the expected batch clip mass) within the spec's ``space``. Constraint:
overall test accuracy at least IDP-SGD's on the same seeds minus ``--max-accuracy-drop`` points; a trial below
it is infeasible and never the answer. Both numbers come from ``experiments.pareto.analyse``, the Pareto sweep's
own table, so a trial reads exactly as a sweep setting does (with its paired change against IDP-SGD).

Optuna's TPE sampler (seeded: the same seed proposes the same trials) proposes one round of ``--parallel``
trials at a time through Optuna's ask-and-tell interface, with the accuracy bound as its constraint. The first
rounds (``n_startup``: at least one round, half the trials, at most 10) are its random start. Each round's runs
(the trial × the seeds, and IDP-SGD's reference runs in the first round) are created as ordinary store rows,
tagged with the search's group id per seed, and trained through ``engine.jobs.kinds.execute_all``: one after
another locally, all at once on Ray, each its own Ray task whose store writes reach the driver. Optuna runs on
the driver only; Ray Tune's trial runner is not used, because its trials would write the run store from the
workers instead of through the driver (the one writer of the lab's store).
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import common, pareto  # noqa: E402
from experiments.common import ConfigError, pm  # noqa: E402
from engine.config.schema import check_int, check_number  # noqa: E402
from engine.figures.export import load_runs

NAME = "tif_search"
PARAMS = ("tail_fraction", "beta", "alpha")
LOG_SCALE = {"tail_fraction"}  # γ spans an order of magnitude: sampled on a log scale


def options(p) -> None:
    p.add_argument("--trials", type=common._positive_int, default=None, help="trials in all (default: the mode's)")
    p.add_argument("--parallel", type=common._positive_int, default=None,
                   help="trials per round, trained at once on Ray (default: the mode's)")
    p.add_argument("--max-accuracy-drop", type=float, default=None,
                   help="points of overall accuracy a trial may lose against IDP-SGD (negative: must gain; "
                        "default: the spec's)")
    p.add_argument("--search-seed", type=int, default=0, help="the sampler's seed (default 0)")


def search_settings(spec: dict, raw: dict, args) -> tuple[dict, int, int, float]:
    """(space, trials, parallel, max accuracy drop) from the spec, the mode's ``search.*`` and the flags."""
    search = {**(spec.get("search") or {}), **{k[7:]: raw.pop(k) for k in list(raw) if k.startswith("search.")}}
    trials = check_int(args.trials or search.get("trials", 16), "search.trials", 1, 10_000)
    parallel = check_int(args.parallel or search.get("parallel", 4), "search.parallel", 1, 1000)
    drop = args.max_accuracy_drop if args.max_accuracy_drop is not None else search.get("max_accuracy_drop", 1.0)
    drop = check_number(drop, "max_accuracy_drop", -100.0, 100.0)
    space = spec.get("space") or {}
    for name in PARAMS:
        bounds = space.get(name)
        if not isinstance(bounds, list) or len(bounds) != 2:
            raise ConfigError(f"space.{name}", "must be [low, high]")
        low = check_number(bounds[0], f"space.{name}[0]", 0.0, low_open=True)
        check_number(bounds[1], f"space.{name}[1]", low, low_open=True)
    return space, trials, parallel, float(drop)


def trial_algorithm(params: dict) -> dict:
    return {"name": "ino", "idp_mode": "sample", "tif": "beta", **{k: float(params[k]) for k in PARAMS}}


def run_experiment(args) -> tuple[dict, str]:
    import optuna
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    spec = common.load_spec_sections(args.config, ("modes", "space"))
    base_from = spec.get("base_from")
    if not isinstance(base_from, str):
        raise ConfigError("base_from", "must name the spec whose base run settings the search uses")
    base = common.load_spec(str(Path(args.config).resolve().parent / base_from))["base"]
    if args.mode not in spec["modes"]:
        raise ConfigError("mode", f"this experiment has no {args.mode} mode (it has: {', '.join(spec['modes'])})")
    raw = dict(spec["modes"][args.mode])
    space, n_trials, parallel, drop = search_settings(spec, raw, args)
    overrides, seeds = common.mode_of({"modes": {args.mode: raw}}, args.mode)
    reference = dict(spec.get("reference", {"name": "idp_sample"}))

    def config(key, algo, seed):
        return common.run_config(base, overrides, algorithm=algo, seed=seed, device=args.device, threads=args.threads,
                                 name=f"{key} seed {seed}")

    ref_config = config("reference", reference, seeds[-1])
    epochs = ref_config.train_epochs or ref_config.epochs
    started = time.time()
    tag = f"{NAME}-{args.mode}-{int(started)}"
    store = common.open_store(common.store_path(args, NAME))
    from experiments.tiered import RunRef

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    n_startup = max(parallel, min(n_trials // 2, 10))
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(
        seed=args.search_seed, n_startup_trials=n_startup))
    dists = {k: optuna.distributions.FloatDistribution(float(space[k][0]), float(space[k][1]), log=k in LOG_SCALE)
             for k in PARAMS}
    grid, refs, trials = [("reference", reference)], [], []
    todo = [("reference", reference)]
    while len(trials) < n_trials:
        asked = [study.ask(dists) for _ in range(min(parallel, n_trials - len(trials)))]
        for t in asked:
            key = f"trial{t.number}"
            grid.append((key, trial_algorithm(t.params)))
            todo.append(grid[-1])
        keys = [(key, s) for key, _ in todo for s in seeds]
        algos = dict(todo)
        trained = common.train_runs(store, [(config(k, algos[k], s), f"{tag}-seed{s}") for k, s in keys],
                                    reuse=args.reuse, backend=args.backend)
        refs += [RunRef(rid, k, s) for (k, s), (rid, _) in zip(keys, trained)]
        table = pareto.analyse(load_runs(store, [r.run_id for r in refs]), refs, grid, seeds, epochs)
        rows = {row["setting"]: row for row in table["settings"]}
        bound = rows["reference"]["accuracy"] - drop
        for t in asked:
            row = rows[f"trial{t.number}"]
            row.update(trial=t.number, alpha=float(t.params["alpha"]), feasible=row["accuracy"] >= bound)
            t.set_constraint("accuracy_bound", bound - row["accuracy"])  # feasible at ≤ 0
            value = row["auc_private"]
            if value is None or not math.isfinite(value):
                study.tell(t, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(t, value)
            trials.append(row)
            sys.stderr.write(f"[{time.time() - started:7.1f}s] trial {t.number}: γ={t.params['tail_fraction']:.3g} "
                             f"β={t.params['beta']:.3g} α={t.params['alpha']:.3g}: AUC {pm(value, None)}, accuracy "
                             f"{row['accuracy']:.2f} ({'within' if row['feasible'] else 'beyond'} the bound)\n")
        todo = []
    feasible = [r for r in trials if r["feasible"] and r["auc_private"] is not None]
    best = max(feasible, key=lambda r: (r["auc_private"], -r["trial"])) if feasible else None
    result = {"mode": args.mode, "tiers": table["tiers"], "seeds": seeds, "n_seeds": len(seeds),
              "sampler": f"optuna TPE (seed {args.search_seed}, {n_startup} random start trials)",
              "space": {k: list(space[k]) for k in PARAMS}, "max_accuracy_drop": drop,
              "accuracy_bound": bound, "reference": rows["reference"], "trials": trials, "best": best,
              "store": str(store.path), "group_ids": [f"{tag}-seed{s}" for s in seeds],
              "run_ids": {f"{r.key}/{r.seed}": r.run_id for r in refs}, "wall_seconds": round(time.time() - started, 1)}
    return result, markdown(result)


def markdown(r: dict) -> str:
    ref = r["reference"]
    lines = [f"TIF search ({r['sampler']}; {len(r['trials'])} trials, mean ± s.e. over n = {r['n_seeds']} seeds): "
             f"maximise the recall AUC of {r['tiers'][0]} (%) with overall accuracy ≥ {r['accuracy_bound']:.2f} % "
             f"(IDP-SGD's {ref['accuracy']:.2f} − {r['max_accuracy_drop']:g})", "",
             "| trial | γ (tail_fraction) | β | α | accuracy (%) | AUC most private | paired AUC change vs IDP | "
             "within the accuracy bound |", "|---|---|---|---|---|---|---|---|",
             f"| IDP-SGD | — | — | — | {pm(ref['accuracy'], ref['accuracy_se'])} | "
             f"{pm(ref['auc_private'], ref['auc_private_se'])} | — | — |"]
    for row in r["trials"]:
        lines.append(f"| {row['trial']} | {row['tail_fraction']:.3g} | {row['beta']:.3g} | {row['alpha']:.3g} | "
                     f"{pm(row['accuracy'], row['accuracy_se'])} | {pm(row['auc_private'], row['auc_private_se'])} | "
                     f"{pm(row['auc_private_change'], row['auc_private_change_se'])} | "
                     f"{'yes' if row['feasible'] else 'no'} |")
    best = r["best"]
    lines += ["", "No trial kept the accuracy within the bound." if best is None else
              f"Best within the bound: trial {best['trial']} (γ = {best['tail_fraction']:.3g}, β = {best['beta']:.3g}, "
              f"α = {best['alpha']:.3g}): AUC {pm(best['auc_private'], best['auc_private_se'])} %, "
              f"{pm(best['auc_private_change'], best['auc_private_change_se'])} points against IDP-SGD, accuracy "
              f"{best['accuracy']:.2f} %."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    common.main(NAME, __doc__, run_experiment, argv, extra=options)


if __name__ == "__main__":
    main()
