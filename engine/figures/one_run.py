"""The one-run audit's figure: per tier, each algorithm's empirical ε lower bound ε̂ (a bar) next to the ε the
tier was promised (a line segment across the bar), from the typed :class:`~engine.audit.one_run.report.OneRunReport`
(or its stored summary dict; a running audit's partial one too). A pure Plotly builder: it never reads the
store or calls Streamlit. Tier and algorithm names are escaped.

The x axis is numeric (tick ``k`` is the k-th tier): algorithm ``i`` of ``n`` draws its bar at
``k − 0.4 + (i + ½)·0.8/n`` with width ``0.8/n`` (:func:`bar_positions`), so each bar, its claimed-ε segment and
its annotations sit at one explicit position that the figure data carries (and tests read).

* a bar at or under its segment: ε̂ ≤ ε, as it must be;
* a bar above its segment (ε̂ > ε with confidence 1 − β): the implementation breaks its claim — the bar is
  outlined in red and annotated, and the subtitle names it;
* algorithms without a formal guarantee (non-private SGD, DP-SGD-S's reference rule): hatched bars, no segment,
  labelled "no formal DP".
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.audit.one_run.report import KINDS, NO_CLAIM, NO_FORMAL_DP, OneRunReport
from engine.figures.scaffold import EXTRA_COLORS, FigureSpec, algo_color, base_figure, empty_figure, esc, wrap_words

ONE_RUN_FIGURES = ("one_run_epsilon",)
TITLE = "Claimed vs empirical ε per tier"
NO_RESULTS = "No one-run audit results yet"
BROKEN_COLOR = "#D62728"
GROUP_WIDTH = 0.8  # of one tier's unit on the x axis, shared by its bars
SEGMENT = 0.85  # a claimed-ε segment spans this much of its bar (neighbouring segments stay apart)
# the subtitle's lines (12 px), whole words, at most this long: they fit a chart of ~760 px (the Audit page's
# full width on a laptop is more); one line of ~190 characters ran past the figure's edge ("… · lin")
SUBTITLE_CHARS = 110


def as_one_run_report(report) -> OneRunReport:
    """A report from a report or its stored summary dict."""
    return report if isinstance(report, OneRunReport) else OneRunReport.from_dict(report)


def bar_positions(n_tiers: int, n_algorithms: int) -> tuple[np.ndarray, float]:
    """(centres[algorithm, tier], width) of the bars: each tier's group is :data:`GROUP_WIDTH` wide around it."""
    width = GROUP_WIDTH / max(n_algorithms, 1)
    offsets = -GROUP_WIDTH / 2 + (np.arange(n_algorithms) + 0.5) * width
    return offsets[:, None] + np.arange(n_tiers)[None, :], width


def _colors(report: OneRunReport) -> dict[str, str]:
    """Algorithm key → colour: the algorithm's own colour the first time, distinct extra colours after."""
    used, out, extra = set(), {}, iter(EXTRA_COLORS * 8)
    for k, a in enumerate(report.algorithms):
        out[a.key] = algo_color(a.algorithm, k) if a.algorithm not in used else next(extra)
        used.add(a.algorithm)
    return out


CANARY_KINDS = ("white", "black", "both")  # the ``kind`` argument: one canary kind, or one row per kind run


def _kinds(frame: pd.DataFrame, kind: str) -> list[str]:
    if kind not in CANARY_KINDS:
        raise ValueError(f"unknown canary kind {kind!r}; allowed: white, black, both")
    present = [k for k in KINDS if (frame["kind"] == k).any()]
    return present if kind == "both" else [kind]


def _subtitle(report: OneRunReport, kinds: list[str]) -> str:
    conf = f"{100 * (1 - report.beta):g} %"
    counts = []
    if "white" in kinds:
        counts.append(f"{report.canaries} gradient canaries")
    if "black" in kinds:
        counts.append(f"{report.input_canaries} input canaries")
    return (f"ε̂: lower bounds at {conf} confidence each (β = {report.beta:g}, δ = {report.delta:g}), bar: "
            f"Steinke et al.'s, ◆: f-DP's from the same guesses · {' and '.join(counts) or 'no canaries'} per tier · "
            f"line: the claimed ε (bar and ◆ ≤ line: consistent)")


def _fmt(v: float) -> str:
    return "–" if not np.isfinite(v) else f"{v:.3f}"


