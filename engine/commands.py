"""The command line's commands that need the engine's heavy modules (torch, pandas, the audits, the figures):
``run, rerun, plan, show, cancel, audit, one-run-audit, export, worker``. :mod:`engine.cli` parses the command line
and imports this module only once a command is parsed that needs it, so ``--help``, a mistyped command, ``list``
and ``app`` answer without importing torch (issue 60).
"""
from __future__ import annotations

import json
import sys

from engine.audit.pa_alooa.config import load_audit_config
from engine.audit.one_run.config import OneRunConfig, load_one_run_config
from engine.audit.one_run.report import one_run_table
from engine.audit.pa_alooa.presets import preset
from engine.audit.pa_alooa.summary import compact_summary, summary_table
from engine.config.job import algorithms_advisories
from engine.config.run import RunConfig, check_plan_request, load_config
from engine.config.schema import ConfigError, replace_dotted
from engine.config.run import MAX_TIERS
from engine.data.table_records import TableSchema
from engine.data.uploads import table_changed
from engine.data.user_table import preview_table
from engine.dp import accounting
from engine.dp.prepare import load_run_dataset, make_plan, plan_errors, prepare_data, total_steps
from engine.figures.common_span import common_span
from engine.figures.export import export_runs, load_runs
from engine.jobs.kinds import JOB_KINDS, execute, rerun_of
from engine.jobs.runs import diverged_note
from engine.jobs.worker import run_worker
from engine.jobs.manager import JobManager, new_group_id
from engine.store.db import ACTIVE, RunStore, resolve_store_path
from engine.store.lifecycle import Cancelled
from engine.train.records import individual_table, tier_table

def _store(args, *, readonly: bool = False) -> RunStore:
    return RunStore(args.store, readonly=readonly)


def cmd_run(args) -> int:
    config = load_config(args.config)
    if args.algorithm:
        config = config.replace(**{"algorithm.name": args.algorithm}).validate()
    config = apply_overrides(config, args.overrides)
    n_train = _print_data_report(config)  # first: a dataset that cannot load is the one message (not a warning)
    _print_advisories(config.advisories(n_train))
    store = _store(args)
    store.mark_dead_runs()  # a writer records runs whose worker died (e.g. kill -9 of an earlier `run`)
    ids = args.started = store.create_job(config.seed_configs(), status="queued")

    execute(store, ids[0], config.job_config(), kind="train", progress=not args.json)
    _print_job(store, ids, args, lambda run_id, run: f"run {run_id}{_seed_note(run)}: {config.label} on "
                                                      f"{config.data.name} — {_ended(run)}")
    return 0


def _print_job(store, ids, args, header, *, extra=None, table=tier_table) -> None:
    """The result of a job's rows: one JSON line (row 0's summary, and ``per_seed`` rows for k > 1), or a
    header and summary table per row."""
    runs = [store.get_run(i) for i in ids]
    if args.json:
        out = {"run_id": ids[0], **(extra or {}), **(runs[0]["summary"] or {})}
        if len(ids) > 1:
            out.update(run_ids=ids, per_seed=[{"run_id": r["id"], **(r["summary"] or {})} for r in runs])
        print(json.dumps(out, sort_keys=True, default=str))
        return
    for run_id, run in zip(ids, runs):
        print(header(run_id, run))
        if run["summary"]:
            print(table(run["summary"]))


def _ended(run: dict) -> str:
    """How a run ended, in the lab's words: its status, or the diverged run's sentence."""
    return diverged_note(run) or run["status"]


def _seed_note(run: dict) -> str:
    """' (seed S, j+1 of k in job #L)' for a row of a k-seed job, else ''."""
    if (run.get("seeds") or 1) <= 1:
        return ""
    return f" (seed {run['seed']}, {run['seed_index'] + 1} of {run['seeds']} in job #{run['job_id']})"


def _print_advisories(advisories: list[ConfigError]) -> None:
    """Valid settings far from what trains or that the algorithm ignores (``RunConfig.advisories``, an audit's
    ``algorithms_advisories``): one warning line each, then the command goes on."""
    for e in advisories:
        print(f"warning: {e}", file=sys.stderr)


def _job_advisories(job, config, n_train: int | None = None) -> list[ConfigError]:
    """A job config's advisories: its run's (data, optimizer; a training run's algorithm and, with its training-set
    size ``n_train``, its batch) and, for a job that trains one run per algorithm (the audits), each of its
    ``algorithms``' ignored fields, named ``algorithms[k].field``."""
    run, algorithms = job.run_config(config), job.algorithms(config)
    if len(algorithms) == 1 and algorithms[0] is run.algorithm:  # a training run: its own algorithm
        return run.advisories(n_train)
    return run.advisories() + algorithms_advisories(algorithms)


