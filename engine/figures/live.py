"""Figures that stay live: :class:`LiveFigures` keeps the figures of a refreshing selection and, when a
refresh only brings new evaluations of the same runs, patches them instead of building them again.

A refresh is *structural* — and the figures are built again — when the runs (ids), their statuses, their
tiers or classes or the figure options changed, or when a figure's plan
(:meth:`engine.figures.scaffold.Plan.structure`) changed: a new trace, a new MID span, a run newly diverged,
a new note. Otherwise each curve figure's plan is computed from the tidy frames (cheap: no Plotly objects)
and only its data parts are written into the kept figure in place: every trace's x/y arrays (the old
arrays plus the new evaluations), the MID spans' ends, the clipped y ranges and the note texts; the
FigureSpec gets the new data frame. Figures that are not curves (tables, bars, DP-SGD-S's group clips) are
built again on every data change. The patched figure equals a freshly built one (tests/test_live_figures.py).
Each stored evaluation is converted to its record (``engine.train.records.EvalRecord``) once: a refresh converts
only the new ones (a structural refresh keeps the records of the runs whose own status and tiers did not change).

The data frames behind the curves are kept too, keyed by what the runs have logged (each run's evaluation count
and last step, with the structural signature): a view change (x unit, smoothing, layout) with nothing new logged
computes only the plans from them and renders the figures, and a refresh with nothing new rebuilds nothing.

Counters (per instance): ``builds`` — figures built (rendered from scratch); ``patches`` — figures patched;
``frame_reads`` — times the data frames were computed from the runs' evaluations (once per new logged step).

Use (one instance per view, kept across refreshes, e.g. in the session state)::

    live = LiveFigures(LIVE_FIGURES, theme="light", mid_layout="facet")
    specs = live.update(records)                       # {name: FigureSpec}, figures kept and patched
    specs = live.update(records, x_axis="epoch")       # a changed option: rebuilt once (from the kept frames)
"""
from __future__ import annotations

import numpy as np

from engine.figures import bands as bd
from engine.figures import frames as fr
from engine.figures.scaffold import FigureSpec, Plan, axis_name, drawn, render
from engine.figures.training import (CURVE_NAMES, CURVE_TITLES, EXTRA_FIGURES, LIVE_FIGURES, RESULT_FIGURES,
                                     build_figures, curve_parts)


def _signature(records: list[dict], memo: dict | None = None) -> tuple:
    """What makes a refresh structural at the level of the selection: run ids, statuses, tiers, classes
    (``memo``: the view's frame memo, whose evaluation records it reads)."""
    out = []
    for r in records:
        last = fr.last_eval(r, memo)
        out.append((r["id"], r.get("status"), r.get("name"), last is not None,
                    tuple((t.name, t.epsilon) for t in last.tiers) if last is not None else (),
                    tuple(c.name for c in last.classes) if last is not None else ()))
    return tuple(out)


def _last_step(record: dict):
    """The step of a run record's last logged evaluation (a stored dict or an evaluation record); None before one."""
    evals = record.get("evals") or []
    if not evals:
        return None
    last = evals[-1]
    return last.get("step") if isinstance(last, dict) else getattr(last, "step", None)


def _same(a, b) -> bool:
    a, b = np.asarray(a, dtype=object), np.asarray(b, dtype=object)
    if a.shape != b.shape:
        return False
    try:
        return bool(np.allclose(a.astype(float), b.astype(float), equal_nan=True, rtol=0, atol=0))
    except (TypeError, ValueError):
        return bool((a == b).all())


def patch_figure(fig, plan: Plan) -> None:
    """Write ``plan``'s data parts into ``fig``, rendered from a plan of the same structure: no Plotly
    object is created, none is added or removed."""
    for trace, t in zip(fig.data, plan.traces):
        x, y = drawn(t.x), drawn(t.y)
        if not _same(trace.x, x):
            trace.x = x
        if not _same(trace.y, y):
            trace.y = y
    shapes = fig.layout.shapes
    for shape, s in zip(shapes, plan.spans):  # spans are the first shapes (h-lines follow)
        if shape.x0 != s.x0:
            shape.x0 = s.x0
        if shape.x1 != s.x1:
            shape.x1 = s.x1
    notes = fig.layout.annotations[len(fig.layout.annotations) - len(plan.notes):] if plan.notes else ()
    for ann, n in zip(notes, plan.notes):
        if ann.text != n["text"]:
            ann.text = n["text"]
    for p, r in plan.y_ranges.items():
        axis = fig.layout[axis_name("y", p)]
        if list(axis.range or ()) != list(r):
            axis.range = r


