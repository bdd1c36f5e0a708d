"""The curves over training as plans (:class:`engine.figures.scaffold.Plan`): MID curves, per-tier and
per-class recall, accuracy, ε spent and the recall gain INO − IDP. A plan holds the figure's data and
structure as plain values; :func:`engine.figures.scaffold.render` builds the Plotly figure from it (the
``fig_*`` builders and ``curve_parts`` of :mod:`engine.figures.training`), :mod:`engine.figures.live`
patches a kept figure.

Every curve is one *unit* (a run, or a series' mean over its seeds with a ± 1 SE band, see
:mod:`engine.figures.bands`), optionally smoothed (EMA; the raw curve faint behind), over the chosen x axis.
Trace ``meta`` values are stable keys ("line|<unit>|<tier>", "hi|…", "lo|…" for bands, "raw|…",
"initial|…", "legend|…"); a diverged run's facet carries an annotation named and reading "diverged".
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from engine.figures import bands as bd
from engine.figures.scaffold import (ALGORITHM_COLORS, EXTRA_COLORS, LEGEND_BESIDE, Plan, Span, Trace, algo_symbol,
                                     axis_name, esc, escape_columns, facets, fit_line, notes_below, rgba,
                                     stacked_panels, tier_color, wrap_words)
from engine.models.metrics import mid_markers

CURVE_FIGURES = ("mid_curves", "tier_recall", "class_recall", "accuracy", "epsilon_spent", "recall_gain_time")
DASHES = ("solid", "dash", "dashdot", "longdash", "longdashdot", "dot")
BADGE_COLOR = "#D55E00"
NEUTRAL = "#888888"
# Markers drawn per curve at most (evenly spread by Plotly): they tell algorithms apart; thousands of SVG
# markers would make every live redraw slow.
MAX_MARKERS = 40


def unit_styles(df: pd.DataFrame) -> dict:
    """unit → (colour, marker): the algorithm's colour for its first unit, distinct extra colours after."""
    used, out, extra = set(), {}, iter(EXTRA_COLORS * 8)
    units, first = np.unique(df["unit"].to_numpy(object), return_index=True)
    algos = df["algorithm"].to_numpy(object)[first]
    for i in np.argsort(first):
        unit, algo = units[i], algos[i]
        color = ALGORITHM_COLORS[algo] if algo in ALGORITHM_COLORS and algo not in used else next(extra)
        used.add(algo)
        out[unit] = (color, algo_symbol(algo))
    return out


def _groups(agg: pd.DataFrame, outer: str, inner: list[str], value: str) -> dict:
    """outer value → [(inner key, (steps, x, mean, se, n))] in order of first appearance, each curve in step
    order (one pass over numpy columns: no per-group frames)."""
    if agg.empty:
        return {}
    cols = {c: agg[c].to_numpy() for c in ("step", "x", value, "se", "n")}
    keys = [outer, *inner]
    groups = sorted(agg.groupby(keys, sort=False, dropna=False).indices.items(), key=lambda kv: kv[1].min())
    out: dict = {}
    for key, pos in groups:
        pos = pos[np.argsort(cols["step"][pos], kind="stable")]
        curve = (cols["step"][pos], cols["x"][pos].astype(float), cols[value][pos].astype(float),
                 cols["se"][pos].astype(float), int(cols["n"][pos].max()))
        out.setdefault(key[0], []).append((key[1:] if len(key) > 2 else key[1], curve))
    return out


def _curve(traces: list, key: str, x, mean, se, *, panel: int, color: str, name: str, group: str, show: bool,
           smoothing: float, band: bool, symbol: str = "circle", dash: str | None = None) -> None:
    """A unit's curve: the raw curve faint (when smoothed), the ± SE band (two traces), the line."""
    if smoothing > 0:
        traces.append(Trace(f"raw|{key}", x, mean, dict(mode="lines", name=f"{name} (raw)", line=dict(color=color, width=1),
                                                         opacity=0.3, showlegend=False, legendgroup=group,
                                                         hoverinfo="skip"), panel))
        y, s = bd.ema(mean, smoothing), bd.ema(se, smoothing)
    else:
        y, s = mean, se
    if band:
        common = dict(mode="lines", line=dict(width=0, color=color), showlegend=False, legendgroup=group, hoverinfo="skip")
        traces.append(Trace(f"lo|{key}", x, y - s, dict(name=f"{name} − SE", **common), panel))
        traces.append(Trace(f"hi|{key}", x, y + s, dict(name=f"{name} + SE", fill="tonexty", fillcolor=rgba(color, 0.22),
                                                        **common), panel))
    line = dict(color=color) if dash is None else dict(color=color, dash=dash)
    traces.append(Trace(f"line|{key}", x, y, dict(mode="lines+markers", name=name, line=line, legendgroup=group,
                                                  marker=dict(size=5, symbol=symbol, maxdisplayed=MAX_MARKERS),
                                                  showlegend=show), panel))


