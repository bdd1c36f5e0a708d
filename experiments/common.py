"""What every experiment script shares: its command line, its JSON spec, the run store and the figure export.

An experiment spec (``experiments/<name>.json``) holds a ``base`` run config (engine JSON), named
``algorithms`` and ``modes`` (``quick``, ``full``, ``smoke``), each mode a dict of dotted overrides of the
base (``"epochs": 2``, ``"data.max_train": 300``) plus its ``seeds``. The scripts only build engine configs
from it and run them through the engine (``engine.jobs.kinds.execute``, kind "train" or "audit"); nothing here trains.

Bad input (arguments, a spec, a config) ends the script with one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # scripts run as `python experiments/x.py` from anywhere
    sys.path.insert(0, str(ROOT))

from engine.config.run import RunConfig  # noqa: E402
from engine.config.schema import ConfigError  # noqa: E402
from engine.config.schema import check_int, check_list, parse_config_json, read_config_text  # noqa: E402
from engine.config.backend import BackendConfig  # noqa: E402
from engine.data.errors import DataError  # noqa: E402
from engine.figures.bands import mean_se as bands_mean_se  # noqa: E402
from engine.figures.export import ExportUnavailable, figure_bytes  # noqa: E402
from engine.jobs.kinds import execute_all  # noqa: E402
from engine.store.db import RunStore  # noqa: E402
from engine.train.records import RunSummary  # noqa: E402

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"  # git-ignored
MODES = ("quick", "full", "smoke")


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr and exit status 2."""

    def error(self, message):  # noqa: D401 - argparse's hook
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def parser(name: str, description: str, extra=None) -> OneLineParser:
    """Every experiment's command line; ``extra(p)`` adds the script's own options."""
    p = OneLineParser(prog=name, description=description)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick",
                      help="CPU-sized run (about 20 minutes on 2 cores)")
    mode.add_argument("--full", dest="mode", action="store_const", const="full",
                      help="the papers' settings (default; CPU overnight or a GPU)")
    mode.add_argument("--smoke", dest="mode", action="store_const", const="smoke",
                      help="a tiny configuration for the tests (seconds)")
    p.set_defaults(mode="full")
    p.add_argument("--config", default=str(HERE / f"{name.removesuffix('.py')}.json"),
                   help="the experiment's JSON spec (default: the one beside the script)")
    p.add_argument("--store", default=None, help="run store (SQLite) path; default experiments/out/<name>.sqlite")
    p.add_argument("--figures", default=None, help="folder for the PNG figures; default experiments/out/<name>-<mode>/")
    p.add_argument("--no-figures", action="store_true", help="skip the figure export")
    p.add_argument("--markdown", default=None, help="also write the result tables (Markdown) to this file")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    p.add_argument("--reuse", action="store_true",
                   help="reuse finished runs of the store with the identical config instead of training them again")
    p.add_argument("--threads", type=_positive_int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None, help="override the spec's device")
    p.add_argument("--backend", type=_backend, default=None,
                   help="where the runs train: local (default: one after another), ray (an instance on this machine), "
                        "ray:auto or ray://HOST:PORT (a cluster: as many at once as it has CPUs); default "
                        "$PRIVACY_LAB_BACKEND")
    if extra is not None:
        extra(p)
    return p


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return v


def _backend(text: str):
    try:
        return BackendConfig.parse(text, field="--backend")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(e.message) from None


def fail(message: str) -> "SystemExit":
    sys.stderr.write(message.rstrip().replace("\n", " ") + "\n")
    return SystemExit(2)


def load_spec(path: str) -> dict:
    """The experiment's JSON spec, read by the engine's safe reader (one ConfigError otherwise)."""
    return load_spec_sections(path, ("base", "modes"))


def load_spec_sections(path: str, sections) -> dict:
    """A JSON spec that must hold an object under each of ``sections``."""
    spec = parse_config_json(read_config_text(path), what="experiment spec")
    for key in sections:
        if not isinstance(spec.get(key), dict):
            raise ConfigError(key, f"the experiment spec {path} needs an object {key!r}")
    return spec


def mode_of(spec: dict, mode: str) -> tuple[dict, list[int]]:
    """(dotted overrides, seeds) of ``mode``; ConfigError if the spec has no such mode."""
    modes = spec["modes"]
    if mode not in modes:
        raise ConfigError("mode", f"this experiment has no {mode} mode (it has: {', '.join(modes)})")
    if not isinstance(modes[mode], dict):
        raise ConfigError(f"modes.{mode}", f"must be a JSON object of overrides, got {type(modes[mode]).__name__}")
    m = dict(modes[mode])
    seeds = check_list(m.pop("seeds", [0]), f"modes.{mode}.seeds", max_len=1000, nonempty=True)
    for k, s in enumerate(seeds):
        check_int(s, f"modes.{mode}.seeds[{k}]", 0, 2**63 - 1)
    m.pop("note", None)
    return m, list(seeds)


def with_overrides(d: dict, overrides: dict) -> dict:
    """A copy of the config dict ``d`` with dotted keys set (``"data.max_train": 300``)."""
    out = copy.deepcopy(d)
    for key, value in overrides.items():
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(key, "overrides a field that is not an object")
        node[parts[-1]] = copy.deepcopy(value)
    return out


