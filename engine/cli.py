"""Command line: ``privacy-lab`` (installed) or ``python -m engine``, with the subcommands
``run, rerun, plan, show, list [--active], cancel, export, audit, one-run-audit, data, worker, app``. This module
builds the parser and runs ``list`` and ``app`` itself; the commands that train, plan, audit or draw live in
:mod:`engine.commands`, imported once such a command is parsed.

``rerun RUN_ID --set dotted.key=JSON`` re-runs a stored run's config as a new run (overrides typed and
validated like a config file); ``run CONFIG --set …`` takes the same overrides. Seeds: ``--set seeds=K``
trains K models together (one job, one row per seed: ``list`` shows each row with its seed and job).
``rerun`` of any row of a K-seed job re-runs the whole job (base seed = the row's seed − seed_index, the
overrides applied to that job config); ``--set seeds=1 --set seed=S`` re-runs one seed S on its own. ``app`` starts the dashboard (``streamlit run`` of the installed app.py,
bound to 127.0.0.1) and ends it with itself. ``--data-dir`` sets ``$PRIVACY_LAB_DATA_DIR`` for the command.

Configuration errors print one line (``error: <field>: <message>``) and exit with code 2; so do data
errors, run-store errors (a corrupt, read-only, missing or full store: the line names the file) and, as a
last resort, any other ``sqlite3.Error`` or ``OSError``. ``--debug`` adds the traceback.

``list``, ``show`` and ``export`` open the store read-only (they never write, and a missing store is an
error); a run whose worker died on this host is shown as ``interrupted`` there and recorded as such the
next time a writer (``run``, the dashboard) opens the store.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

from engine.config.backend import BACKEND_ENV, BackendConfig
from engine.config.limits import ACCOUNTANTS, DEFAULT_CLIP_NORM, DEFAULT_DELTA
from engine.config.schema import ConfigError
from engine.jobs.exiting import exit_process
from engine.store.db import ACTIVE, RunStore, resolve_store_path
from engine.store.errors import StoreError
from engine.store.lifecycle import INTERRUPTED, Cancelled, error_line

EXIT_CONFIG = 2
# a foreground command stopped: the shell's conventions, 128 + the signal (SIGINT: Ctrl-C; SIGTERM: `cancel`)
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143
STOPPED_NOTE = "is recorded as cancelled, with what it logged so far"


def stopped_line(reason: str, started) -> str:
    """The one line of a foreground command stopped by ``cancel`` or Ctrl-C, naming the runs it had started."""
    if not started:
        return f"stopped: {reason}"
    ids = ", ".join(str(i) for i in started)
    return f"stopped: {reason}; run {ids} {STOPPED_NOTE}" if len(started) == 1 else \
        f"stopped: {reason}; runs {ids} are recorded as cancelled, with what they logged so far"


def _port(text: str) -> int:
    """A TCP port number (1–65535), for ``app --port``."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number (1-65535), got {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number (1-65535), got {port}")
    return port


def port_is_free(port: int) -> bool:
    """Whether a server can listen on 127.0.0.1:``port`` now (Streamlit would otherwise end in a traceback)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _command(name: str):
    """The subcommand ``name`` of :mod:`engine.commands`, imported when it runs, not when the parser is built:
    ``--help``, a typo, ``list`` and ``app`` never pay for torch, pandas and the audits (~5 CPU-s)."""
    def run(args) -> int:
        from engine import commands  # deferred on purpose (tests/test_layers.py: DEFERRED_IMPORTS)

        return getattr(commands, name)(args)

    run.__name__ = name
    return run


def cmd_list(args) -> int:
    store = RunStore(args.store, readonly=True)
    runs = store.list_runs()
    if getattr(args, "active", False):  # queued or running (runs outlive the dashboard: see README)
        runs = [r for r in runs if r["status"] in ACTIVE]
    if args.json:
        print(json.dumps([{k: r[k] for k in ("id", "kind", "name", "algorithm", "status", "step", "total_steps",
                                              "group_id", "seed", "seed_index", "seeds", "job_id")}
                          for r in runs]))
        return 0
    rows = [(str(r["id"]), r["kind"], r["algorithm"] or "", r["status"], f"{r['step']}/{r['total_steps'] or '?'}",
             "" if r["seed"] is None else str(r["seed"]),
             f"{r['seed_index'] + 1}/{r['seeds']} #{r['job_id']}" if (r.get("seeds") or 1) > 1 else "", r["name"] or "")
            for r in runs]
    print(list_table(rows))
    return 0


LIST_COLUMNS = (("id", ">"), ("kind", "<"), ("algorithm", "<"), ("status", "<"), ("progress", ">"), ("seed", ">"),
                ("job", ">"), ("name", "<"))


def list_table(rows: list[tuple[str, ...]]) -> str:
    """``list``'s table: each column as wide as its widest cell (a kind such as one_run, a long status), the name
    last and unpadded."""
    widths = [max([len(name), *(len(row[k]) for row in rows)]) for k, (name, _) in enumerate(LIST_COLUMNS)]
    lines = []
    for cells in [tuple(name for name, _ in LIST_COLUMNS), *rows]:
        head = [f"{cell:{align}{width}}" for cell, (_, align), width in zip(cells[:-1], LIST_COLUMNS, widths)]
        lines.append(" ".join(head) + "  " + cells[-1])
    return "\n".join(line.rstrip() for line in lines)


def app_path() -> str:
    """The dashboard's app.py: beside the engine package in a checkout (or an editable install), else
    the installed ``privacy_lab_app`` package's."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for p in (root / "app.py", root / "privacy_lab_app" / "app.py"):
        if p.is_file():
            return str(p)
    raise ConfigError("app", "app.py was not found beside the engine package (reinstall privacy-imbalance-lab)")