def _legend(traces: list, key: str, name: str, **style) -> None:
    """A legend-only entry explaining a mark (shading, dotted baselines, bands, raw curves, budgets)."""
    traces.append(Trace(f"legend|{key}", [None], [None], dict(name=name, showlegend=True, hoverinfo="skip",
                                                             legendgroup=f"legend|{key}", **style)))


def _mark_legends(traces: list, *, smoothing: float, band: bool) -> None:
    if band:
        _legend(traces, "band", "± 1 SE over seeds (band)", mode="markers",
                marker=dict(symbol="square", size=14, color=rgba(NEUTRAL, 0.35)))
    if smoothing > 0:
        _legend(traces, "raw", f"raw (faint; EMA {smoothing:g} drawn)", mode="lines",
                line=dict(color=NEUTRAL, width=1), opacity=0.4)


def _badge(text: str, panel: int, k: int = 0) -> dict:
    xref, yref = axis_name("x", panel).replace("axis", ""), axis_name("y", panel).replace("axis", "")
    return dict(text=text, name="diverged", xref=f"{xref} domain", yref=f"{yref} domain", x=0.98, y=0.97 - 0.09 * k,
                xanchor="right", yanchor="top", showarrow=False, font=dict(color=BADGE_COLOR, size=13),
                bgcolor="rgba(255,255,255,0.75)", bordercolor=BADGE_COLOR, borderwidth=1)


def _clip_range(rows: pd.DataFrame) -> list:
    """A y range holding ``rows``' mean ± SE (the curve before it diverged), padded by 10 %."""
    vals = np.concatenate([(rows["loss"] - rows["se"]).to_numpy(float), (rows["loss"] + rows["se"]).to_numpy(float)])
    vals = vals[np.isfinite(vals)]
    if not len(vals):
        return [0.0, 1.0]
    lo, hi = float(vals.min()), float(vals.max())
    pad = 0.1 * (hi - lo) or 0.1 * abs(hi) or 0.1
    return [lo - pad, hi + pad]


def _mid_span(steps, mean, x):
    m = mid_markers([[v] for v in mean], list(steps))[0]
    if m["onset_step"] is None:
        return None
    idx = {s: i for i, s in enumerate(steps)}
    return float(x[idx[m["onset_step"]]]), float(x[idx[m["end_step"]]] if m["end_step"] is not None else x[-1])


def _missing_note(missing: list, x_axis: str, y: float = -0.3) -> dict:
    what = "no ε spent recorded (no formal DP guarantee)" if x_axis == "epsilon" else f"no {x_axis} recorded"
    return dict(text=f"not on this x axis — {what}: " + "; ".join(missing), xref="paper", yref="paper", x=0, y=y,
                showarrow=False, xanchor="left", font=dict(size=11))


def _prepare(df: pd.DataFrame, bands: bool, x_axis: str, *, per_tier: bool, text=("run", "tier", "series"),
             run_col="run", id_col="run_id"):
    df = bd.with_units(escape_columns(df, *text), bands, run_col=run_col, id_col=id_col)
    return bd.with_x(df, x_axis, per_tier=per_tier)


# --- MID curves ------------------------------------------------------------------------------------------

