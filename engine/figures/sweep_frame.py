"""The frame of a TIF sweep's heatmap: the most private tier's recall gain INO − IDP in each cell, read back
from the sweep's run records (finished or partial). A cell's coordinates come from its run's stored config
(``algorithm.alpha`` …), never from the run's name; the sweep's axes from its group id. The configs of a sweep
are :mod:`engine.tools.sweep`'s; the heatmap is :func:`engine.figures.talk.fig_sweep_heatmap`.
"""
from __future__ import annotations

import math

import pandas as pd

from engine.dp.algorithms import GAIN_REFERENCES, find_algorithm
from engine.figures import frames as fr
from engine.figures.common_span import Span, common_span
from engine.models.metrics import recall_auc

SWEEP_PARAMS = {"alpha": "algorithm.alpha", "beta": "algorithm.beta", "tail_fraction": "algorithm.tail_fraction"}
PARAM_LABELS = {"alpha": "α", "beta": "β", "tail_fraction": "γ (tail fraction)"}
GROUP_PREFIX = "sweep"
METRICS = ("auc", "epoch")


def group_prefix(x_param: str, y_param: str) -> str:
    """The group-id prefix of a sweep over (x, y): "sweep-alpha-tail_fraction" (the job manager's
    ``new_group_id`` appends time and a random tag), so the axes survive one-value grids."""
    return f"{GROUP_PREFIX}-{x_param}-{y_param}"


def is_sweep_group(group_id) -> bool:
    return bool(group_id) and str(group_id).startswith(GROUP_PREFIX + "-")


def axes_from_group(group_id) -> tuple[str, str] | None:
    parts = str(group_id or "").split("-")
    if len(parts) >= 3 and parts[0] == GROUP_PREFIX and parts[1] in SWEEP_PARAMS and parts[2] in SWEEP_PARAMS:
        return parts[1], parts[2]
    return None


def gains_measured(run: dict) -> bool:
    """A sweep's cell: a run of an algorithm whose gain is measured against a reference (INO-SGD against IDP-SGD,
    its registry entry's ``gain_against``); the references are :data:`GAIN_REFERENCES`' runs."""
    entry = find_algorithm(run.get("algorithm"))
    return entry is not None and bool(entry.gain_against)


def param_value(run: dict, param: str):
    """The swept parameter's value in a run's stored config (None when absent)."""
    algo = (run.get("config") or {}).get("algorithm") or {}
    v = algo.get(SWEEP_PARAMS[param].split(".", 1)[1])
    return None if v is None else float(v)


def sweep_axes(runs: list[dict]) -> tuple[str, str] | None:
    """The sweep's two parameters (x, y): from the group id (:func:`group_prefix`), else the two that vary
    across the INO-SGD runs; None when neither says."""
    for r in runs:
        axes = axes_from_group(r.get("group_id"))
        if axes is not None:
            return axes
    ino = [r for r in runs if gains_measured(r)]
    varying = [p for p in SWEEP_PARAMS if len({param_value(r, p) for r in ino}) > 1]
    if len(varying) == 2:
        return varying[0], varying[1]
    if len(varying) == 1:  # a one-row grid: the other axis is any fixed parameter
        return varying[0], next(p for p in SWEEP_PARAMS if p != varying[0])
    return None


SWEEP_COLUMNS = ["x_param", "y_param", "x", "y", "run_id", "tier", "epsilon", "metric", "ino", "idp", "gain",
                 "status"]


def _value(run: dict, tier: str, metric: str, epoch: float | None, span: Span) -> float:
    """The tier's recall AUC (normalised, 0..1) or its recall at ``epoch`` (nearest evaluation at or before),
    within the compared ``span`` (the cell's and its reference's common span)."""
    hist = span.keep(fr.tier_history([run]))
    g = hist[hist.tier == tier].sort_values("step")
    if g.empty:
        return float("nan")
    if metric == "auc":
        return recall_auc(g["step"], g["recall"])
    before = g[g.epoch <= (epoch if epoch is not None else math.inf) + 1e-9]
    return float((before if not before.empty else g.head(1))["recall"].iloc[-1])


def sweep_frame(runs: list[dict], *, x_param: str | None = None, y_param: str | None = None, metric: str = "auc",
                epoch: float | None = None) -> pd.DataFrame:
    """One row per INO-SGD cell of a sweep: the most private tier's (smallest ε) recall gain over the
    group's IDP-SGD reference, as recall AUC (``metric="auc"``) or recall at ``epoch`` (``"epoch"``),
    in percentage points. Cells without evaluations yet are left out."""
    if metric not in METRICS:
        raise ValueError(f"unknown sweep metric {metric!r}; allowed: {', '.join(METRICS)}")
    if x_param is None or y_param is None:
        axes = sweep_axes(runs)
        if axes is None:
            return pd.DataFrame(columns=SWEEP_COLUMNS)
        x_param, y_param = axes
    refs = [r for r in runs if r.get("algorithm") in GAIN_REFERENCES and r.get("evals")]
    cells = [r for r in runs if gains_measured(r) and r.get("evals")]
    if not refs or not cells:
        return pd.DataFrame(columns=SWEEP_COLUMNS)
    ref = sorted(refs, key=lambda r: r["id"])[0]
    tiers = fr.last_eval(ref).tiers
    if not tiers:
        return pd.DataFrame(columns=SWEEP_COLUMNS)
    most = min(tiers, key=lambda t: t.epsilon or math.inf)
    rows = []
    for r in sorted(cells, key=lambda r: r["id"]):
        span = common_span([r, ref])  # each cell against the reference over the steps both reached
        ino, idp = _value(r, most.name, metric, epoch, span), _value(ref, most.name, metric, epoch, span)
        rows.append({"x_param": x_param, "y_param": y_param, "x": param_value(r, x_param), "y": param_value(r, y_param),
                     "run_id": r["id"], "tier": most.name, "epsilon": most.epsilon, "metric": metric,
                     "ino": ino, "idp": idp, "gain": 100.0 * (ino - idp), "status": r.get("status", "")})
    return pd.DataFrame(rows, columns=SWEEP_COLUMNS)
