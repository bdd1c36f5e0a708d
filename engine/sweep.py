"""A TIF sweep: one IDP-SGD reference plus one INO-SGD run per cell of a grid over two of the TIF's
parameters (α, β of the Beta TIF, γ as the tail fraction), submitted as one group; and the frame of
its heatmap: the most private tier's recall gain INO − IDP in each cell.

Pure: :func:`sweep_configs` builds the configs (the TIF explorer submits them through the job
manager), :func:`sweep_frame` reads finished (or partial) run records back. A cell's coordinates come
from its run's stored config (``algorithm.alpha`` …), never from the run's name. The heatmap itself
is :func:`engine.figures.talk.fig_sweep_heatmap`.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from engine.config import ConfigError, RunConfig

SWEEP_PARAMS = {"alpha": "algorithm.alpha", "beta": "algorithm.beta", "tail_fraction": "algorithm.tail_fraction"}
PARAM_LABELS = {"alpha": "α", "beta": "β", "tail_fraction": "γ (tail fraction)"}
PARAM_RANGES = {"alpha": (0.0, 100.0), "beta": (0.0, 100.0), "tail_fraction": (0.0, 10.0)}  # (low open, high]
MAX_CELLS = 64
MAX_VALUES = 16
GROUP_PREFIX = "sweep"
METRICS = ("auc", "epoch")


def parse_grid(text: str, param: str) -> tuple[float, ...]:
    """A grid typed as "0.5, 1, 2" → (0.5, 1.0, 2.0): distinct, in range, at most MAX_VALUES (ConfigError
    naming the parameter otherwise)."""
    if param not in SWEEP_PARAMS:
        raise ConfigError("sweep.param", f"must be one of {', '.join(SWEEP_PARAMS)}, got {param!r}")
    parts = [p for p in str(text).replace(";", ",").replace(" ", ",").split(",") if p]
    if not parts:
        raise ConfigError(f"sweep.{param}", "give at least one value, e.g. 0.5, 1, 2")
    low, high = PARAM_RANGES[param]
    values = []
    for p in parts:
        try:
            v = float(p)
        except ValueError:
            raise ConfigError(f"sweep.{param}", f"{p!r} is not a number") from None
        if not (math.isfinite(v) and low < v <= high):
            raise ConfigError(f"sweep.{param}", f"{PARAM_LABELS[param]} must be in ({low:g}, {high:g}], got {p}")
        if v not in values:
            values.append(v)
    if len(values) > MAX_VALUES:
        raise ConfigError(f"sweep.{param}", f"at most {MAX_VALUES} values, got {len(values)}")
    return tuple(values)


def sweep_configs(base: RunConfig, x_param: str, x_values, y_param: str, y_values) -> tuple[list[RunConfig], list[str]]:
    """(configs, names): the IDP-SGD reference (the planner INO-SGD builds on: ``base.algorithm.idp_mode``)
    first, then one INO-SGD run per (y, x) cell, row by row. ``base`` gives everything else (data, tiers,
    model, epochs, seed …); its TIF is made the Beta TIF and γ a tail fraction unless one of them is swept.
    Every config is validated; a bad grid raises ConfigError before anything is built."""
    for p in (x_param, y_param):
        if p not in SWEEP_PARAMS:
            raise ConfigError("sweep.param", f"must be one of {', '.join(SWEEP_PARAMS)}, got {p!r}")
    if x_param == y_param:
        raise ConfigError("sweep.param", f"choose two different parameters (both are {PARAM_LABELS[x_param]})")
    xs, ys = tuple(float(v) for v in x_values), tuple(float(v) for v in y_values)
    if not xs or not ys:
        raise ConfigError("sweep.grid", "each parameter needs at least one value")
    if len(xs) * len(ys) > MAX_CELLS:
        raise ConfigError("sweep.grid", f"{len(xs)} × {len(ys)} = {len(xs) * len(ys)} cells, over the limit of "
                                        f"{MAX_CELLS}; use fewer values")
    ino = base.replace(**{"algorithm.name": "ino", "algorithm.tif": "beta", "name": ""})
    if ino.algorithm.tail_length is not None:  # γ as a fraction (absolute lengths do not sweep across data)
        ino = ino.replace(**{"algorithm.tail_length": None,
                             "algorithm.tail_fraction": ino.algorithm.tail_fraction or 0.5})
    mode = ino.algorithm.idp_mode
    ref = base.replace(**{"algorithm.name": "idp_scale" if mode == "scale" else "idp_sample", "name": ""})
    configs, names = [ref.validate()], [f"sweep reference ({'SCALE' if mode == 'scale' else 'SAMPLE'})"]
    for y in ys:
        for x in xs:
            cfg = ino.replace(**{SWEEP_PARAMS[x_param]: x, SWEEP_PARAMS[y_param]: y})
            configs.append(cfg.validate())
            names.append(f"INO {cell_label(x_param, x, y_param, y)}")
    return configs, names


def cell_label(x_param: str, x: float, y_param: str, y: float) -> str:
    short = {"alpha": "α", "beta": "β", "tail_fraction": "γ"}
    return f"{short[x_param]}={x:g} {short[y_param]}={y:g}"


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
    ino = [r for r in runs if r.get("algorithm") == "ino"]
    varying = [p for p in SWEEP_PARAMS if len({param_value(r, p) for r in ino}) > 1]
    if len(varying) == 2:
        return varying[0], varying[1]
    if len(varying) == 1:  # a one-row grid: the other axis is any fixed parameter
        return varying[0], next(p for p in SWEEP_PARAMS if p != varying[0])
    return None


def estimate(n_runs: int, steps_per_run: int, workers: int, seconds_per_step: float | None) -> float | None:
    """Seconds a sweep takes: runs in waves of ``workers``, each ``steps_per_run`` steps at the measured
    ``seconds_per_step`` (None: no measurement yet)."""
    if seconds_per_step is None or not math.isfinite(seconds_per_step):
        return None
    return math.ceil(n_runs / max(1, workers)) * steps_per_run * seconds_per_step


def seconds_per_step(runs: list[dict]) -> float | None:
    """Median training seconds per step over finished runs (their summaries), or None."""
    vals = [s["seconds"] / s["steps"] for s in ((r.get("summary") or {}) for r in runs if r.get("status") == "finished")
            if isinstance(s.get("seconds"), (int, float)) and s.get("steps")]
    return float(np.median(vals)) if vals else None


SWEEP_COLUMNS = ["x_param", "y_param", "x", "y", "run_id", "tier", "epsilon", "metric", "ino", "idp", "gain",
                 "status"]


def _value(run: dict, tier: str, metric: str, epoch: float | None) -> float:
    """The tier's recall AUC (normalised, 0..1) or its recall at ``epoch`` (nearest evaluation at or before)."""
    from engine.figures import frames as fr

    hist = fr.tier_history([run])
    g = hist[hist.tier == tier].sort_values("step")
    if g.empty:
        return float("nan")
    if metric == "auc":
        return float(fr.recall_auc_table([run]).set_index("tier").at[tier, "recall_auc"])
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
    refs = [r for r in runs if r.get("algorithm") in ("idp_sample", "idp_scale") and r.get("evals")]
    cells = [r for r in runs if r.get("algorithm") == "ino" and r.get("evals")]
    if not refs or not cells:
        return pd.DataFrame(columns=SWEEP_COLUMNS)
    ref = sorted(refs, key=lambda r: r["id"])[0]
    tiers = ref["evals"][-1].get("tiers") or []
    if not tiers:
        return pd.DataFrame(columns=SWEEP_COLUMNS)
    most = min(tiers, key=lambda t: t.get("epsilon") or math.inf)
    idp = _value(ref, most["name"], metric, epoch)
    rows = []
    for r in sorted(cells, key=lambda r: r["id"]):
        ino = _value(r, most["name"], metric, epoch)
        rows.append({"x_param": x_param, "y_param": y_param, "x": param_value(r, x_param), "y": param_value(r, y_param),
                     "run_id": r["id"], "tier": most["name"], "epsilon": most.get("epsilon"), "metric": metric,
                     "ino": ino, "idp": idp, "gain": 100.0 * (ino - idp), "status": r.get("status", "")})
    return pd.DataFrame(rows, columns=SWEEP_COLUMNS)