def claimed_vs_empirical(report, *, kind: str = "white", theme: str = "light", title: str | None = None) -> go.Figure:
    """Grouped bars of ε̂ per tier and algorithm, each with its tier's claimed ε as a segment across it.

    ``kind``: "white" (gradient canaries, the default), "black" (input canaries) or "both" (one row per kind
    that was run, shared x axis)."""
    report = as_one_run_report(report)
    title = title or TITLE
    frame = report.frame()
    kinds = _kinds(frame, kind) if not frame.empty else []
    frame = frame[frame["kind"].isin(kinds)]
    if frame.empty:
        what = NO_RESULTS if report.frame().empty else f"no {KINDS[kind]} canaries in this audit"
        return empty_figure(title, theme, what, legend="top")
    tiers = list(dict.fromkeys(t.tier for a in report.algorithms for t in a.tiers))
    algos = [a for a in report.algorithms if a.key in set(frame["algorithm"])]
    centres, width = bar_positions(len(tiers), len(algos))
    colors = _colors(report)
    rows = len(kinds)
    if rows > 1:
        fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.14,
                            subplot_titles=[esc(KINDS[k]) for k in kinds])
        base_figure(title, theme, fig)
    else:
        fig = base_figure(title, theme)
    tier_index = {t: j for j, t in enumerate(tiers)}
    notes = []
    fdp_shown = False
    for r, k in enumerate(kinds, start=1):
        loc = {"row": r, "col": 1} if rows > 1 else {}
        d = frame[frame["kind"] == k]
        claimed_x, claimed_y = [], []
        for i, a in enumerate(algos):
            g = d[d["algorithm"] == a.key]
            if g.empty:
                continue
            x = [float(centres[i, tier_index[t]]) for t in g["tier"]]
            eps_hat = g["epsilon_hat"].astype(float).to_numpy()
            eps_fdp = g["epsilon_hat_fdp"].astype(float).to_numpy()  # NaN: a report stored before the f-DP bound
            claimed = [None if e is None or e != e else float(e) for e in g["epsilon"]]
            broken = g["exceeds_claim"].astype(bool).to_numpy()
            label = esc(a.label) + ("" if a.formal_dp else f" — {NO_FORMAL_DP}")
            text = ["" if b else f"{v:.2f}" + ("" if a.formal_dp else f"<br>{NO_FORMAL_DP}")
                    for v, b in zip(eps_hat, broken)]  # a broken bar's value is in its annotation
            claim_words = [f"claimed ε = {c:.3g}" if c is not None else NO_CLAIM
                           for c in claimed]
            fig.add_trace(go.Bar(
                x=x, y=eps_hat, width=width, name=label, legendgroup=a.key, showlegend=r == 1,
                marker=dict(color=colors[a.key], pattern_shape="" if a.formal_dp else "/",
                            line=dict(color=[BROKEN_COLOR if b else colors[a.key] for b in broken],
                                      width=[3.5 if b else 0.5 for b in broken])),
                text=text, texttemplate="%{text}", textposition="outside", textangle=0, cliponaxis=False,
                constraintext="none", textfont=dict(size=11),
                customdata=np.stack([[esc(t) for t in g["tier"]], claim_words, g["guesses"], g["correct"],
                                     g["canaries"], [_fmt(v) for v in eps_fdp]], axis=1),
                meta={"algorithm": a.key, "kind": k, "formal_dp": a.formal_dp},
                hovertemplate="%{customdata[0]}: ε̂ ≥ %{y:.3f} (Steinke), ≥ %{customdata[5]} (f-DP); "
                              "%{customdata[1]}<br>%{customdata[3]} of %{customdata[2]} guesses correct, "
                              "%{customdata[4]} canaries<extra>" + esc(a.label) + "</extra>"), **loc)
            has_fdp = np.isfinite(eps_fdp)
            if has_fdp.any():  # the f-DP bound from the same guesses: a diamond on the bar
                fig.add_trace(go.Scatter(
                    x=np.asarray(x)[has_fdp], y=eps_fdp[has_fdp], mode="markers", name="◆ f-DP ε̂ (same guesses)",
                    legendgroup="fdp", showlegend=r == 1 and not fdp_shown,
                    marker=dict(symbol="diamond", size=10, color=colors[a.key],
                                line=dict(color="#e8eaf0" if theme == "dark" else "#1f2430", width=1.5)),
                    meta={"fdp": True, "algorithm": a.key, "kind": k},
                    hovertemplate="f-DP: ε̂ ≥ %{y:.3f}<extra>" + esc(a.label) + "</extra>"), **loc)
                fdp_shown = True
            top_hat = g["epsilon_hat_max"].astype(float).to_numpy()  # a broken bar's annotation: the larger ε̂
            for xc, c, v, b, t in zip(x, claimed, top_hat, broken, g["tier"]):
                if c is not None:  # a segment across the bar at the claimed ε
                    claimed_x += [xc - SEGMENT * width / 2, xc, xc + SEGMENT * width / 2, None]
                    claimed_y += [c, c, c, None]
                if b:
                    notes.append(dict(x=xc, y=v, text=f"exceeds claim: {v:.2f} > {c:.2f}", showarrow=True,
                                      arrowhead=2, arrowcolor=BROKEN_COLOR, ax=0, ay=-34,
                                      font=dict(color=BROKEN_COLOR, size=12), bgcolor="rgba(255,255,255,0.85)",
                                      bordercolor=BROKEN_COLOR, name=f"exceeds:{a.key}:{k}:{t}",
                                      **({"xref": f"x{r if r > 1 else ''}", "yref": f"y{r if r > 1 else ''}"}
                                         if rows > 1 else {})))
        if claimed_x:
            line = "#e8eaf0" if theme == "dark" else "#1f2430"
            fig.add_trace(go.Scatter(x=claimed_x, y=claimed_y, mode="lines", name="claimed ε (the tier's promise)",
                                     legendgroup="claimed", showlegend=r == 1, line=dict(color=line, width=3),
                                     meta={"claimed": True, "kind": k},
                                     hovertemplate="claimed ε = %{y:.3f}<extra></extra>"), **loc)
    for n in notes:
        fig.add_annotation(**n)
    sub = _subtitle(report, kinds)
    broken = report.broken_line(kinds)
    lines = [sub] + ([f"⚠ {esc(broken)}"] if broken else [])
    if not all(a.formal_dp for a in algos):
        lines.append(f"hatched: {NO_CLAIM}")
    if report.partial:
        lines.append("partial: the other algorithms are still training")
    lines = [w for line in lines for w in wrap_words(line, SUBTITLE_CHARS)]  # Plotly clips a subtitle, never wraps it
    fig.update_layout(title_subtitle=dict(text="<br>".join(lines), font=dict(size=12 if theme != "presentation" else 16)))
    top = max(float(np.nanmax(frame["epsilon_hat_max"].astype(float))),
              float(np.nanmax(frame["epsilon"].astype(float))) if frame["epsilon"].notna().any() else 0.0)
    y_range = [0.0, (top if top > 0 else 1.0) * (1.35 if broken else 1.2)]
    fig.update_xaxes(tickmode="array", tickvals=list(range(len(tiers))), ticktext=[esc(t) for t in tiers],
                     range=[-0.5, len(tiers) - 0.5], zeroline=False, showgrid=False)
    fig.update_xaxes(title_text="privacy tier", row=rows, col=1) if rows > 1 else \
        fig.update_xaxes(title_text="privacy tier")
    fig.update_yaxes(title_text="ε", range=y_range)
    fig.update_layout(barmode="overlay", bargap=0, height=280 + 300 * rows,
                      margin=dict(t=80 + 18 * len(lines) + (24 if rows > 1 else 0), b=130),
                      legend=dict(orientation="h", yanchor="top", y=-0.18 if rows == 1 else -0.1, x=0,
                                  xanchor="left"))
    return fig


def build_one_run_figures(report, *, theme: str = "light", names=None) -> list[FigureSpec]:
    """The one-run audit's figures with the data each shows (the dashboard's export menu, ``python -m engine
    export``): ``one_run_epsilon``, one row per canary kind that was run, its data the report's tidy frame."""
    report = as_one_run_report(report)
    out = []
    for name in (list(names) if names is not None else list(ONE_RUN_FIGURES)):
        if name not in ONE_RUN_FIGURES:
            raise ValueError(f"unknown one-run figure {name!r}; allowed: {', '.join(ONE_RUN_FIGURES)}")
        out.append(FigureSpec(name, TITLE, claimed_vs_empirical(report, kind="both", theme=theme), report.frame()))
    return out
