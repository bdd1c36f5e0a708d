"""The curves over training as plans (:class:`engine.figures.scaffold.Plan`): MID curves, per-tier and
per-class recall, accuracy, ε spent and the recall gain INO − IDP. A plan holds the figure's data and
structure as plain values; :func:`engine.figures.scaffold.render` builds the Plotly figure from it (the
``fig_*`` builders of :mod:`engine.figures.training`), :mod:`engine.figures.live` patches a kept figure.

Every curve is one *unit* (a run, or a series' mean over its seeds with a ± 1 SE band, see
:mod:`engine.figures.bands`), optionally smoothed (EMA; the raw curve faint behind), over the chosen x axis.
Trace ``meta`` values are stable keys ("line|<unit>|<tier>", "hi|…", "lo|…" for bands, "raw|…",
"initial|…", "legend|…"); a diverged run's facet carries an annotation named and reading "diverged".
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from engine.figures import bands as bd
from engine.figures import frames as fr
from engine.figures.scaffold import (ALGORITHM_COLORS, EXTRA_COLORS, Plan, Span, Trace, algo_symbol, axis_name,
                                     escape_columns, esc, facets, rgba, tier_color)

CURVE_FIGURES = ("mid_curves", "tier_recall", "class_recall", "accuracy", "epsilon_spent", "recall_gain_time")
DASHES = ("solid", "dash", "dashdot", "longdash", "longdashdot", "dot")
BADGE_COLOR = "#D55E00"
NEUTRAL = "#888888"


def unit_styles(df: pd.DataFrame) -> dict:
    """unit → (colour, marker): the algorithm's colour for its first unit, distinct extra colours after."""
    used, out, extra = set(), {}, iter(EXTRA_COLORS * 8)
    for unit, algo in dict.fromkeys(zip(df["unit"], df["algorithm"])):
        if unit in out:
            continue
        color = ALGORITHM_COLORS[algo] if algo in ALGORITHM_COLORS and algo not in used else next(extra)
        used.add(algo)
        out[unit] = (color, algo_symbol(algo))
    return out


def _arrays(g: pd.DataFrame, value: str):
    g = g.sort_values("step")
    return (g["step"].to_numpy(), g["x"].to_numpy(float), g[value].to_numpy(float), g["se"].to_numpy(float),
            int(g["n"].max()))


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
                                                  marker=dict(size=5, symbol=symbol), showlegend=show), panel))


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
    from engine.metrics import mid_markers

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
    agg = agg.sort_values(["tier_index", "step"], kind="stable")
    units = list(dict.fromkeys(df["unit"]))
    styles = unit_styles(df)
    traces, spans, notes, ranges, shown, any_band = [], [], [], {}, set(), False
    for p, u in enumerate(units):
        gu = agg[agg.unit == u]
        top = gu["tier_index"].min()
        color_u, symbol = styles[u]
        for (tier, ti), g in gu.groupby(["tier", "tier_index"], sort=False):
            steps, x, m, se, n = _arrays(g, "loss")
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
    for p, panel in enumerate(panels):
        for u, g in agg[agg[panel_col] == panel].groupby("unit", sort=False):
            _, x, m, se, n = _arrays(g, value)
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
    panels = list(dict.fromkeys(df.sort_values("tier_index", kind="stable")["tier"]))
    return _grid_plan(df, missing, "tier", panels, "recall", title=title, x_axis=x_axis, per_tier=True,
                      smoothing=smoothing, bands=bands)


def class_recall_plan(ch: pd.DataFrame, *, x_axis: str = "step", smoothing: float = 0.0, bands: bool = True,
                      title: str = "Per-class recall over training", max_classes: int = 20) -> Plan:
    if ch.empty:
        return Plan(title, empty="no evaluations yet")
    df = ch.copy()
    df["panel"] = [f"{c} ({t})" if t else str(c) for c, t in zip(df["class"], df["tier"])]
    df, missing = _prepare(df, bands, x_axis, per_tier=False, text=("run", "panel", "series"))
    if df.empty:
        return Plan(title, empty=_missing_note(missing, x_axis)["text"])
    panels = list(dict.fromkeys(df["panel"]))[:max_classes]
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