def mid_curves_plan(hist: pd.DataFrame, *, layout: str = "facet", x_axis: str = "step", smoothing: float = 0.0,
                    bands: bool = True, other_tiers: bool = True, title: str | None = None) -> Plan:
    """Per-tier test loss, the MID span of each tier (loss above its initial value) shaded, a dotted line at
    each initial loss. ``facet``: one panel per unit, each with its own y axis; a diverged unit's panel is
    clipped to its curve before divergence and badged "diverged". ``overlay``: one panel with the most
    private tier of every unit (IDP vs INO: the talk plot), the other tiers faint (``other_tiers``)."""
    overlay = layout == "overlay"
    if title is None:
        top = hist.sort_values("tier_index", kind="stable")["tier"].iloc[0] if not hist.empty else ""
        title = (f"MID, most private tier ({top}): test loss per run (shaded: MID spans)" if overlay
                 else "MID curves: per-tier test loss (shaded: MID spans)")
    if hist.empty:
        return Plan(title, empty="no evaluations yet")
    df, missing = _prepare(hist, bands, x_axis, per_tier=True)
    if df.empty:
        return Plan(title, empty=_missing_note(missing, x_axis)["text"])
    diverged = bd.diverged_units(df)
    agg = bd.seed_mean(df, ["unit", "algorithm", "tier", "tier_index", "step"], "loss", extra=("x",))
    agg = agg.sort_values("tier_index", kind="stable")
    by_unit = _groups(agg, "unit", ["tier", "tier_index"], "loss")
    units = list(df["unit"].unique())
    styles = unit_styles(df)
    traces, spans, notes, ranges, shown, any_band = [], [], [], {}, set(), False
    for p, u in enumerate(units):
        top = min(ti for (_, ti), _ in by_unit[u])
        color_u, symbol = styles[u]
        for (tier, ti), g in by_unit[u]:
            steps, x, m, se, n = g
            band = bands and n > 1
            key = f"{u}|{tier}"
            if overlay and ti != top:
                if other_tiers:
                    traces.append(Trace(f"faint|{key}", x, bd.ema(m, smoothing), dict(
                        mode="lines", name=f"{u} · {tier}", line=dict(color=color_u, width=1), opacity=0.35,
                        showlegend=False, legendgroup=f"unit|{u}"), 0))
                continue
            any_band |= band
            color = color_u if overlay else tier_color(int(ti))
            _curve(traces, key, x, m, se, panel=0 if overlay else p, color=color,
                   name=f"{u} · {tier}" if overlay else tier, group=f"unit|{u}" if overlay else f"tier|{tier}",
                   show=overlay or tier not in shown, smoothing=smoothing, band=band,
                   symbol=symbol if overlay else "circle", dash=DASHES[p % len(DASHES)] if overlay else None)
            shown.add(tier)
            traces.append(Trace(f"initial|{key}", [x[0], x[-1]], [m[0], m[0]], dict(
                mode="lines", name=f"{tier} initial loss", line=dict(color=color, dash="dot", width=1),
                hoverinfo="skip", showlegend=False, legendgroup=f"unit|{u}" if overlay else f"tier|{tier}"),
                0 if overlay else p))
            span = _mid_span(steps, m, x)
            if span:
                spans.append(Span(f"mid|{key}", span[0], span[1], color, 0.10 if overlay else 0.12, 0 if overlay else p))
        if u in diverged:
            gu = agg[agg.unit == u]
            if overlay:
                notes.append(_badge(f"diverged: {u}", 0, len(notes)))
            else:
                ranges[p] = _clip_range(gu[gu.step < diverged[u]] if (gu.step < diverged[u]).any() else gu.iloc[:1])
                notes.append(_badge("diverged", p))
    if overlay and diverged:
        main = agg[agg.groupby("unit")["tier_index"].transform("min") == agg["tier_index"]]
        keep = main[[u not in diverged or s < diverged[u] for u, s in zip(main["unit"], main["step"])]]
        ranges[0] = _clip_range(keep if not keep.empty else main.iloc[:1])
    _legend(traces, "initial", "initial loss (dotted)", mode="lines", line=dict(color=NEUTRAL, dash="dot", width=1.5))
    _legend(traces, "mid", "MID span: loss above its initial value (shaded)", mode="markers",
            marker=dict(symbol="square", size=14, color=rgba(NEUTRAL, 0.3)))
    if overlay and other_tiers and agg["tier_index"].nunique() > 1:
        _legend(traces, "faint", "other tiers (faint)", mode="lines", line=dict(color=NEUTRAL, width=1), opacity=0.4)
    _mark_legends(traces, smoothing=smoothing, band=any_band)
    if missing:
        notes.append(_missing_note(missing, x_axis))
    x_title = bd.x_title(x_axis, per_tier=True)
    if overlay:
        return Plan(title, traces, spans, notes=notes, x_title=x_title, y_title="test loss", y_ranges=ranges)
    nrows, _ = facets(len(units))
    return Plan(title, traces, spans, panels=units, notes=notes, x_title=x_title, y_title="test loss",
                y_ranges=ranges, shared_y=False, height=max(380, 320 * nrows))