def _print_data_report(config: RunConfig) -> int:
    """Load the run's dataset (cached: training reuses it) and say which files were skipped, if any; its number of
    training samples."""
    ds = load_run_dataset(config)
    if ds.report.skipped:
        print(f"note: {ds.report}", file=sys.stderr)
    return len(ds.y_train)


def cmd_worker(args) -> int:
    """Run a queued run from the store (started by the dashboard's job manager): :func:`engine.jobs.worker.run_worker`."""
    return run_worker(args.store, args.run_id, threads=args.threads, prepared=args.prepared)


PLAN_FLAGS = {"mode": "--mode", "epsilons": "--epsilons", "tier_sizes": "--tier-sizes", "delta": "--delta",
              "batch_size": "--batch-size", "clip_norm": "--clip-norm", "steps": "--steps",
              "allow_large": "--allow-large"}
# without a CONFIG: a run config's defaults (its δ and clip norm), planned for SAMPLE
PLAN_DEFAULTS = {"mode": "sample", "delta": RunConfig().delta, "clip_norm": RunConfig().clip_norm,
                 "allow_large": RunConfig().allow_large}


def cmd_plan(args) -> int:
    if args.config:
        given = [flag for name, flag in PLAN_FLAGS.items() if getattr(args, name) not in (None, False)]
        if given:  # a run config's plan is the config's: a flag beside it would be ignored
            raise ConfigError(given[0], "plans without a CONFIG only; set the field in the config (or use "
                                        "`rerun --set`) instead")
        config = load_config(args.config)
        if args.accountant is not None:
            config = config.replace(accountant=args.accountant).validate()
        data = prepare_data(config)
        config = data.config  # tiers from a budget column: made from the table
        if data.dataset.report.skipped:
            print(f"note: {data.dataset.report}", file=sys.stderr)
        _print_advisories(config.advisories(len(data.dataset.y_train)))
        steps = total_steps(config, len(data.dataset.y_train))
        plan = make_plan(config, data.tiers.sizes, steps)
        names = data.tiers.names
        if plan is None:
            print("non-private run: no plan")
            return 0
        rdp = plan if plan.accountant == "rdp" else make_plan(config.replace(accountant="rdp"), data.tiers.sizes, steps)
    else:
        missing = [n for n in ("epsilons", "tier_sizes", "batch_size", "steps") if getattr(args, n) is None]
        if missing:
            raise ConfigError(PLAN_FLAGS[missing[0]], "is required without a CONFIG (see --help)")
        flags = {name: getattr(args, name) if getattr(args, name) is not None else default
                 for name, default in PLAN_DEFAULTS.items()}
        kw = dict(mode=flags["mode"], epsilons=args.epsilons, delta=flags["delta"], tier_sizes=args.tier_sizes,
                  batch_size=args.batch_size, clip_norm=flags["clip_norm"], steps=args.steps)
        # the checks and caps a run config's fields have: the planner is never asked what a run config refuses
        check_plan_request(**{k: v for k, v in kw.items() if k != "mode"}, allow_large=flags["allow_large"],
                           fields=PLAN_FLAGS, lift="give --allow-large")
        with plan_errors("plan"):
            plan = accounting.plan(**kw, accountant=args.accountant or "rdp")
        rdp = plan
        if plan.accountant != "rdp":
            with plan_errors("plan", "no RDP plan beside it: "):
                rdp = accounting.plan(**kw)
        names = [f"tier {k}" for k in range(len(plan.sample_rates))]
    if args.json:
        print(json.dumps(plan.to_dict(), sort_keys=True))
        return 0
    print(f"mode {plan.mode} under {plan.accountant}: noise multiplier σ = {plan.noise_multiplier:.5f}, noise std = "
          f"{plan.noise_std:.5f}, expected batch = {plan.expected_batch_size:.1f}, T = {plan.steps}, δ = {plan.delta:g}")
    beside = rdp is not plan
    if beside:
        print(accounting.noise_saved_sentence(plan.accountant, plan.noise_multiplier, rdp.noise_multiplier))
    print(f"{'tier':<28} {'size':>7} {'q':>10} {'C':>8} {'ε target':>9} {'ε':>9}"
          + (f" {'q (rdp)':>10} {'C (rdp)':>8}" if beside else ""))
    for k, name in enumerate(names):
        print(f"{name[:28]:<28} {plan.tier_sizes[k]:>7} {plan.sample_rates[k]:>10.6f} {plan.clip_norms[k]:>8.4f} "
              f"{plan.target_epsilons[k]:>9.4f} {plan.epsilons[k]:>9.4f}"
              + (f" {rdp.sample_rates[k]:>10.6f} {rdp.clip_norms[k]:>8.4f}" if beside else ""))
    return 0