def cmd_app(args) -> int:
    """``streamlit run`` of the installed app.py on 127.0.0.1; SIGTERM/SIGINT go to the child, which
    ends with this process."""
    import signal
    import subprocess

    if not port_is_free(args.port):
        raise ConfigError("--port", f"127.0.0.1:{args.port} is in use (another dashboard?): choose another --port")
    cmd = [sys.executable, "-m", "streamlit", "run", app_path(), "--server.address", "127.0.0.1",
           "--server.port", str(args.port), "--server.headless", "true", *args.streamlit_args]
    env = dict(os.environ)
    env["PRIVACY_LAB_STORE"] = str(resolve_store_path(args.store).resolve())
    if env.get("PRIVACY_LAB_DATA_DIR"):
        env["PRIVACY_LAB_DATA_DIR"] = os.path.abspath(env["PRIVACY_LAB_DATA_DIR"])
    # run in app.py's folder: Streamlit reads .streamlit/config.toml from the working directory
    child = subprocess.Popen(cmd, env=env, cwd=os.path.dirname(cmd[4]))

    def forward(signum, _frame):
        if child.poll() is None:
            child.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:
                continue
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr and exit status 2, as every other bad input of the lab (the
    usage is one ``--help`` away, and the line says so); its subcommands' parsers are of this class too."""

    def error(self, message):  # noqa: D401 - argparse's hook
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        raise SystemExit(EXIT_CONFIG)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="privacy-lab", description="Privacy Imbalance Lab engine")
    p.add_argument("--store", default=os.environ.get("PRIVACY_LAB_STORE"),
                   help="run store (SQLite file or folder); default $PRIVACY_LAB_STORE or ~/.privacy-imbalance-lab")
    p.add_argument("--data-dir", dest="data_dir", help="data folder (sets $PRIVACY_LAB_DATA_DIR for this command)")
    p.add_argument("--debug", action="store_true", help="print the traceback of an error (after its one-line message)")
    p.add_argument("--backend", help="where jobs train: local (default), ray (an instance on this "
                                     "machine, 127.0.0.1), ray:auto or ray://HOST:PORT (a cluster); sets "
                                     "$PRIVACY_LAB_BACKEND for this command and the workers it starts")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="train one run from a JSON config")
    r.add_argument("config", help="the run config (JSON; docs/CONFIG.md)")
    r.add_argument("--algorithm", help="override algorithm.name")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=JSON_VALUE",
                   help="change one config field, e.g. --set seeds=3 (three seeds trained together) --set epochs=4 "
                        "(repeatable)")
    r.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    r.set_defaults(func=_command("cmd_run"))

    rr = sub.add_parser("rerun", help="re-run a stored run (train or audit) as a new run, with overrides")
    rr.add_argument("run_id", type=int, help="the stored run to train again (privacy-lab list)")
    rr.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=JSON_VALUE",
                    help="change one config field, e.g. --set epochs=4 --set algorithm.name='\"ino\"' (repeatable); "
                         "a row of a k-seed job re-runs the whole job, --set seeds=1 --set seed=S one seed alone")
    rr.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    rr.add_argument("--join", action="store_true",
                    help="add the new run to the original run's comparison (default: a new comparison of its own)")
    rr.add_argument("--data-dir", dest="data_dir", default=argparse.SUPPRESS, help="as the global --data-dir")
    rr.add_argument("--accept-changed-data", dest="accept_changed_data", action="store_true",
                    help="re-run a run on your own table even though the file changed since (default: stop, saying so)")
    rr.set_defaults(func=_command("cmd_rerun"))

    dt = sub.add_parser("data", help="dry run of your own table: read, encode and split it, print its preview")
    dt.add_argument("file", help="a CSV (.csv, .csv.gz) or Parquet table; a relative path resolves in the data "
                                 "folder, then the current one")
    dt.add_argument("--label", required=True, help="the target column")
    dt.add_argument("--attributes", nargs="+", metavar="COLUMN", help="sensitive-attribute columns (groups, audits)")
    dt.add_argument("--features", nargs="+", metavar="COLUMN", help="feature columns (default: every other column)")
    dt.add_argument("--categorical", nargs="+", metavar="COLUMN",
                    help="columns read as categories even when they hold numbers")
    dt.add_argument("--split", metavar="COLUMN", help='a column of "train" / "test" (default: a seeded stratified '
                                                      "split)")
    dt.add_argument("--budget-column", dest="budget_column", metavar="COLUMN",
                    help="each owner's ε (tiers.assign \"column\"): one tier per distinct budget")
    dt.add_argument("--bins", nargs="+", type=float, metavar="EDGE",
                    help="upper edges grouping the budgets into tiers (tiers.bins), e.g. --bins 1 2 4 8")
    dt.add_argument("--json", action="store_true", help="print the preview as one JSON line")
    dt.set_defaults(func=_command("cmd_data"))

    pl = sub.add_parser("plan", help="per-tier sampling rates, clip norms and noise")
    pl.add_argument("config", nargs="?", help="plan for this run config (else use the flags)")
    pl.add_argument("--mode", choices=("dpsgd", "sample", "scale"), help="without a CONFIG (default: sample)")
    pl.add_argument("--epsilons", type=float, nargs="+", help="without a CONFIG: each tier's ε")
    pl.add_argument("--tier-sizes", dest="tier_sizes", type=int, nargs="+",
                    help="without a CONFIG: each tier's number of samples")
    pl.add_argument("--delta", type=float,
                    help=f"without a CONFIG (default: {DEFAULT_DELTA:g}; at most a run config's cap)")
    pl.add_argument("--batch-size", dest="batch_size", type=int, help="without a CONFIG: the expected batch")
    pl.add_argument("--clip-norm", dest="clip_norm", type=float,
                    help=f"without a CONFIG (default: {DEFAULT_CLIP_NORM:g})")
    pl.add_argument("--steps", type=int, help="without a CONFIG: optimizer steps (capped as a run config's are)")
    pl.add_argument("--allow-large", dest="allow_large", action="store_true",
                    help="without a CONFIG: lift the cap on steps (a run config's \"allow_large\")")
    pl.add_argument("--accountant", choices=ACCOUNTANTS, default=None,
                    help="whose ε the plan meets (default: the CONFIG's, else rdp); not rdp: RDP's q and C beside")
    pl.add_argument("--json", action="store_true", help="print the plan as one JSON line")
    pl.set_defaults(func=_command("cmd_plan"))

    s = sub.add_parser("show", help="one run's config, status and per-tier summary")
    s.add_argument("run_id", type=int, help="the run (privacy-lab list)")
    s.add_argument("--json", action="store_true", help="print the whole run record as one JSON line")
    s.set_defaults(func=_command("cmd_show"))

    ls = sub.add_parser("list", help="all runs in the store")
    ls.add_argument("--json", action="store_true", help="print the runs as one JSON list")
    ls.add_argument("--active", action="store_true", help="only queued and running runs")
    ls.set_defaults(func=cmd_list)

    ca = sub.add_parser("cancel", help="stop a queued or running run (its worker keeps what it logged)")
    ca.add_argument("run_id", type=int, help="the run to stop (a row of a k-seed job stops its whole job)")
    ca.set_defaults(func=_command("cmd_cancel"))

    au = sub.add_parser("audit", help="PA-ALOOA membership audit from a JSON audit config or a preset")
    au.add_argument("config", nargs="?", help="JSON audit config file (or give --preset)")
    au.add_argument("--preset", help="a named audit (engine.audit.pa_alooa.presets): quick, quick-eps1, adult-paper, "
                                     "mnist-paper")
    au.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=JSON_VALUE",
                    help="change one field, e.g. --set R=16 --set run.model.name=cnn (repeatable)")
    au.add_argument("--json", action="store_true", help="print the result summary as one JSON line")
    au.add_argument("--controls", action="store_true",
                    help="add DP-SGD-S's controls: DP-SGD at the noise DP-SGD-S realised and at its accuracy, "
                         "compared with it pairwise (needs dpsgd_s and dpsgd among the algorithms)")
    au.set_defaults(func=_command("cmd_audit"))

    o1 = sub.add_parser("one-run-audit", help="per-tier empirical ε lower bounds from one training run per algorithm "
                                               "(canaries; Steinke et al. 2023)")
    o1.add_argument("config", nargs="?", help="JSON one-run audit config (default: digits, paper tiers, five algorithms)")
    o1.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=JSON_VALUE",
                    help="change one field, e.g. --set run.data.name='\"mnist\"' --set canaries=1000 (repeatable)")
    o1.add_argument("--json", action="store_true", help="print the per-tier rows as one JSON line")
    o1.set_defaults(func=_command("cmd_one_run"))

    ex = sub.add_parser("export", help="export figures of runs (png, svg, pdf, html, csv, json)")
    ex.add_argument("run_ids", type=int, nargs="+", help="the runs whose figures to export, compared with each other")
    ex.add_argument("--format", dest="formats", action="append", choices=("png", "svg", "pdf", "html", "csv", "json"),
                    help="a format to write; repeat it for several (--format png --format csv); default png")
    ex.add_argument("--out", default="export", help="the folder to write into (default: export)")
    ex.add_argument("--width", type=int, default=1000, help="figure width in pixels (default: 1000)")
    ex.add_argument("--height", type=int, default=600, help="figure height in pixels (default: 600)")
    ex.add_argument("--scale", type=float, default=2.0, help="pixel scale of PNG exports (default: 2)")
    ex.add_argument("--theme", default="light", choices=("light", "dark"), help="figure theme (default: light)")
    ex.set_defaults(func=_command("cmd_export"))

    ap = sub.add_parser("app", help="start the dashboard (streamlit run app.py on 127.0.0.1)")
    ap.add_argument("--port", type=_port, default=8501, help="the port on 127.0.0.1 (default: 8501; it must be free)")
    ap.epilog = "Other options (e.g. --theme.base dark) are passed to streamlit run."
    ap.set_defaults(func=cmd_app)

    w = sub.add_parser("worker", help="(internal) execute a queued run from the store")
    w.add_argument("run_id", type=int, help="the queued run")
    w.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    w.set_defaults(func=_command("cmd_worker"))
    return p


