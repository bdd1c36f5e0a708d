"""Run records and what they mean: the record the figures and exports read, its labels, and whether
it carries a formal DP guarantee.

A *run record* is the store's run dict (``RunStore.get_run``) with its evaluation list added under
``"evals"`` (``RunStore.eval_metrics``); :func:`run_record` builds one. Labels are plain text (a run
name is user text: figure builders escape it, see :func:`engine.figures.scaffold.esc`).
"""
from __future__ import annotations

import hashlib
import json

from engine.config.run import ALGORITHM_LABELS
from engine.config.schema import ConfigError
from engine.dp.algorithms import find_algorithm
from engine.jobs.kinds import job_kind
from engine.models.metrics import DIVERGENCE_FACTOR


def run_record(store, run_id: int) -> dict | None:
    """The store's run dict plus its evaluations under ``"evals"`` (None if the run is gone)."""
    run = store.get_run(run_id)
    if run is None:
        return None
    run = dict(run)
    run["evals"] = store.eval_metrics(run_id)
    return run


def algorithm_label(algorithm: str) -> str:
    return ALGORITHM_LABELS.get(algorithm, algorithm or "run")


def run_label(run: dict) -> str:
    """Short unique legend label: "INO-SGD #12" (the run's name if it has one)."""
    base = run.get("name") or algorithm_label(run.get("algorithm", ""))
    return f"{base} #{run['id']}"


def _config_int(run: dict, key: str, default: int) -> int:
    try:
        return int((run.get("config") or {}).get(key, default))
    except (TypeError, ValueError):
        return default


def run_seed(run: dict) -> int:
    """The seed the run's model trained with (its stored ``config.seed``)."""
    return _config_int(run, "seed", 0)


def seed_index(run: dict) -> int:
    """The run's place j in its seed series (``config.seed_index``; 0 for single-seed runs)."""
    return _config_int(run, "seed_index", 0)


def series_key(run: dict) -> str:
    """What the replicates of one series share: group, kind, algorithm, name and the stored config minus
    ``seed`` and ``seed_index`` (canonical JSON)."""
    cfg = {k: v for k, v in (run.get("config") or {}).items() if k not in ("seed", "seed_index")}
    return json.dumps([run.get("group_id"), run.get("kind", "train"), run.get("algorithm"), run.get("name") or "",
                       cfg], sort_keys=True, default=str)


def config_hash(run: dict) -> str:
    """What identical runs share, as a short hex digest: kind, algorithm, the whole stored config, the seed (and
    a k-seed job's seed index) included, and the planned steps it made of them: two runs with the same hash train
    the same model on the same batches and noise (a rerun: bit-identical curves; engine.figures.evidence counts
    them once). The name and group are labels, not training, and are left out."""
    text = json.dumps([run.get("kind") or "train", run.get("algorithm"), run.get("config") or {},
                       run.get("total_steps")], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def series_label(run: dict, member_ids=None) -> str:
    """The label of the run's series (its label without the seed): a lone run's :func:`run_label`; a series
    of several runs (``member_ids``: their ids; default: the k rows of the run's k-seed job, stored as ids
    ``first .. first + k - 1``) "INO-SGD #12–15" for consecutive ids, else "INO-SGD #1, #3, #5"."""
    if member_ids is None:
        k = _config_int(run, "seeds", 1)
        first = run["id"] - seed_index(run)
        member_ids = range(first, first + k)
    ids = sorted(int(i) for i in member_ids)
    if len(ids) <= 1:
        return run_label(run)
    base = run.get("name") or algorithm_label(run.get("algorithm", ""))
    if ids == list(range(ids[0], ids[-1] + 1)):
        return f"{base} #{ids[0]}–{ids[-1]}"
    return f"{base} " + ", ".join(f"#{i}" for i in ids)


def _kind(run: dict):
    """The run's registered job kind (rows of older stores without a kind are training runs)."""
    return job_kind(run.get("kind") or "train")


def formal_dp(run: dict) -> bool | None:
    """True/False as the run's plan (or summary) records it; for a run recorded before it said so, from its
    configuration by the one rule (``AlgorithmConfig.no_formal_dp_reason``); None if neither can be read."""
    for part in ("plan", "summary"):
        recorded = run.get(part) or {}
        if "formal_dp" in recorded:
            return bool(recorded["formal_dp"])
    labels = without_formal_dp(run)
    return None if labels is None else not labels


def formal_dp_reason(run: dict) -> str | None:
    """Why a run has no formal DP guarantee, as its plan or summary records it (None if not recorded)."""
    for part in ("plan", "summary"):
        reason = (run.get(part) or {}).get("formal_dp_reason")
        if reason:
            return str(reason)
    return None


def without_formal_dp(run: dict) -> list[str] | None:
    """Labels of the run's algorithms without a formal guarantee: an audit's plan records them; otherwise (a
    training run, an audit planned before the plan said so) the rule decides from the configuration. None if
    the stored config cannot be read."""
    plan = run.get("plan") or {}
    if "no_formal_dp" in plan:
        return [str(x) for x in plan["no_formal_dp"]]
    if plan.get("formal_dp") is True:
        return []
    cfg = run_config(run)
    if cfg is None:
        return None
    return [algorithm_label(a.name) for a in _kind(run).algorithms(cfg) if a.no_formal_dp_reason]


def dp_note(run: dict) -> str:
    """'' for a run with a formal DP guarantee; otherwise a short warning for labels and tables ("no formal DP
    guarantee: <why>"; an audit: which of its algorithms have none). Its ε spent is null."""
    entry = find_algorithm(run.get("algorithm"))
    if entry is not None and not entry.private:
        return "non-private reference (no DP)"
    if formal_dp(run) is not False:
        return ""
    return _kind(run).no_dp_note(without_formal_dp(run) or ["?"], formal_dp_reason(run))


def diverged_note(run: dict) -> str:
    """'' unless the run ended *diverged*; then the one sentence the lab says about it (badge captions, the Runs
    page, Results, the CLI): where it diverged and by which rule (:func:`engine.models.metrics.diverged_step`)."""
    if run.get("status") != "diverged":
        return ""
    step = (run.get("summary") or {}).get("diverged_step")
    where = f" at step {step}" if step is not None else ""
    return (f"diverged{where}: a tier's test loss went non-finite or stayed above {DIVERGENCE_FACTOR:g}× its "
            "start; its metrics describe a broken model (lower the learning rate)")


def algorithms_label(run: dict) -> str:
    """The algorithm(s) a row trains, in words: a training run's one ("INO-SGD"), an audit's each ("DP-SGD,
    DP-SGD-S"), from its kind's config; the stored algorithm's label if the config cannot be read."""
    cfg = run_config(run)
    if cfg is not None:
        labels = list(dict.fromkeys(algorithm_label(a.name) for a in _kind(run).algorithms(cfg)))
        if labels:
            return ", ".join(labels)
    return algorithm_label(run.get("algorithm") or "")


def run_config(run: dict):
    """The run's typed configuration (its kind's: a RunConfig, or an AuditConfig with flat configs of older stores
    migrated); None if the stored config cannot be read."""
    try:
        return _kind(run).load(run.get("config") or {})
    except (ConfigError, TypeError, ValueError):
        return None


def dataset_name(run: dict) -> str | None:
    """The dataset a run (or an audit's models) trains on."""
    cfg = run_config(run)
    return None if cfg is None else _kind(run).dataset_name(cfg)