def epsilon_spent_plan(hist: pd.DataFrame, *, notes: dict | None = None, x_axis: str = "step", bands: bool = True,
                       title: str = "ε spent per tier vs budget (dashed)") -> Plan:
    """Per unit: each tier's ε spent so far (Opacus RDP) and its budget as a dashed line. The seeds of a
    series spend the same ε: one panel per series. ``x_axis="epsilon"`` plots over steps (ε is the y axis)."""
    notes = notes or {}  # keyed by run label (raw)
    accounted = hist.dropna(subset=["epsilon_spent"]) if not hist.empty else hist
    # runs without a formal guarantee record ε spent as null: name them (and why) instead of a curve
    unaccounted = [r for r in dict.fromkeys(hist["run"])] if not hist.empty else []
    unaccounted = [r for r in unaccounted if r not in set(accounted["run"])]
    text = "ε spent null (no accounting): " + "; ".join(
        f"{esc(r)} — {esc(notes.get(r) or 'no formal DP guarantee')}" for r in unaccounted)
    if accounted.empty:
        return Plan(title, empty=text if unaccounted else "no privacy accounting (non-private runs or no evaluations yet)")
    axis = "step" if x_axis == "epsilon" else x_axis
    df, missing = _prepare(accounted, bands, axis, per_tier=True)
    if df.empty:
        return Plan(title, empty=_missing_note(missing, axis)["text"])
    unit_note = {u: esc(notes.get(r, "")) for u, r in zip(df["unit"], accounted.loc[df.index, "run"])}
    agg = bd.seed_mean(df, ["unit", "tier", "tier_index", "epsilon", "step"], "epsilon_spent", extra=("x",))
    units = list(dict.fromkeys(df["unit"]))
    traces, shown = [], set()
    for p, u in enumerate(units):
        for (tier, ti, eps), g in agg[agg.unit == u].groupby(["tier", "tier_index", "epsilon"], sort=False):
            _, x, m, _, _ = _arrays(g, "epsilon_spent")
            color = tier_color(int(ti))
            traces.append(Trace(f"line|{u}|{tier}", x, m, dict(mode="lines+markers", name=tier, line=dict(color=color),
                                                               marker=dict(size=4), legendgroup=f"tier|{tier}",
                                                               showlegend=tier not in shown), p))
            shown.add(tier)
            traces.append(Trace(f"budget|{u}|{tier}", [min(0.0, float(np.nanmin(x))), max(float(np.nanmax(x)), 1e-9)],
                                [eps, eps], dict(mode="lines", name=f"{tier} budget", hoverinfo="name+y",
                                                 line=dict(color=color, dash="dash", width=1.5),
                                                 legendgroup=f"tier|{tier}", showlegend=False), p))
    _legend(traces, "budget", "budget ε (dashed)", mode="lines", line=dict(color=NEUTRAL, dash="dash", width=1.5))
    out_notes = [_missing_note(missing, axis)] if missing else []
    if unaccounted:
        out_notes.append(dict(text=text, xref="paper", yref="paper", x=0, y=-0.18, showarrow=False, xanchor="left",
                              font=dict(size=11)))
    x_title = bd.x_title(axis, per_tier=True) + (" (ε spent is the y axis)" if x_axis == "epsilon" else "")
    nrows, _ = facets(len(units))
    return Plan(title, traces, panels=[f"{u} — {unit_note[u]}" if unit_note.get(u) else u for u in units],
                notes=out_notes, x_title=x_title, y_title="ε", shared_y=False, height=max(380, 320 * nrows),
                y_rangemode="tozero")


