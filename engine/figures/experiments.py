"""Figures of the experiment scripts (``experiments/``) that the training and audit figures do not cover:
pure functions, a tidy frame in, a plotly figure out (themed by ``engine.figures.scaffold``).

    gain_frame(gains, labels, tiers, epochs)   the per-tier gains of experiments.tiered.tier_gains as a frame
    fig_gain_by_tier(frame)                    recall gain per tier vs epoch, mean ± s.e. over seeds (+ seeds)
    fig_pareto(frame)                          imbalance vs overall accuracy, ± s.e. both ways, one point per setting
    fig_collusion(frame), collusion_sentence   the collusion test: one tier's ε̂ (both bounds) and GPR as the others'
                                               budgets change, and what it found in one sentence

The tiered audit's GPR per tier vs its ε is the talk figure ``engine.figures.talk.fig_audit_tiers`` (one owner).
"""
from __future__ import annotations

import textwrap

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.figures.scaffold import EXTRA_COLORS, TIER_COLORS, apply_theme

GAIN_COLUMNS = ["variant", "point", "epoch", "tier", "tier_index", "mean", "se", "seed", "value"]


def gain_frame(gains: dict, labels: dict, tiers: list[str], epochs: dict) -> pd.DataFrame:
    """Rows per (variant, point, tier): the mean/se row (seed = None) and one row per seed.
    ``gains[variant][point]`` as returned by ``tier_gains``; ``epochs[point]``: the x value."""
    rows = []
    for variant, by_point in gains.items():
        for point, g in by_point.items():
            if point not in epochs:
                continue
            for j, t in enumerate(tiers):
                rows.append({"variant": labels.get(variant, variant), "point": point, "epoch": epochs[point], "tier": t,
                             "tier_index": j, "mean": g["mean"][j], "se": g["se"][j], "seed": None, "value": None})
                for s, row in enumerate(g["per_seed"]):
                    rows.append({"variant": labels.get(variant, variant), "point": point, "epoch": epochs[point],
                                 "tier": t, "tier_index": j, "mean": None, "se": None, "seed": s, "value": row[j]})
    return pd.DataFrame(rows, columns=GAIN_COLUMNS)


def fig_gain_by_tier(frame: pd.DataFrame, *, theme: str = "light",
                     title: str = "Recall gain INO − IDP per tier (mean ± s.e. over paired seeds; dots: seeds)") -> go.Figure:
    variants = list(dict.fromkeys(frame["variant"]))
    fig = make_subplots(rows=1, cols=max(1, len(variants)), subplot_titles=variants, shared_yaxes=True)
    for c, v in enumerate(variants, start=1):
        fv = frame[frame.variant == v]
        for t, g in fv.groupby("tier", sort=False):
            k = int(g["tier_index"].iloc[0])
            color = TIER_COLORS[k % len(TIER_COLORS)]
            m = g[g.seed.isna()].sort_values("epoch")
            fig.add_trace(go.Scatter(x=m["epoch"], y=m["mean"], error_y=dict(type="data", array=m["se"].fillna(0)),
                                     mode="lines+markers", name=t, legendgroup=t, showlegend=c == 1,
                                     line=dict(color=color)), row=1, col=c)
            s = g[g.seed.notna()]
            fig.add_trace(go.Scatter(x=s["epoch"] + 0.01 * (k - 1), y=s["value"], mode="markers", name=f"{t} seeds",
                                     legendgroup=t, showlegend=False, opacity=0.45,
                                     marker=dict(color=color, size=5, symbol="circle-open")), row=1, col=c)
        fig.add_hline(y=0, line=dict(color="gray", width=1), row=1, col=c)
        fig.update_xaxes(title_text="epoch", row=1, col=c)
    fig.update_yaxes(title_text="recall gain (pp)", row=1, col=1)
    fig.update_layout(title=title)
    return apply_theme(fig, theme)


PARETO_COLUMNS = ["setting", "kind", "tail_fraction", "beta", "accuracy", "accuracy_se", "imbalance", "imbalance_se",
                  "auc_private", "auc_private_se", "n"]


