"""Individual ε per group (``individual_epsilon``, issue 62): what a run spent on each group's samples, beside the
promise. Per grouping (class, tier, the sensitive attribute) and group, the median individual ε over the group's
panel samples with its quartiles as whiskers, and for a tier its planned ε (under the same accountant, RDP) as a
dash: the share of the promise spent is their ratio. From each run's latest evaluation that carries it
(``EvalRecord.individual_epsilon``: live as training goes; the last one is the summary's), the seeds of a series
averaged. The caption is :data:`engine.dp.individual.DATA_DEPENDENT_NOTE`, the one sentence said wherever it is shown.

    individual_frame(runs, memo)   one row per run, grouping and group
    fig_individual(frame)          one panel per grouping
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.dp.individual import DATA_DEPENDENT_NOTE
from engine.figures import frames as fr
from engine.figures.scaffold import algo_color, empty_figure, esc, escape_columns, facet_grid, notes_below, wrap_words
from engine.jobs.runs import algorithm_label, run_label, seed_index
from engine.train.individual import BY_TIER

FIGURE = "individual_epsilon"
TITLE = "Individual ε per group: median [quartiles] beside the tier's planned ε"
INDIVIDUAL_COLUMNS = ["run_id", "run", "series", "algorithm", "seed_index", "step", "accountant", "run_accountant",
                      "grouping", "group", "n_samples", "epsilon_q1", "epsilon_median", "epsilon_q3", "share_q1",
                      "share_median", "share_q3", "planned_epsilon"]
EMPTY = ("select a run with a formal DP guarantee trained with individual ε on (runs trained before it was measured, "
         "non-private runs and runs with individual_epsilon: false have none)")
_VALUES = ("n_samples", "epsilon_q1", "epsilon_median", "epsilon_q3", "share_q1", "share_median", "share_q3",
           "planned_epsilon")
PLOT_PX = 360
TOP_PX = 130  # the title, the legend's row, the panel titles
LEGEND_GAP_PX = 30  # from the plots' top to the legend's bottom: clear of the panel titles


def individual_frame(runs: list[dict], memo: dict | None = None) -> pd.DataFrame:
    """Per run, grouping and group: the latest evaluation's individual ε quartiles, the share of the promise spent,
    and for a tier group its planned ε under the same accountant (``planned_epsilon``; NaN for other groupings: a
    class or an attribute value spans tiers). ``memo``: a live view's frame memo (``engine.figures.frames``)."""
    rows = []
    labels = fr.series_labels(runs)
    for run in runs:
        latest = next((e for e in reversed(fr.run_evals(run, memo)) if e.individual_epsilon), None)
        if latest is None:
            continue
        for grouping, s in latest.individual_epsilon.items():
            for k, g in enumerate(s.groups):
                planned = s.tier_epsilons[k] if grouping == BY_TIER and k < len(s.tier_epsilons) else np.nan
                rows.append({"run_id": run["id"], "run": run_label(run), "series": labels[run["id"]],
                             "algorithm": algorithm_label(run.get("algorithm")), "seed_index": seed_index(run),
                             "step": s.step, "accountant": s.accountant, "run_accountant": s.run_accountant,
                             "grouping": grouping, "group": g.group, "n_samples": g.n_samples,
                             "epsilon_q1": g.epsilon_q1, "epsilon_median": g.epsilon_median,
                             "epsilon_q3": g.epsilon_q3, "share_q1": g.share_q1, "share_median": g.share_median,
                             "share_q3": g.share_q3, "planned_epsilon": fr._finite(planned)})
    return pd.DataFrame(rows, columns=INDIVIDUAL_COLUMNS)


def _series_means(df: pd.DataFrame) -> pd.DataFrame:
    """One row per series, grouping and group: the mean over its seeds (a series of one seed: that run's row)."""
    keys = ["series", "algorithm", "grouping", "group"]
    return df.groupby(keys, sort=False)[list(_VALUES)].mean().reset_index()


def fig_individual(frame: pd.DataFrame, *, theme: str = "light", title: str = TITLE) -> go.Figure:
    """One panel per grouping: per group and series the median individual ε with quartile whiskers; in the tier
    panel the tier's planned ε as a grey dash. The caption: what individual ε is (and is not)."""
    if frame.empty:
        return empty_figure(title, theme, EMPTY)
    df = _series_means(escape_columns(frame, "series", "grouping", "group"))
    groupings = list(dict.fromkeys(df["grouping"]))
    accountants = sorted(set(frame["accountant"]))
    panels = [f"by {g} (ε under {', '.join(a.upper() for a in accountants)})" for g in groupings]
    # the legend above: the caption takes the space below the plots
    fig, _, cols = facet_grid(panels, title, theme, max_cols=3, shared_y=False, legend="top")
    series = list(dict.fromkeys(df["series"]))
    for p, grouping in enumerate(groupings):
        row, col = p // cols + 1, p % cols + 1
        part = df[df["grouping"] == grouping]
        for k, name in enumerate(series):
            s = part[part["series"] == name]
            if s.empty:
                continue
            algo = s["algorithm"].iloc[0]
            med = s["epsilon_median"].to_numpy(float)
            fig.add_trace(go.Scatter(
                x=s["group"], y=med, mode="markers", name=name, legendgroup=name, showlegend=p == 0,
                marker=dict(size=9, color=algo_color(algo, k)), meta=f"{grouping}|{name}",
                error_y=dict(type="data", symmetric=False, array=s["epsilon_q3"].to_numpy(float) - med,
                             arrayminus=med - s["epsilon_q1"].to_numpy(float), thickness=1.5, width=4),
                customdata=np.column_stack([s["share_median"].to_numpy(float), s["n_samples"].to_numpy(float)]),
                hovertemplate="%{x}: median ε %{y:.3f}, %{customdata[0]:.0%} of the promise "
                              "(%{customdata[1]:.0f} panel samples)<extra>" + name + "</extra>"),
                row=row, col=col)
        planned = part.dropna(subset=["planned_epsilon"]).drop_duplicates("group")
        if len(planned):
            fig.add_trace(go.Scatter(x=planned["group"], y=planned["planned_epsilon"], mode="markers",
                                     name="tier's planned ε", legendgroup="planned", showlegend=True,
                                     marker=dict(symbol="line-ew-open", size=26, color="#888888",
                                                 line=dict(width=2)),
                                     hovertemplate="%{x}: planned ε %{y:.3f}<extra></extra>",
                                     meta=f"{grouping}|planned"), row=row, col=col)
        fig.update_yaxes(title_text="individual ε" if col == 1 else None, rangemode="tozero", row=row, col=col)
    note, layout = notes_below(wrap_words(esc(DATA_DEPENDENT_NOTE), 120), plot_px=PLOT_PX, top_px=TOP_PX)
    # the legend above the panel titles, under the figure's title (the caption takes the space below the plots)
    fig.update_layout(**layout, legend=dict(orientation="h", yanchor="bottom", y=1 + LEGEND_GAP_PX / PLOT_PX,
                                            x=1, xanchor="right"))
    fig.add_annotation(**note)
    fig.update_xaxes(type="category")
    return fig