def recall_gain_time_plan(gain: pd.DataFrame, *, x_axis: str = "step", smoothing: float = 0.0, bands: bool = True,
                          title: str = "Recall gain INO − IDP per tier over training") -> Plan:
    """Per tier: INO's recall minus its IDP-SGD pair's; for a series of paired seeds the mean paired gain
    with a ± 1 SE band, and above the plot, in words, whether the gain is beyond the seed spread."""
    if gain.empty:
        return Plan(title, empty="select an INO-SGD run and the IDP-SGD run it builds on")
    df, missing = _prepare(gain, bands, x_axis, per_tier=True, text=("pair", "tier", "series"), run_col="pair",
                           id_col="ino_run_id")
    if df.empty:
        return Plan(title, empty=_missing_note(missing, x_axis)["text"])
    agg = bd.seed_mean(df, ["unit", "tier", "tier_index", "step"], "gain", extra=("x",))
    agg = agg.sort_values(["tier_index", "step"], kind="stable")
    units = list(dict.fromkeys(df["unit"]))
    traces, any_band = [], False
    for i, u in enumerate(units):
        for (tier, ti), g in agg[agg.unit == u].groupby(["tier", "tier_index"], sort=False):
            _, x, m, se, n = _arrays(g, "gain")
            any_band |= bands and n > 1
            _curve(traces, f"{u}|{tier}", x, m, se, panel=0, color=tier_color(int(ti)),
                   name=tier + (f" · {u}" if len(units) > 1 else ""), group=f"{u}|{tier}", show=True,
                   smoothing=smoothing, band=bands and n > 1, dash=DASHES[i % len(DASHES)])
    _mark_legends(traces, smoothing=smoothing, band=any_band)
    words = bd.gain_spread_words(bd.recall_gain_spread(gain))
    notes = [dict(text="<br>".join(esc(w) for w in words), name="gain_spread", xref="paper", yref="paper", x=0,
                  y=1.0, yanchor="bottom", xanchor="left", align="left", showarrow=False, font=dict(size=11))]
    if missing:
        notes.append(_missing_note(missing, x_axis))
    return Plan(title, traces, notes=notes, hlines=[dict(y=0, line=dict(color="gray", width=1))],
                x_title=bd.x_title(x_axis, per_tier=True), y_title="recall gain (INO − IDP)",
                layout=dict(margin=dict(t=90 + 16 * len(words))))


# --- the curve figures of a selection ----------------------------------------------------------------------

CURVE_TITLES = {"mid_curves": "MID curves", "tier_recall": "Per-tier recall", "class_recall": "Per-class recall",
                "accuracy": "Overall accuracy", "epsilon_spent": "ε spent vs budget",
                "recall_gain_time": "Recall gain over training"}


def curve_parts(runs: list[dict], names, *, mid_layout: str = "facet", x_axis: str = "step", smoothing: float = 0.0,
                bands: bool = True) -> dict:
    """name → (plan, data frame) for the curve figures among ``names`` (frames computed once)."""
    from engine.runs import dp_note, run_label

    out, cache = {}, {}

    def hist():
        if "hist" not in cache:
            cache["hist"] = fr.tier_history(runs) if runs else pd.DataFrame(columns=fr.TIER_COLUMNS)
        return cache["hist"]

    opts = dict(x_axis=x_axis, smoothing=smoothing, bands=bands)
    ids = fr.ID_COLUMNS
    for name in names:
        if name == "mid_curves":
            h = hist()
            plan = mid_curves_plan(h, layout=mid_layout, **opts)
            spans = fr.mid_spans(runs)
            data = h[ids + ["step", "epoch", "elapsed", "tier", "epsilon", "loss"]].merge(
                spans[["run_id", "tier", "onset_step", "end_step", "state"]], on=["run_id", "tier"], how="left")
        elif name == "tier_recall":
            h = hist()
            plan = tier_recall_plan(h, **opts)
            data = h[ids + ["step", "epoch", "elapsed", "tier", "epsilon", "epsilon_spent", "recall", "accuracy"]]
        elif name == "class_recall":
            data = fr.class_history(runs)
            plan = class_recall_plan(data, **opts)
        elif name == "accuracy":
            data = fr.overall_history(runs)
            plan = accuracy_plan(data, **opts)
        elif name == "epsilon_spent":
            h = hist()
            plan = epsilon_spent_plan(h, notes={run_label(r): dp_note(r) for r in runs}, x_axis=x_axis, bands=bands)
            data = h[ids + ["step", "epoch", "elapsed", "tier", "epsilon", "epsilon_spent"]]
        elif name == "recall_gain_time":
            data = fr.recall_gain_over_time(runs, hist())
            plan = recall_gain_time_plan(data, **opts)
        else:
            continue
        out[name] = (plan, data)
    return out