def fig_pareto(frame: pd.DataFrame, *, theme: str = "light",
               title: str = "Utility imbalance vs overall accuracy (mean ± s.e. over seeds)") -> go.Figure:
    """Two panels: the recall gap (least − most private tier) and the most private tier's recall AUC, each
    against overall accuracy; INO-SGD settings coloured by β, labelled by γ; IDP-SGD the black reference."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["recall gap, least − most private tier (pp)",
                                                        "recall AUC of the most private tier (%)"])
    for c, (col, se) in enumerate((("imbalance", "imbalance_se"), ("auc_private", "auc_private_se")), start=1):
        for i, (beta, g) in enumerate(frame[frame.kind == "ino"].groupby("beta", sort=True)):
            fig.add_trace(go.Scatter(x=g["accuracy"], y=g[col], mode="markers+text+lines",
                                     error_x=dict(type="data", array=g["accuracy_se"].fillna(0)),
                                     error_y=dict(type="data", array=g[se].fillna(0)),
                                     text=[f"γ={t:g}" for t in g["tail_fraction"]], textposition="top center",
                                     name=f"INO-SGD β={beta:g}", legendgroup=f"b{beta}", showlegend=c == 1,
                                     marker=dict(size=9, color=EXTRA_COLORS[i % len(EXTRA_COLORS)])), row=1, col=c)
        ref = frame[frame.kind == "reference"]
        fig.add_trace(go.Scatter(x=ref["accuracy"], y=ref[col], mode="markers", name="IDP-SGD", legendgroup="ref",
                                 showlegend=c == 1, error_x=dict(type="data", array=ref["accuracy_se"].fillna(0)),
                                 error_y=dict(type="data", array=ref[se].fillna(0)),
                                 marker=dict(size=12, color="black", symbol="x")), row=1, col=c)
        fig.update_xaxes(title_text="overall test accuracy (%)", row=1, col=c)
    fig.update_layout(title=title)
    return apply_theme(fig, theme)


# --- the collusion test (experiments/collusion.py) ------------------------------------------------------------------
COLLUSION_COLUMNS = ["setting", "others", "tier", "epsilon", "sample_rate", "noise_multiplier", "epsilon_hat",
                     "epsilon_hat_fdp", "gpr", "gpr_low", "gpr_high", "null_floor", "accuracy"]


def collusion_sentence(frame: pd.DataFrame) -> str:
    """What the collusion test found, in one sentence: the fixed tier's empirical risk (its GPR and its one-run ε̂ by
    both bounds) from the first setting of the other tiers' budgets to the last, the GPR's range over all of them and
    whether its extremes are apart beyond their CIs. Without a GPR (one-run audits alone: the one-run page's preset,
    ``engine.audit.one_run.presets``) its ε̂ only, and whether any setting's ε̂ exceeds the claimed ε."""
    if frame.empty:
        return "No collusion-test settings finished yet."
    first, last = frame.iloc[0], frame.iloc[-1]
    if not frame["gpr"].notna().any():  # one-run audits alone (the Audit page's preset): ε̂ only
        # either bound above the claim breaks it (the one-run report's rule)
        above = [s for s, h, f, e in zip(frame["setting"], frame["epsilon_hat"], frame["epsilon_hat_fdp"],
                                         frame["epsilon"]) if h > e or f > e]
        holds = (f"its claimed ε = {first['epsilon']:.3g} holding in every setting" if not above else
                 f"its ε̂ above its claimed ε = {first['epsilon']:.3g} in {', '.join(above)}: the claim is broken")
        return (f"As the other tiers' budgets go from ({first['others']}) to ({last['others']}), the {first['tier']} "
                f"tier's one-run ε̂ moves from {first['epsilon_hat']:.2f} to {last['epsilon_hat']:.2f} (f-DP: "
                f"{first['epsilon_hat_fdp']:.2f} to {last['epsilon_hat_fdp']:.2f}), {holds}.")
    lo, hi = frame.loc[frame["gpr"].idxmin()], frame.loc[frame["gpr"].idxmax()]
    apart = "apart beyond their CIs" if hi["gpr_low"] > lo["gpr_high"] else "within each other's CIs"
    return (f"As the other tiers' budgets go from ({first['others']}) to ({last['others']}), the {first['tier']} tier's "
            f"GPR moves from {first['gpr']:.3f} to {last['gpr']:.3f} (range {lo['gpr']:.3f}–{hi['gpr']:.3f}, the "
            f"extremes {apart}) and its one-run ε̂ from {first['epsilon_hat']:.2f} to {last['epsilon_hat']:.2f} "
            f"(f-DP: {first['epsilon_hat_fdp']:.2f} to {last['epsilon_hat_fdp']:.2f}), its claimed ε = "
            f"{first['epsilon']:.3g} holding in every setting.")


def fig_collusion(frame: pd.DataFrame, *, theme: str = "light",
                  title: str = "Does one tier's risk depend on the others' budgets?") -> go.Figure:
    """Per setting of the other tiers' budgets (x): the fixed tier's one-run ε̂ by both bounds with its claimed ε
    (left), and its PA-ALOOA GPR with its CI and null floor (right)."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("one-run ε̂ (white-box, 95 %)", "PA-ALOOA GPR (CI; ×: null floor)"))
    x = [f"{s}<br>({o})" for s, o in zip(frame["setting"], frame["others"])]
    colors = EXTRA_COLORS
    fig.add_trace(go.Bar(x=x, y=frame["epsilon_hat"], name="ε̂ Steinke et al.", marker_color=colors[0],
                         offsetgroup="steinke"), row=1, col=1)
    fig.add_trace(go.Bar(x=x, y=frame["epsilon_hat_fdp"], name="ε̂ f-DP", marker_color=colors[1], offsetgroup="fdp"),
                  row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=frame["epsilon"], mode="lines+markers", name="claimed ε",
                             line=dict(color=TIER_COLORS[0], dash="dash")), row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=frame["gpr"], mode="markers", name="GPR", marker=dict(size=10, color=colors[2]),
                             error_y=dict(type="data", symmetric=False, array=frame["gpr_high"] - frame["gpr"],
                                          arrayminus=frame["gpr"] - frame["gpr_low"])), row=1, col=2)
    fig.add_trace(go.Scatter(x=x, y=frame["null_floor"], mode="markers", name="null floor",
                             marker=dict(symbol="x", size=9, color="#888888")), row=1, col=2)
    fig.update_yaxes(title_text="ε", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="GPR (mean advantage)", row=1, col=2)
    fig.update_xaxes(title_text="the other tiers' budgets", row=1, col=1)
    fig.update_xaxes(title_text="the other tiers' budgets", row=1, col=2)
    sentence = "<br>".join(textwrap.wrap(collusion_sentence(frame), 150))  # a subtitle does not wrap by itself
    fig.update_layout(title=dict(text=title, subtitle=dict(text=sentence)), barmode="group", height=500,
                      margin=dict(t=125 + 22 * sentence.count("<br>"), b=120),
                      legend=dict(orientation="h", yanchor="top", y=-0.3, x=0, xanchor="left"))
    return apply_theme(fig, theme)
