"""Group-aware DP-SGD baselines under one PA-ALOOA audit each: accuracy, per-group accuracy gap and group privacy
risk (Δ), with paired differences against DP-SGD and DP-SGD-S.

    python experiments/fair_baselines.py                  Adult 2R = 400, MNIST-10k 2R = 100, ε ∈ {1, 10}, the four
                                                          algorithms (one torch thread: an Adult audit of DP-SGD and
                                                          DP-SGD-S at 2R = 400 ≈ 2 min, MNIST-10k at 2R = 100 ≈ 1 min)
    python experiments/fair_baselines.py --datasets adult --epsilons 10 --algorithms dpsgd,dpsgd_s --models 40
    python experiments/fair_baselines.py --datasets adult --clip 0.5   every algorithm at C = 0.5 (fair-dp's Adult clip)
    python experiments/fair_baselines.py --quick          tiny (2R = 8, 2 epochs, training subsets): ~5 s per audit
    python experiments/fair_baselines.py --table          print the Markdown table of an existing --out file

Per dataset (Adult, groups: sex; MNIST-10k, groups: the digits) and ε, ONE audit (``engine.audit.pa_alooa``, preset
``adult-paper`` / ``mnist-paper`` with ``--algorithms`` at that ε, no PA-LOOA) trains every listed algorithm on the
same membership design from the same initialisations, so their per-sample advantages and per-model accuracies are
paired. A grouped algorithm (the registry's ``grouped``: DP-SGD-S, DPSGD-F) clips by the audit's own groups. The
audit runs through ``engine.jobs.kinds.execute`` into a run store (``--store``; ``--backend`` as in the other
experiments). One JSON row per (dataset, ε, algorithm):

    accuracy          mean test accuracy over the 2R models (points) with the report's t interval over the
                      complementary pairs (``AlgorithmReport.accuracy_ci``)
    group accuracy    the report's per-group test accuracy (``AlgorithmReport.accuracy.groups``): the audit's
                      analysis labels each test sample with ``engine.dp.groups.sample_groups`` (sex for Adult, the
                      label for MNIST) and averages each model's accuracy on a group's test samples over the 2R
                      models; the gap is max − min over groups, in points. Nothing is recomputed here.
    Δ                 the report's Δ (pp) with its bootstrap CI, the null Δ spread (permuted membership) and
                      ``resolved`` (Δ's CI above that spread)
    vs partners       for every algorithm against each partner of :data:`PARTNERS` listed before it (DP-SGD-S:
                      against DP-SGD; every other algorithm: against both): Δ − Δ_partner (pp) with the paired
                      bootstrap CI and mean accuracy difference (points, paired t interval over complementary
                      pairs), from ``engine.audit.pa_alooa.controls.compare.compare`` on the audit's per-sample
                      advantages (the store's ``advantage/<key>`` artifacts, float32), the per-model test
                      accuracies (the test predictions in the audit's chunk checkpoints, ``chunk/<key>/aloo/<c>``,
                      scored by ``analysis.correct_predictions``) and the audit's groups (its set-up, prepared again
                      from the same config). n_boot and the confidence are the audit's.

Rows go to ``--out`` (JSON, ``{"rows": [...]}``) after every audit, replacing earlier rows of the same (dataset, ε,
algorithm), so a killed run keeps what finished; ``--reuse`` also takes a finished audit of the identical config
from the store and resumes an unfinished one from its checkpoints. Torch runs on ``--threads`` threads (default 1).
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import common  # noqa: E402
from experiments.common import ConfigError, DataError, finite  # noqa: E402
from engine.audit.pa_alooa.analysis import correct_predictions  # noqa: E402
from engine.audit.pa_alooa.config import AuditConfig  # noqa: E402
from engine.audit.pa_alooa.controls.compare import compare  # noqa: E402
from engine.audit.pa_alooa.design import derived_seed  # noqa: E402
from engine.audit.pa_alooa.presets import PRESETS  # noqa: E402
from engine.audit.pa_alooa.report import AuditReport  # noqa: E402
from engine.audit.pa_alooa.setup import prepare_audit  # noqa: E402
from engine.config.backend import BackendConfig  # noqa: E402
from engine.config.run import AlgorithmConfig  # noqa: E402
from engine.dp.algorithms import algorithm  # noqa: E402
from engine.jobs.kinds import execute  # noqa: E402
from engine.store.artifacts import load_array  # noqa: E402

NAME = "fair_baselines"
HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / f"{NAME}.json"
# the comparison partners, in order: every algorithm is compared with each partner listed before it in the audit's
# list (so DP-SGD-S with DP-SGD, every other algorithm with both)
PARTNERS = ("dpsgd", "dpsgd_s")
DEFAULT_ALGORITHMS = ("dpsgd", "dpsgd_s", "dpsgd_f", "dpsgd_global_adapt")
DATASETS = {"adult": {"preset": "adult-paper", "label": "Adult", "groups": "sex"},
            "mnist": {"preset": "mnist-paper", "label": "MNIST-10k", "groups": "digits"}}
DEFAULT_MODELS = {"adult": 400, "mnist": 100}  # 2R per algorithm (--models, --mnist-models)
# --quick: a tiny audit (training subset, epochs, 2R, bootstrap, permutations), the same design and statistics
QUICK = {"adult": {"run.data.max_train": 2000, "run.epochs": 2.0},
         "mnist": {"run.data.max_train": 1000, "run.epochs": 2.0}}
QUICK_MODELS = 8
QUICK_STATS = {"n_boot": 200, "null_perms": 5}


# --- the audits ------------------------------------------------------------------------------------------------

def audit_config(dataset: str, epsilon: float, names, *, n_models: int, quick: bool = False, device=None,
                 threads=None, clip_norm: float | None = None) -> AuditConfig:
    """The validated audit of one (dataset, ε): the dataset's preset with ``names`` at ``epsilon``, 2R = ``n_models``,
    no PA-LOOA, every algorithm at the clip ``clip_norm`` (default: the preset's); a grouped algorithm clips by the
    audit's groups."""
    base = PRESETS[DATASETS[dataset]["preset"]]
    algos = tuple(AlgorithmConfig(name=n, group_by=base.group_by) if algorithm(n).grouped else AlgorithmConfig(name=n)
                  for n in names)
    if n_models < 4 or n_models % 2:
        raise ConfigError("models", f"2R must be an even number of at least 4, got {n_models}")
    changes = {"epsilon": float(epsilon), "algorithms": algos, "looa_k": 0, "R": n_models // 2, "name": ""}
    if quick:
        changes.update(QUICK[dataset], **QUICK_STATS)
    if device is not None:
        changes["run.device"] = device
    if threads is not None:
        changes["run.threads"] = threads
    if clip_norm is not None:
        changes["run.clip_norm"] = float(clip_norm)
    return base.replace(**changes).validate()


def run_audit_into(store, config: AuditConfig, name: str, *, reuse: bool, backend=None) -> tuple[int, AuditReport]:
    """(run id, report) of ``config``: a new audit run of the store; with ``reuse`` the newest finished one of the
    identical config instead, or the newest unfinished one resumed from its checkpoints."""
    if reuse:
        same = [r for r in store.list_runs(kind="audit") if _same_config(r.get("config"), config)]  # newest first
        done = next((r for r in same if r.get("status") == "finished" and r.get("summary")), None)
        if done is not None:
            return int(done["id"]), AuditReport.from_dict(done["summary"])
        if same:
            rid = int(same[0]["id"])
            return rid, execute(store, rid, config, kind="audit", backend=backend)
    rid = store.create_run(config.to_dict(), kind="audit", status="queued", name=name)
    return rid, execute(store, rid, config, kind="audit", backend=backend)


def _same_config(stored, config: AuditConfig) -> bool:
    try:
        return AuditConfig.from_dict(stored).to_json() == config.to_json()
    except (ConfigError, TypeError, ValueError):
        return False


def paired_inputs(store, run_id: int, config: AuditConfig):
    """(groups per training sample, {key: per-sample advantage}, {key: per-model test accuracy}) of a finished
    audit of the store: the advantages it saved, the accuracies of the test predictions in its chunk checkpoints
    (in the layout its meta records), the groups of its set-up (prepared again from the same config)."""
    setup = prepare_audit(config)
    meta = json.loads(store.get_artifact(run_id, "audit/meta").decode())
    adv, acc = {}, {}
    for a in setup.algos:
        blob = store.get_artifact(run_id, f"advantage/{a.key}")
        if blob is None:
            raise ConfigError("store", f"audit run {run_id} has no per-sample advantages of {a.key}")
        adv[a.key] = np.asarray(load_array(blob), dtype=np.float64)
        preds = []
        for c, (lo, hi) in enumerate(meta["layout"][f"{a.key}/aloo"]):
            blob = store.get_artifact(run_id, f"chunk/{a.key}/aloo/{c}")
            if blob is None:
                raise ConfigError("store", f"audit run {run_id} has no checkpoint {c} of {a.key}")
            with np.load(io.BytesIO(blob), allow_pickle=False) as f:
                p = np.asarray(f["preds"])
            if len(p) != hi - lo:
                raise ConfigError("store", f"audit run {run_id}: checkpoint {c} of {a.key} holds {len(p)} models, "
                                           f"not {hi - lo}")
            preds.append(p)
        acc[a.key] = correct_predictions(setup, np.concatenate(preds, 0)).mean(1)
    return setup.groups, adv, acc


def partners_of(name: str, names) -> tuple[str, ...]:
    """The partners ``name`` is compared with: those of :data:`PARTNERS` in the audit, before ``name`` in
    PARTNERS' order (a partner is not compared with itself nor with a later partner)."""
    ahead = PARTNERS[:PARTNERS.index(name)] if name in PARTNERS else PARTNERS
    return tuple(p for p in ahead if p in names)


def audit_rows(dataset: str, epsilon: float, config: AuditConfig, report: AuditReport, store, run_id: int,
               seconds: float | None, *, quick: bool) -> list[dict]:
    """One row per algorithm of a finished audit (see the module docstring)."""
    names = [a.name for a in config.algorithms]
    keys = {a.name: a.key for a in report.algorithms}
    need = {p for n in names for p in partners_of(n, names)}
    groups, adv, acc = paired_inputs(store, run_id, config) if need else (None, {}, {})
    rows = []
    for i, a in enumerate(report.algorithms):
        ci = a.accuracy_ci
        accuracy = _est(ci.value, ci.low, ci.high) if ci is not None and ci.value is not None else \
            _est(None if a.accuracy.mean is None else 100.0 * a.accuracy.mean, None, None)
        per_group = {g: finite(100.0 * v) for g, v in a.accuracy.groups.items() if v is not None}
        known = [v for v in per_group.values() if v is not None]
        vs = {}
        for p in partners_of(a.name, names):
            j = PARTNERS.index(p)
            b = report.algorithm(keys[p])
            c = compare(a, b, adv[a.key], adv[b.key], acc[a.key], acc[b.key], groups, n_boot=config.n_boot,
                        ci=config.confidence, seed=derived_seed(config.run.seed, 6, i, j))
            vs[p] = {"label": b.label, "delta_pp": _e(c.delta), "delta_unpaired_pp": _e(c.delta_unpaired),
                     "accuracy_pp": _e(c.accuracy), "groups_pp": {g: _e(e) for g, e in c.groups.items()},
                     "n_boot": c.n_boot, "ci": c.ci}
        rows.append({
            "dataset": dataset, "data": DATASETS[dataset]["label"], "groups_by": DATASETS[dataset]["groups"],
            "epsilon": float(epsilon), "clip_norm": float(config.run.clip_norm), "algorithm": a.name, "key": a.key, "label": a.label, "formal_dp": a.formal_dp,
            "quick": bool(quick), "n_models": report.n_models, "R": report.R, "n_train": report.n_train,
            "steps_per_model": report.steps_per_model, "epochs": config.run.epochs,
            "accuracy_pct": accuracy,
            "group_accuracy_pct": per_group,
            "group_accuracy_gap_pp": finite(max(known) - min(known)) if len(known) > 1 else None,
            "gpr": {g: _e(e) for g, e in a.gpr.items()},
            "delta_pp": _e(a.delta),
            "null_delta_pp": None if a.null_delta is None else _e(a.null_delta),
            "resolved": a.resolved,
            "vs": vs,
            "confidence": config.confidence, "n_boot": config.n_boot, "null_perms": config.null_perms,
            "run_id": int(run_id), "store": str(store.path), "audit_seconds": seconds,
            "train_seconds": finite(a.train_seconds), "stats_seconds": finite(a.stats_seconds)})
    return rows


def _est(value, low, high) -> dict:
    return {"value": finite(value), "low": finite(low), "high": finite(high)}


def _e(e) -> dict:
    return _est(e.value, e.low, e.high)


# --- the JSON file ---------------------------------------------------------------------------------------------

def read_rows(path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConfigError("out", f"{path} is not JSON: {e}") from None
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise ConfigError("out", f"{path} holds no 'rows' list")
    return rows


def _cell(row: dict) -> tuple:
    """A row's cell: its dataset, ε, clip C (a row written before ``--clip`` existed: the preset's) and algorithm."""
    ds = row.get("dataset")
    clip = row.get("clip_norm")
    if clip is None and ds in DATASETS:
        clip = PRESETS[DATASETS[ds]["preset"]].run.clip_norm
    return ds, row.get("epsilon"), None if clip is None else float(clip), row.get("algorithm")


def write_rows(path, new: list[dict]) -> list[dict]:
    """``new`` merged into the rows of ``path`` (replacing those of the same dataset, ε, clip and algorithm), written
    atomically (a temporary file renamed); returns every row."""
    path = Path(path)
    cell = {_cell(r) for r in new}
    rows = [r for r in read_rows(path) if _cell(r) not in cell] + new
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"experiment": NAME, "rows": rows}, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return rows


# --- the table -------------------------------------------------------------------------------------------------

def markdown(rows: list[dict]) -> str:
    """The rows as one Markdown table (in the order of the datasets, ε and the rows' own order)."""
    order = list(DATASETS)
    rows = sorted(rows, key=lambda r: (order.index(r["dataset"]) if r["dataset"] in order else len(order),
                                       -(_cell(r)[2] or 0.0), r["epsilon"]))  # stable: an audit keeps its order
    heads = [algorithm(p).label for p in PARTNERS]
    lines = ["| data | C | ε | algorithm | accuracy (%) [CI] | group accuracy gap (pp) | Δ pp [CI] | null Δ (pp) | resolved | "
             + " | ".join(f"Δ − Δ_{h} [paired CI] (accuracy diff.)" for h in heads) + " |",
             "|---|---|---|---|---|---|---|---|---|" + "---|" * len(heads)]
    for r in rows:
        nd = r.get("null_delta_pp")
        vs = r.get("vs") or {}
        lines.append(f"| {r['data']} ({r['groups_by']}) | {_cell(r)[2]:g} | {r['epsilon']:g} | {r['label']} | {_ci(r['accuracy_pct'])} | "
                     f"{_n(r.get('group_accuracy_gap_pp'))} | {_ci(r['delta_pp'])} | "
                     f"{_spread(nd)} | {_yes(r.get('resolved'))} | "
                     + " | ".join(_diff(vs.get(p)) for p in PARTNERS) + " |")
    return "\n".join(lines) + "\n"


def _n(x, d: int = 2, sign: bool = False) -> str:
    if x is None or not math.isfinite(x):
        return "—"
    x = 0.0 if round(x, d) == 0 else x  # no "-0.00"
    return f"{x:+.{d}f}" if sign else f"{x:.{d}f}"


def _ci(e, sign: bool = False) -> str:
    if not e or e.get("value") is None:
        return "—"
    out = _n(e["value"], sign=sign)
    return out if e.get("low") is None else f"{out} [{_n(e['low'], sign=sign)}, {_n(e['high'], sign=sign)}]"


def _spread(e) -> str:
    return "—" if not e or e.get("low") is None else f"[{_n(e['low'])}, {_n(e['high'])}]"


def _yes(x) -> str:
    return {True: "yes", False: "no"}.get(x, "—")


def _diff(v) -> str:
    if not v:
        return "—"
    return f"{_ci(v['delta_pp'], True)} ({_ci(v['accuracy_pp'], True)})"


# --- the command line ------------------------------------------------------------------------------------------

def _names(text: str) -> tuple[str, ...]:
    out = tuple(s.strip() for s in text.split(",") if s.strip())
    if not out:
        raise ValueError("empty list")
    if len(set(out)) != len(out):
        raise ValueError(f"a name twice in {text!r}")
    return out


def _datasets(text: str) -> tuple[str, ...]:
    out = _names(text)
    bad = [d for d in out if d not in DATASETS]
    if bad:
        raise ValueError(f"unknown dataset {bad[0]!r}; known: {', '.join(DATASETS)}")
    return out


def _epsilons(text: str) -> tuple[float, ...]:
    out = tuple(float(s) for s in _names(text))
    if any(not (math.isfinite(e) and e > 0) for e in out):
        raise ValueError(f"every ε must be positive, got {text!r}")
    return out


def _positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise ValueError(f"must be a positive integer, got {text!r}")
    return v


def _positive_float(text: str) -> float:
    v = float(text)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"must be a positive number, got {text!r}")
    return v


def _backend(text: str):
    try:
        return BackendConfig.parse(text, field="--backend")
    except ConfigError as e:
        raise ValueError(e.message) from None


def _typed(parse):  # argparse's error line names the option and what was wrong
    def f(text):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    f.__name__ = parse.__name__.strip("_")
    return f


def parser():
    p = common.OneLineParser(prog=f"{NAME}.py", description=__doc__.splitlines()[0])
    p.add_argument("--algorithms", type=_typed(_names), default=DEFAULT_ALGORITHMS,
                   help=f"config names, comma-separated (default {','.join(DEFAULT_ALGORITHMS)})")
    p.add_argument("--datasets", type=_typed(_datasets), default=tuple(DATASETS), help="adult,mnist (default both)")
    p.add_argument("--epsilons", type=_typed(_epsilons), default=(1.0, 10.0), help="default 1,10")
    p.add_argument("--models", type=_typed(_positive), default=None,
                   help=f"2R for Adult (default {DEFAULT_MODELS['adult']}; --quick {QUICK_MODELS})")
    p.add_argument("--mnist-models", type=_typed(_positive), default=None,
                   help=f"2R for MNIST-10k (default {DEFAULT_MODELS['mnist']}; --quick {QUICK_MODELS})")
    p.add_argument("--clip", type=_typed(_positive_float), default=None,
                   help="the clip C of every algorithm (default: the preset's, 5; the fair-dp reference's Adult "
                        "scripts use 0.5)")
    p.add_argument("--quick", action="store_true",
                   help=f"tiny audits: 2R = {QUICK_MODELS}, 2 epochs on a training subset, fewer resamples")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="the JSON rows (default experiments/fair_baselines.json)")
    p.add_argument("--table", action="store_true", help="print the Markdown table of --out and exit")
    p.add_argument("--store", default=None, help="run store (SQLite); default experiments/out/fair_baselines.sqlite")
    p.add_argument("--reuse", action="store_true", help="take a finished audit of the identical config from the "
                                                        "store, resume an unfinished one")
    p.add_argument("--threads", type=_typed(_positive), default=1, help="torch threads (default 1)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None, help="default: the presets' (auto)")
    p.add_argument("--backend", type=_typed(_backend), default=None,
                   help="local (default), ray, ray:auto or ray://HOST:PORT; default $PRIVACY_LAB_BACKEND")
    return p


def run(args) -> list[dict]:
    """Every audit of ``args`` (configs checked before the first trains); the rows written after each."""
    import torch

    torch.set_num_threads(args.threads)
    cells = []
    for ds in args.datasets:
        n = args.models if ds == "adult" else args.mnist_models
        n = n or (QUICK_MODELS if args.quick else DEFAULT_MODELS[ds])
        for eps in args.epsilons:
            cells.append((ds, eps, audit_config(ds, eps, args.algorithms, n_models=n, quick=args.quick,
                                                device=args.device, threads=args.threads, clip_norm=args.clip)))
    store = common.open_store(common.store_path(args, NAME))
    started = time.time()
    rows = []
    for ds, eps, cfg in cells:
        t0 = time.time()
        rid, report = run_audit_into(store, cfg, f"{NAME} {ds} ε={eps:g} C={cfg.run.clip_norm:g}", reuse=args.reuse,
                                     backend=args.backend)
        got = audit_rows(ds, eps, cfg, report, store, rid, finite(report.seconds), quick=args.quick)
        rows = write_rows(args.out, got)
        sys.stderr.write(f"[{time.time() - started:7.1f}s] {ds} ε={eps:g} 2R={cfg.n_models}: audit run {rid} "
                         f"({time.time() - t0:.1f} s) → {args.out}\n")
    return rows


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    try:
        rows = read_rows(args.out) if args.table else run(args)
    except (ConfigError, DataError) as e:
        raise common.fail(f"error: {e}") from None
    print(markdown(rows), end="")


if __name__ == "__main__":
    main()
