"""A TIF sweep: one IDP-SGD reference plus one INO-SGD run per cell of a grid over two of the TIF's
parameters (α, β of the Beta TIF, γ as the tail fraction), submitted as one group.

Pure: :func:`sweep_configs` builds the configs (the TIF explorer submits them through the job
manager); the heatmap's frame, which reads the runs back, is :mod:`engine.figures.sweep_frame`'s
(re-exported here with the sweep's parameter names, since a sweep's user reads both).
"""
from __future__ import annotations

import math


from engine.config.run import RunConfig
from engine.config.schema import ConfigError
from engine.dp.algorithms import algorithm
from engine.figures.sweep_frame import GROUP_PREFIX  # noqa: F401
from engine.figures.sweep_frame import PARAM_LABELS, SWEEP_PARAMS, group_prefix, is_sweep_group, sweep_axes, sweep_frame

PARAM_RANGES = {"alpha": (0.0, 100.0), "beta": (0.0, 100.0), "tail_fraction": (0.0, 10.0)}  # (low open, high]
MAX_CELLS = 64
MAX_VALUES = 16


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
    reference = algorithm(ino.algorithm.name).gain_reference(ino.algorithm)  # IDP-SGD of INO's planner mode
    ref = base.replace(**{"algorithm.name": reference, "name": ""})
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
