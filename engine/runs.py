"""Run records and what they mean: the record the figures and exports read, its labels, and whether
it carries a formal DP guarantee.

A *run record* is the store's run dict (``RunStore.get_run``) with its evaluation list added under
``"evals"`` (``RunStore.eval_metrics``); :func:`run_record` builds one. Labels are plain text (a run
name is user text: figure builders escape it, see :func:`engine.figures.scaffold.esc`).
"""
from __future__ import annotations

from engine.config import ALGORITHM_LABELS


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


def formal_dp(run: dict) -> bool | None:
    """True/False from the run's plan (False: DP-SGD-S with a non-private quantile); None if unknown."""
    plan = run.get("plan") or {}
    if run.get("algorithm") == "nonprivate":
        return False
    if "formal_dp" in plan:
        return bool(plan["formal_dp"])
    summary = run.get("summary") or {}
    if "formal_dp" in summary:
        return bool(summary["formal_dp"])
    cfg = run_config(run) if run.get("kind", "train") == "train" else None
    if cfg is not None and cfg.algorithm.name == "dpsgd_s" and (not cfg.algorithm.private_quantile
                                                                or cfg.algorithm.clip_rule == "reference"):
        return False
    return None


def formal_dp_reason(run: dict) -> str | None:
    """Why a run has no formal DP guarantee, as its plan or summary records it (None if not recorded)."""
    for part in ("plan", "summary"):
        reason = (run.get(part) or {}).get("formal_dp_reason")
        if reason:
            return str(reason)
    return None


def dp_note(run: dict) -> str:
    """'' for a run with a formal DP guarantee; otherwise a short warning for labels and tables:
    "no formal DP guarantee: <why>" (its ε spent is null)."""
    if run.get("algorithm") == "nonprivate":
        return "non-private reference (no DP)"
    if formal_dp(run) is False:
        reason = formal_dp_reason(run)
        return f"no formal DP guarantee: {reason}" if reason else "no formal DP guarantee"
    return ""



def run_config(run: dict):
    """The run's typed configuration: a RunConfig (kind "train") or an AuditConfig (kind "audit", flat configs
    of older stores migrated); None if the stored config cannot be read."""
    from engine.config import ConfigError, RunConfig

    try:
        if run.get("kind") == "audit":
            from engine.audit.config import AuditConfig

            return AuditConfig.from_dict(run.get("config") or {})
        return RunConfig.from_dict(run.get("config") or {})
    except (ConfigError, TypeError, ValueError):
        return None


def dataset_name(run: dict) -> str | None:
    """The dataset a run (or an audit's models) trains on."""
    cfg = run_config(run)
    if cfg is None:
        return None
    return (cfg.run if run.get("kind") == "audit" else cfg).data.name