def run_config(base: dict, overrides: dict, *, algorithm: dict | None = None, seed: int | None = None,
               device: str | None = None, threads: int | None = None, name: str = "") -> RunConfig:
    """The validated engine RunConfig of one run of the experiment."""
    extra = {}
    if algorithm is not None:
        extra["algorithm"] = algorithm
    if seed is not None:
        extra["seed"] = seed
    if device is not None:
        extra["device"] = device
    if threads is not None:
        extra["threads"] = threads
    if name:
        extra["name"] = name
    d = with_overrides(with_overrides(base, overrides), extra)
    config = RunConfig.from_dict(d).validate()
    warn(config.advisories())
    return config


_WARNED: set[str] = set()  # the warning lines this script run printed (main starts it empty)


def warn(advisories) -> None:
    """Each advisory (``RunConfig.advisories``: a valid value far from what trains, or one its algorithm ignores) as
    one ``warning:`` line on stderr, as the CLI prints them: once per script run, however many runs share it."""
    for e in advisories:
        line = f"warning: {e}"
        if line not in _WARNED:
            _WARNED.add(line)
            sys.stderr.write(line + "\n")


def store_path(args, name: str) -> Path:
    path = Path(args.store) if args.store else OUT / f"{name}.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def figures_dir(args, name: str) -> Path | None:
    if args.no_figures:
        return None
    out = Path(args.figures) if args.figures else OUT / f"{name}-{args.mode}"
    out.mkdir(parents=True, exist_ok=True)
    return out


def open_store(path: Path):
    return RunStore(path)


def train_runs(store, runs: list, *, reuse: bool = False, backend=None) -> list:
    """Train each (config, group id) of ``runs``: [(run id, RunSummary)] in order. Their rows are created first,
    then they run through ``engine.jobs.kinds.execute_all``: one after another locally, all at once on Ray (as many
    as the cluster has CPUs for). ``backend``: a BackendConfig, else the environment's. ``reuse``: a finished run
    of the store with the identical config (canonical JSON) is taken instead of training it again."""

    done = _finished_by_config(store) if reuse else {}
    out, todo = [None] * len(runs), []
    for i, (config, group_id) in enumerate(runs):
        found = done.get(config.to_json())
        if found is not None:
            out[i] = (int(found["id"]), RunSummary.from_dict(found["summary"]))
        else:
            todo.append((i, store.create_run(config, group_id=group_id), config))
    results = execute_all(store, [(rid, config) for _, rid, config in todo], kind="train", backend=backend)
    for (i, rid, _), result in zip(todo, results):
        out[i] = (rid, result.run_summary)
    return out


def _finished_by_config(store) -> dict:
    """The store's finished training runs with a summary, by canonical config JSON (the newest of equal ones)."""
    out = {}
    for run in store.list_runs(kind="train", status="finished"):  # newest first
        if run.get("summary"):
            out.setdefault(json.dumps(run.get("config"), sort_keys=True, separators=(",", ":")), run)
    return out


def export_png(fig, path: Path, *, width: int = 900, height: int = 500) -> Path | None:
    """One small PNG through the project's export (Kaleido + Chromium); None (and a note) if unavailable."""

    try:
        path.write_bytes(figure_bytes(fig, "png", width=width, height=height, scale=1.0))
    except ExportUnavailable as e:
        sys.stderr.write(f"figure {path.name} not exported: {e}\n")
        return None
    return path


def emit(args, result: dict, markdown: str) -> None:
    """Print the result (one JSON line with ``--json``, else the tables) and write ``--markdown``."""
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(markdown, encoding="utf-8")
    if args.json:
        print(json.dumps(result, separators=(",", ":"), allow_nan=False, default=_clean))
    else:
        print(markdown)


def _clean(x):
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"not JSON: {type(x).__name__}")


def finite(x):
    """A float for JSON, None for nan/inf/None (``allow_nan=False`` output)."""
    import math

    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def mean_se(values) -> tuple[float | None, float | None, int]:
    """(mean, standard error of the mean, n) of the finite values (``engine.figures.bands.mean_se``); None for
    a mean of none and an s.e. of fewer than two, as the tables print them."""

    mean, se, n = bands_mean_se(values)
    return (float(mean) if n else None), (float(se) if n > 1 else None), n


def pm(mean, se, digits: int = 2) -> str:
    if mean is None:
        return "—"
    return f"{mean:.{digits}f}" + (f" ± {se:.{digits}f}" if se is not None else "")


def main(name: str, doc: str, run_experiment, argv=None, extra=None) -> None:
    """The command line of an experiment script: parse ``argv``, ``run_experiment(args) → (result, tables)``,
    print / write them (:func:`emit`). A ConfigError (spec, config) or DataError (missing or corrupt data)
    ends with one line and exit 2, as a bad argument does."""

    args = parser(f"{name}.py", doc.splitlines()[0], extra).parse_args(argv)
    _WARNED.clear()
    try:
        result, tables = run_experiment(args)
    except (ConfigError, DataError) as e:
        raise fail(f"error: {e}") from None
    emit(args, result, tables)