def cmd_show(args) -> int:
    store = _store(args, readonly=True)
    run = store.get_run(args.run_id)
    if run is None:
        raise ConfigError("run_id", f"no run {args.run_id} in {store.path}")
    individual = (run.get("summary") or {}).get("individual_epsilon")
    if args.json:
        # the section a reader looks for: each group's individual ε quantiles, per grouping (RunSummary's own)
        print(json.dumps({**run, "individual_epsilon": individual}, sort_keys=True, default=str))
        return 0
    print(f"run {run['id']} [{run['status']}] {run['name'] or run['algorithm']}  kind={run['kind']}"
          + _seed_note(run))
    if (run.get("seeds") or 1) > 1:
        print(f"job rows: {', '.join(str(i) for i in store.job_rows(run['id']))}")
    if run["error"]:
        print(f"error: {run['error']}")
    if diverged_note(run):
        print(diverged_note(run))
    kind = JOB_KINDS.get(run["kind"])
    if run["summary"] and kind is not None:  # the result first, then the config that made it, one field a line
        print(kind.summary_table(run["summary"]))
        if individual:
            print(individual_table(run["summary"]))
    print("config:")
    print(json.dumps(run["config"], sort_keys=True, indent=2, ensure_ascii=False))
    return 0


def cmd_cancel(args) -> int:
    """``privacy-lab cancel RUN_ID``: stop a queued or running run (a k-seed job's row stops its whole job): the
    worker gets SIGTERM, then SIGKILL after a grace period; what it logged is kept."""
    store = _store(args)
    if store.get_run(args.run_id) is None:
        raise ConfigError("run_id", f"no run {args.run_id} in {store.path}")
    manager = JobManager(store.path, autostart=False, prewarm=False)
    before = store.get_run(args.run_id)["status"]
    status = manager.cancel(args.run_id, wait=True)
    if before not in ACTIVE:
        print(f"run {args.run_id} is not active ({before}): nothing to cancel")
    else:
        print(f"run {args.run_id}: {status}")
    return 0


def cmd_audit(args) -> int:
    """``python -m engine audit CONFIG.json | --preset NAME [--set k=v ...] [--json] [--controls]``: run an audit in
    this process, into the store (opened once the config holds: a refused command creates no store file)."""
    preset_name = getattr(args, "preset", None)
    if (args.config is None) == (preset_name is None):
        raise ConfigError("config", "give either a config file or --preset NAME (not both)")
    if preset_name is not None:
        config = preset(preset_name).validate()
    else:
        config = load_audit_config(args.config)
    if getattr(args, "controls", False):  # DP-SGD-S's noise- and accuracy-matched DP-SGD controls
        config = config.replace(controls=True).validate()
    config = apply_overrides(config, getattr(args, "overrides", None))
    _print_advisories(_job_advisories(JOB_KINDS["audit"], config))
    run_id, report = _execute_here(args, _store(args), config, kind="audit", label="audit", progress=not args.json)
    if args.json:
        print(json.dumps({"run_id": run_id, **compact_summary(report)}, sort_keys=True))
    else:
        print(f"audit run {run_id} — finished")
        print(summary_table(report))
    return 0


def _execute_here(args, store, config, *, kind: str, label: str, progress: bool):
    """Store ``config`` as a new run of ``kind`` and run it in this process: (its id, the result). Its id goes on
    ``args.started``, for :func:`engine.cli.main`'s one line if it is stopped (``cancel`` from another shell, Ctrl-C)."""
    run_id = store.create_run(config.to_dict(), kind=kind, status="queued", name=config.name or label)
    args.started = [run_id]
    return run_id, execute(store, run_id, config, kind=kind, progress=progress)


def cmd_one_run(args) -> int:
    """``python -m engine one-run-audit [CONFIG.json] [--set k=v ...] [--json]``: per-tier empirical ε from one run
    per algorithm (white-box gradient and black-box input canaries), in this process, into the store."""
    config = load_one_run_config(args.config) if args.config else OneRunConfig()
    config = apply_overrides(config, args.overrides)
    _print_advisories(_job_advisories(JOB_KINDS["one_run"], config))
    run_id, report = _execute_here(args, _store(args), config, kind="one_run", label="one-run audit",
                                   progress=not args.json)
    if args.json:
        frame = report.frame()
        print(json.dumps({"run_id": run_id, "rows": json.loads(frame.to_json(orient="records")),
                          "broken": bool(len(report.violations()))}, sort_keys=True))
    else:
        print(f"one-run audit {run_id} — finished")
        print(one_run_table(report.to_dict()))
    return 0