# --- recall, accuracy --------------------------------------------------------------------------------------

def _panel_lines(agg: pd.DataFrame, panel_col: str, panels: list, value: str, styles: dict, *, smoothing: float,
                 bands: bool) -> tuple[list, bool]:
    traces, shown, any_band = [], set(), False
    by_panel = _groups(agg, panel_col, ["unit"], value)
    for p, panel in enumerate(panels):
        for u, g in by_panel.get(panel, []):
            _, x, m, se, n = g
            color, symbol = styles[u]
            any_band |= bands and n > 1
            _curve(traces, f"{u}|{panel}", x, m, se, panel=p, color=color, name=u, group=f"unit|{u}",
                   show=u not in shown, smoothing=smoothing, band=bands and n > 1, symbol=symbol)
            shown.add(u)
    return traces, any_band


def _grid_plan(df, missing, panel_col, panels, value, *, title, x_axis, per_tier, smoothing, bands, max_cols=3):
    agg = bd.seed_mean(df, ["unit", "algorithm", panel_col, "step"], value, extra=("x",))
    styles = unit_styles(df)
    traces, any_band = _panel_lines(agg, panel_col, panels, value, styles, smoothing=smoothing, bands=bands)
    _mark_legends(traces, smoothing=smoothing, band=any_band)
    nrows, _ = facets(len(panels), max_cols)
    return Plan(title, traces, panels=panels, notes=[_missing_note(missing, x_axis)] if missing else [],
                x_title=bd.x_title(x_axis, per_tier=per_tier), y_title="recall", y_range=[-0.02, 1.02],
                max_cols=max_cols, vertical_spacing=0.14 if len(panels) > max_cols else 0.1,
                height=max(360, 260 * nrows + 80))


def tier_recall_plan(hist: pd.DataFrame, *, x_axis: str = "step", smoothing: float = 0.0, bands: bool = True,
                     title: str = "Per-tier recall over training") -> Plan:
    if hist.empty:
        return Plan(title, empty="no evaluations yet")
    df, missing = _prepare(hist, bands, x_axis, per_tier=True)
    if df.empty:
        return Plan(title, empty=_missing_note(missing, x_axis)["text"])
    panels = list(df.sort_values("tier_index", kind="stable")["tier"].unique())
    return _grid_plan(df, missing, "tier", panels, "recall", title=title, x_axis=x_axis, per_tier=True,
                      smoothing=smoothing, bands=bands)


def class_recall_plan(ch: pd.DataFrame, *, x_axis: str = "step", smoothing: float = 0.0, bands: bool = True,
                      title: str = "Per-class recall over training", max_classes: int = 20) -> Plan:
    if ch.empty:
        return Plan(title, empty="no evaluations yet")
    df = ch.copy()
    cls, tier = df["class"].astype(str), df["tier"].fillna("").astype(str)
    df["panel"] = cls.where(tier == "", cls + " (" + tier + ")")
    df, missing = _prepare(df, bands, x_axis, per_tier=False, text=("run", "panel", "series"))
    if df.empty:
        return Plan(title, empty=_missing_note(missing, x_axis)["text"])
    panels = list(df["panel"].unique())[:max_classes]
    return _grid_plan(df[df["panel"].isin(panels)], missing, "panel", panels, "recall", title=title, x_axis=x_axis,
                      per_tier=False, smoothing=smoothing, bands=bands, max_cols=5)


def accuracy_plan(overall: pd.DataFrame, *, x_axis: str = "step", smoothing: float = 0.0, bands: bool = True,
                  title: str = "Overall test accuracy") -> Plan:
    if overall.empty:
        return Plan(title, empty="no evaluations yet")
    df, missing = _prepare(overall, bands, x_axis, per_tier=False, text=("run", "series"))
    if df.empty:
        return Plan(title, empty=_missing_note(missing, x_axis)["text"])
    df = df.assign(panel="")
    agg = bd.seed_mean(df, ["unit", "algorithm", "panel", "step"], "accuracy", extra=("x",))
    traces, any_band = _panel_lines(agg, "panel", [""], "accuracy", unit_styles(df), smoothing=smoothing, bands=bands)
    _mark_legends(traces, smoothing=smoothing, band=any_band)
    return Plan(title, traces, notes=[_missing_note(missing, x_axis)] if missing else [],
                x_title=bd.x_title(x_axis, per_tier=False), y_title="accuracy", y_range=[-0.02, 1.02])