def main(argv=None, *, prepared=None) -> int:
    """``prepared``: for ``worker``, config → its ready preparation or None (the standby's head start)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "app":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.streamlit_args = [a for a in extra if a != "--"]
    args.prepared = prepared
    if args.data_dir:
        os.environ["PRIVACY_LAB_DATA_DIR"] = os.path.abspath(os.path.expanduser(args.data_dir))
        if not os.path.isdir(os.environ["PRIVACY_LAB_DATA_DIR"]):  # said, not refused: shipped datasets still load
            print(f"warning: --data-dir: {args.data_dir!r} is not a folder: only the datasets the lab ships "
                  "(digits, MNIST, Adult) will load", file=sys.stderr)
    try:
        if args.backend is not None:
            os.environ[BACKEND_ENV] = BackendConfig.parse(args.backend, field="--backend").spec()
        return args.func(args)
    except Cancelled as e:  # SIGTERM (`privacy-lab cancel N` from another shell): one line, no traceback
        print(stopped_line(str(e), getattr(args, "started", None)), file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print(stopped_line(INTERRUPTED, getattr(args, "started", None)), file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - one clear line, no traceback (unknown kinds of error propagate)
        err, message = e, error_line(e, store_path=args.store)
        if message is None:
            raise
        if not isinstance(e, (ConfigError, StoreError)) and not args.debug:
            message += " (run again with --debug for the traceback)"
    if args.debug:
        traceback.print_exception(err)
    print(f"error: {message}", file=sys.stderr)
    return EXIT_CONFIG


def console_main() -> None:
    """The ``privacy-lab`` command and ``python -m engine``: :func:`main`, then the process's quick exit
    (``engine.jobs.exiting``: no final garbage collection, about a second less per command)."""
    exit_process(main())