def parse_override(text: str) -> tuple[str, object]:
    """``dotted.key=JSON_VALUE`` → (key, value); a value that is not JSON is taken as a string."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError("--set", f"expected dotted.key=JSON_VALUE, got {text[:80]!r}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return key, value


def apply_overrides(config, overrides: list[str]):
    """``config`` with each ``dotted.key=JSON_VALUE`` applied (``engine.config.schema.replace_dotted``: every value
    type-checked against the field's annotation), then validated. Unknown keys and wrong values raise one
    ConfigError naming the dotted key."""
    for text in overrides or ():
        key, value = parse_override(text)
        config = replace_dotted(config, key, value, checked=True)
    return config.validate() or config


def cmd_rerun(args) -> int:
    """A stored run's config, with ``--set`` overrides, as a new run of the same kind; a row of a k-seed
    job re-runs the whole job (the overrides apply to the job's config: base seed, seed_index 0)."""
    old = _store(args, readonly=True).get_run(args.run_id)  # (a missing store is said, not created)
    if old is None:
        raise ConfigError("run_id", f"no run {args.run_id} in {resolve_store_path(args.store)}")
    job, config = rerun_of(old)
    config = apply_overrides(config, args.overrides)
    _check_table_unchanged(old, job.run_config(config), accept=args.accept_changed_data)
    store = _store(args)
    store.mark_dead_runs()
    n_train = _print_data_report(job.run_config(config))
    _print_advisories(_job_advisories(job, config, n_train))
    rows = job.rows(config)
    # a new comparison of its own unless --join: a re-run with other settings must not change the old one's figures
    group = old.get("group_id") if args.join and old.get("group_id") else new_group_id(job.group_prefix)
    ids = args.started = store.create_job(rows, kind=job.name, status="queued", group_id=group)
    execute(store, ids[0], rows[0], kind=job.name, progress=not args.json)
    joined = "joined its comparison" if group == old.get("group_id") else "a new comparison"
    _print_job(store, ids, args, lambda run_id, run: f"run {run_id}{_seed_note(run)} (re-run of {args.run_id}; "
                                                      f"{joined} {group}) — {_ended(run)}",
               extra={"rerun_of": args.run_id, "group_id": group}, table=job.summary_table)
    return 0


ACCEPT_CHANGED_DATA = "--accept-changed-data"


def _check_table_unchanged(old: dict, config: RunConfig, *, accept: bool) -> None:
    """A re-run of a run on a researcher's table trains on the bytes the run recorded (its plan's ``table``:
    sha256, size, schema): a file changed since is one ConfigError line, unless ``accept`` (the flag)."""
    recorded = (old.get("plan") or {}).get("table")
    if accept or not recorded or config.data.file is None or config.data.file != recorded["schema"]["file"]:
        return
    changed = table_changed(config.data.file, recorded["sha256"], data_dir=config.data.data_dir)
    if changed:
        raise ConfigError("data.file", f"{changed}; re-run with {ACCEPT_CHANGED_DATA} to train on the new content")


def cmd_data(args) -> int:
    """The dry run of a researcher's table: read, encode and split it (the cache is then warm for training) and
    print its preview (rows, the encoding rule, classes, groups, tiers from budgets); a bad table: one line."""
    schema = TableSchema(file=args.file, label=args.label, attributes=tuple(args.attributes or ()),
                         features=None if args.features is None else tuple(args.features),
                         categorical=tuple(args.categorical or ()), split=args.split, budget=args.budget_column,
                         bins=None if args.bins is None else tuple(args.bins))
    preview = preview_table(schema, max_tiers=MAX_TIERS)
    if args.json:
        print(json.dumps(preview.to_dict(), sort_keys=True))
    else:
        print("\n".join(preview.lines()))
    return 0


def cmd_export(args) -> int:
    store = _store(args, readonly=True)
    paths = export_runs(store, args.run_ids, formats=args.formats or ["png"], out_dir=args.out,
                        width=args.width, height=args.height, scale=args.scale, theme=args.theme)
    for path in paths:
        print(path)
    words = common_span(load_runs(store, args.run_ids)).words()
    if words is not None:  # the comparisons were cut to the steps every run reached: say it where the user looks
        print(f"note: the figures compare the runs {words}", file=sys.stderr)
    return 0