# --- ε spent, recall gain ------------------------------------------------------------------------------

# Under RDP the ε of the first steps is loose: why the curve jumps early (PLD's rises smoothly). The chart's note.
RDP_EARLY_NOTE = ("RDP: its conversion to (ε, δ) adds log(1/δ)/(α − 1), which dominates after few steps, so the first "
                  "steps' ε spent is loose and jumps early; the curve is an upper bound, and the final ε is what the "
                  "plan promised.")
EPSILON_PANEL_PX = 220  # each run's panel of the ε-spent chart (stacked, one column)
# a panel title (16 px) on one line of the narrowest chart (a half-width column, the legend beside the plot)
PANEL_TITLE_CHARS = 44
NOTE_CHARS = 110  # the notes under the plot, as lines of at most this many characters (Plotly does not wrap them)


def epsilon_spent_plan(hist: pd.DataFrame, *, notes: dict | None = None, accountants: dict | None = None,
                       x_axis: str = "step", bands: bool = True,
                       title: str = "ε spent per tier vs budget (dashed)") -> Plan:
    """Per unit: each tier's ε spent so far (the run's accountant's) and its budget as a dashed line. The seeds of a
    series spend the same ε: one panel per series, stacked in one column (each panel's title, the unit and the
    head of its DP note, on one line of at most :data:`PANEL_TITLE_CHARS`; the note's rest below the plot), the
    legend beside. ``notes``: run label (raw) → its DP note; ``accountants``: run label → its accountant's name
    (a run under RDP adds :data:`RDP_EARLY_NOTE`). ``x_axis="epsilon"`` plots over steps (ε is the y axis)."""
    notes = notes or {}  # keyed by run label (raw)
    accounted = hist.dropna(subset=["epsilon_spent"]) if not hist.empty else hist
    # runs without a formal guarantee record ε spent as null: name them (and why) instead of a curve
    unaccounted = list(hist["run"].unique()) if not hist.empty else []
    unaccounted = [r for r in unaccounted if r not in set(accounted["run"])]
    text = "ε spent null (no accounting): " + "; ".join(
        f"{esc(r)} — {esc(notes.get(r) or 'no formal DP guarantee')}" for r in unaccounted)
    if accounted.empty:
        return Plan(title, empty=text if unaccounted else "no privacy accounting (non-private runs or no evaluations yet)")
    axis = "step" if x_axis == "epsilon" else x_axis
    df, missing = _prepare(accounted, bands, axis, per_tier=True)
    if df.empty:
        return Plan(title, empty=_missing_note(missing, axis)["text"])
    pairs = pd.DataFrame({"unit": df["unit"], "run": accounted.loc[df.index, "run"]}).drop_duplicates()
    unit_note = {u: esc(notes.get(r, "")) for u, r in pairs.itertuples(index=False)}
    agg = bd.seed_mean(df, ["unit", "tier", "tier_index", "epsilon", "step"], "epsilon_spent", extra=("x",))
    units = list(df["unit"].unique())
    traces, shown = [], set()
    by_unit = _groups(agg, "unit", ["tier", "tier_index", "epsilon"], "epsilon_spent")
    for p, u in enumerate(units):
        for (tier, ti, eps), g in by_unit[u]:
            _, x, m, _, _ = g
            color = tier_color(int(ti))
            traces.append(Trace(f"line|{u}|{tier}", x, m, dict(mode="lines+markers", name=tier, line=dict(color=color),
                                                               marker=dict(size=4, maxdisplayed=MAX_MARKERS),
                                                               legendgroup=f"tier|{tier}",
                                                               showlegend=tier not in shown), p))
            shown.add(tier)
            traces.append(Trace(f"budget|{u}|{tier}", [min(0.0, float(np.nanmin(x))), max(float(np.nanmax(x)), 1e-9)],
                                [eps, eps], dict(mode="lines", name=f"{tier} budget", hoverinfo="name+y",
                                                 line=dict(color=color, dash="dash", width=1.5),
                                                 legendgroup=f"tier|{tier}", showlegend=False), p))
    _legend(traces, "budget", "budget ε (dashed)", mode="lines", line=dict(color=NEUTRAL, dash="dash", width=1.5))
    panels, lines = [], []
    for u in units:
        head, _, rest = unit_note.get(u, "").partition(": ")  # "no formal DP guarantee: <why>"
        panels.append(fit_line(f"{u} — {head}" if head else u, PANEL_TITLE_CHARS))
        if rest:
            lines.append(f"{u}: {unit_note[u]}")
    if missing:
        lines.append(_missing_note(missing, axis)["text"])
    if unaccounted:
        lines.append(text)
    if any((accountants or {}).get(r) == "rdp" for r in accounted["run"].unique()):
        lines.append(esc(RDP_EARLY_NOTE))
    words = [w for line in lines for w in wrap_words(line, NOTE_CHARS)]
    plot_px, spacing = stacked_panels(len(units), EPSILON_PANEL_PX)
    below, layout = notes_below(words, plot_px=plot_px, name="epsilon_notes")
    x_title = bd.x_title(axis, per_tier=True) + (" (ε spent is the y axis)" if x_axis == "epsilon" else "")
    return Plan(title, traces, panels=panels, notes=[below] if below is not None else [], x_title=x_title,
                y_title="ε", shared_y=False, max_cols=1, vertical_spacing=spacing, height=layout["height"],
                y_rangemode="tozero", layout=dict(margin=layout["margin"], legend=LEGEND_BESIDE))