class LiveFigures:
    """The live figures of one view: ``LiveFigures(names, theme=…, mid_layout=…, x_axis=…, smoothing=…,
    bands=…)``; :meth:`update` (run records with ``evals``) → {name: FigureSpec}, patched where it can be."""

    def __init__(self, names, **figure_options):
        self.names = list(names)
        unknown = [n for n in self.names if n not in LIVE_FIGURES + RESULT_FIGURES + EXTRA_FIGURES]
        if unknown:
            raise ValueError(f"unknown figure {unknown[0]!r}")
        self.theme = figure_options.pop("theme", "light")
        self.options = {"mid_layout": "facet", "x_axis": "step", "smoothing": 0.0, "bands": True, **figure_options}
        bd.check_options(mid_layout=self.options["mid_layout"], x_axis=self.options["x_axis"],
                         smoothing=self.options["smoothing"])
        self.builds = 0
        self.patches = 0
        self.frame_reads = 0
        self._frames: dict = {}  # the curves' data frames (engine.figures.training.curve_parts) …
        self._frames_key = None  # … of these logged evaluations: (signature, each run's count and last step)
        self._signature = None
        self._plans: dict[str, Plan] = {}
        self._specs: dict[str, FigureSpec] = {}
        self._evals: tuple = ()
        self._memo: dict = {}  # the frames' memo: evaluation records and their rows so far (engine.figures.frames)

    def update(self, records: list[dict], **figure_options) -> dict[str, FigureSpec]:
        """The figures of ``records``; ``figure_options`` (optional) change the options: a rebuild."""
        if figure_options:
            options = {**self.options, **{k: v for k, v in figure_options.items() if k != "theme"}}
            theme = figure_options.get("theme", self.theme)
            if options != self.options or theme != self.theme:
                bd.check_options(mid_layout=options["mid_layout"], x_axis=options["x_axis"],
                                 smoothing=options["smoothing"])
                self.options, self.theme, self._signature = options, theme, None
        signature = _signature(records, self._memo)
        if signature != self._signature:
            self._plans.clear()
            self._specs.clear()
            before = {entry[0]: entry for entry in self._signature or ()}
            fr.forget(self._memo, [entry[0] for entry in signature if before.get(entry[0], entry) != entry])
            self._signature = signature
        counts = tuple((len(r.get("evals") or []), _last_step(r)) for r in records)
        if self._specs and counts == self._evals:
            return dict(self._specs)  # nothing new
        self._evals = counts
        if self._frames_key != (signature, counts):  # new evaluations (or runs): the frames are read again
            self._frames, self._frames_key = {}, (signature, counts)
            self.frame_reads += 1
        curve_names = [n for n in self.names if n in CURVE_NAMES]
        parts = curve_parts(records, curve_names, memo=self._memo, frames=self._frames, **self.options)
        rebuild = []
        for name in self.names:
            old = self._plans.get(name)
            if name not in parts or old is None or old.structure() != parts[name][0].structure():
                rebuild.append(name)
                continue
            plan, data = parts[name]
            spec = self._specs[name]
            patch_figure(spec.figure, plan)
            self._plans[name] = plan
            self._specs[name] = FigureSpec(spec.name, spec.title, spec.figure, data)
            self.patches += 1
        if rebuild:
            others = [n for n in rebuild if n not in parts]
            built = {s.name: s for s in build_figures(records, theme=self.theme, names=others, memo=self._memo,
                                                      **self.options)} if others else {}
            for name in rebuild:
                if name in parts:
                    plan, data = parts[name]
                    built[name] = FigureSpec(name, CURVE_TITLES[name], render(plan, self.theme), data)
                    self._plans[name] = plan
                self._specs[name] = built[name]
                self.builds += 1
        return {n: self._specs[n] for n in self.names}