# More INO/IDP pairs (or series of paired seeds) than this on one gain chart: one panel per pair (small
# multiples), stacked, instead of one panel of dash styles and a legend entry per pair and tier.
MAX_OVERLAID_PAIRS = 1
GAIN_PANEL_PX = 260  # each pair's panel (the plot area of a one-pair chart too)


def recall_gain_time_plan(gain: pd.DataFrame, *, x_axis: str = "step", smoothing: float = 0.0, bands: bool = True,
                          title: str = "Recall gain INO − IDP per tier over training") -> Plan:
    """Per tier: INO's recall minus its IDP-SGD pair's, in recall points (pp: the unit the gain sentence and the
    tables say; the frame keeps fractions); for a series of paired seeds the mean paired gain with a ± 1 SE band.
    Below the plot, in words, whether each gain is beyond the seed spread; the legend (the tiers) beside it; with
    more than :data:`MAX_OVERLAID_PAIRS` pairs one panel per pair, stacked, each as tall as a lone pair's plot:
    the figure grows with the pairs and their words, the plots keep their height."""
    if gain.empty:
        return Plan(title, empty="select an INO-SGD run and the IDP-SGD run it builds on")
    points = gain.assign(gain=100.0 * gain["gain"].astype(float))
    df, missing = _prepare(points, bands, x_axis, per_tier=True, text=("pair", "tier", "series"), run_col="pair",
                           id_col="ino_run_id")
    if df.empty:
        return Plan(title, empty=_missing_note(missing, x_axis)["text"])
    agg = bd.seed_mean(df, ["unit", "tier", "tier_index", "step"], "gain", extra=("x",))
    by_unit = _groups(agg.sort_values("tier_index", kind="stable"), "unit", ["tier", "tier_index"], "gain")
    units = list(df["unit"].unique())
    panels = units if len(units) > MAX_OVERLAID_PAIRS else None
    traces, any_band, shown = [], False, set()
    for i, u in enumerate(units):
        for (tier, ti), g in by_unit[u]:
            _, x, m, se, n = g
            any_band |= bands and n > 1
            _curve(traces, f"{u}|{tier}", x, m, se, panel=i if panels else 0, color=tier_color(int(ti)),
                   name=tier, group=f"tier|{tier}", show=tier not in shown, smoothing=smoothing,
                   band=bands and n > 1)
            shown.add(tier)
    _mark_legends(traces, smoothing=smoothing, band=any_band)
    words = [esc(w) for w in bd.gain_spread_words(bd.recall_gain_spread(gain))]
    if missing:
        words.append(_missing_note(missing, x_axis)["text"])
    plot_px, spacing = stacked_panels(len(panels), GAIN_PANEL_PX) if panels else (GAIN_PANEL_PX, None)
    below, layout = notes_below(words, plot_px=plot_px, name="gain_spread")
    hline = dict(y=0, line=dict(color="gray", width=1))
    return Plan(title, traces, panels=panels, notes=[below] if below is not None else [],
                hlines=[{**hline, "row": "all", "col": 1}] if panels else [hline],
                x_title=bd.x_title(x_axis, per_tier=True), y_title="recall gain, INO − IDP (pp)", max_cols=1,
                vertical_spacing=spacing, height=layout["height"],
                layout=dict(margin=layout["margin"], legend=LEGEND_BESIDE))
