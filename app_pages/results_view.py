"""Results: compare finished (or any past) runs — first the MID and the INO gain of the most private tier,
then recall vs budget with Pearson r, INO − IDP gains, the talk figures (frontier, results table, INO
internals, DP-SGD-S clips, a TIF sweep's heatmap, an audit's GPR vs ε), loss/accuracy, fairness, the MID
table — and export everything. Before the user has finished runs of their own it shows the lab's example
runs (``engine.tools.demo.example_runs``), labelled "example".

Opening fast while runs train: the figures are built once per state of the selection (:func:`cached_figures`,
keyed by each run's id, status and last evaluation: a run that trains on between evaluations, or a widget change,
builds nothing again), the headline and the first row of charts are drawn before the other figures are built, and
the sections with widgets of their own (the talk figures, the export) are fragments: their widgets rerun only
them."""
from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from app_pages import _charts as charts
from app_pages import _handles as handles
from app_pages import _widgets as widgets
from app_pages._look import format_pp, intro, md, no_negative_zero, plot_theme
from engine.audit.pa_alooa.report import as_report
from engine.dp.algorithms import draws
from engine.figures import evidence, export, frames
from engine.figures.common_span import common_span
from engine.figures.headline import undersampled_note
from engine.figures import talk_frames as tf
from engine.figures.sweep_frame import is_sweep_group
from engine.figures.scaffold import FigureSpec
from engine.figures.talk import build_talk_figures, fig_results_table
from engine.figures.training import LIVE_FIGURES, RESULT_FIGURES, build_figures
from engine.jobs.runs import algorithm_label, dataset_name, diverged_note, dp_note, run_label, run_record


PEARSON_COLUMNS = {
    "run": st.column_config.TextColumn("run"), "algorithm": st.column_config.TextColumn("algorithm"),
    "seed": st.column_config.NumberColumn("seed", format="%d"),
    "owners": st.column_config.NumberColumn("owners", format="%d",
                                            help="classes (or groups) with a recall and a budget"),
    "Pearson r": st.column_config.NumberColumn("Pearson r", format="%.3f",
                                               help="correlation of owner recall with the owner's privacy budget ε"),
    "p-value": st.column_config.NumberColumn("p-value", format="%.2g", help="two-sided")}
TALK_TABLE_COLUMNS = {"algorithm": st.column_config.TextColumn("algorithm", width=200),  # every column in view
                      "runs": st.column_config.NumberColumn("runs (seeds)", format="%d")}


def pearson_table(stats):
    """The Pearson table in the page's words: run, algorithm (its label), seed, owners, r, p — no internal
    columns (the run's id, its seed index, its series)."""
    out = stats.assign(algorithm=[algorithm_label(a) for a in stats["algorithm"]])
    out = out.rename(columns={"r": "Pearson r", "p": "p-value", "n": "owners"})
    return out[["run", "algorithm", "seed", "owners", "Pearson r", "p-value"]]


def readable_results_table(spec: FigureSpec, theme: str) -> FigureSpec:
    """The talk results table with every "-0.0" shown as "0.0" (a gain that rounds to zero has no sign) and "—"
    for a value that does not apply (IDP-SGD's gain over itself), its figure (the export) redrawn from it."""
    data = spec.data.copy()
    for column in data.columns:
        if not pd.api.types.is_numeric_dtype(data[column]):
            data[column] = ["—" if v is None or v != v else no_negative_zero(v) for v in data[column]]
    return FigureSpec(spec.name, spec.title, fig_results_table(data, theme=theme), data)


def selection_key(runs: list[dict]) -> tuple:
    """What the figures of ``runs`` depend on: each run's id, status, plan and evaluations so far (their number and
    last step). A run training between two evaluations keeps its key; so does every widget change of the page."""
    return tuple((r.get("id"), r.get("status"), r.get("total_steps"), r.get("cancel_step"), len(r["evals"]),
                  r["evals"][-1].get("step") if r["evals"] else None) for r in runs)


@st.cache_data(show_spinner=False, max_entries=32)
def cached_figures(key: tuple, theme: str, names: tuple, mid_layout: str, _runs: list[dict]) -> dict:
    """``build_figures`` of ``_runs`` by name, built once per ``key`` (:func:`selection_key`) and theme."""
    return {s.name: s for s in build_figures(_runs, theme=theme, names=list(names), mid_layout=mid_layout)}


@st.cache_data(show_spinner=False, max_entries=32)
def cached_talk_figures(key: tuple, theme: str, audit_id, sweep_metric: str, _runs: list[dict], _report) -> dict:
    """The talk figures of ``_runs`` (with audit ``audit_id``'s report), built once per ``key`` and options."""
    return {s.name: s for s in build_talk_figures(_runs, theme=theme, audit=_report, sweep_metric=sweep_metric,
                                                  sweep_epoch=1.0)}


def run_option_label(run: dict) -> str:
    data = dataset_name(run) or "?"
    when = time.strftime("%m-%d %H:%M", time.localtime(run.get("created_at") or 0))
    return md(f"{run_label(run)} · {data} · {run['status']} · {when}")


st.title("Results")
intro()
url = widgets.UrlParams()
store = handles.store()


c1, c2 = st.columns([4, 1], vertical_alignment="bottom")
include_all = c2.toggle("Include unfinished", value=False, key="all", bind="query-params",
                        help="Also diverged, cancelled, interrupted and running runs (the selection is then compared "
                             "over the steps all of its runs reached)")
trained = store.list_runs(kind="train")
candidates = [r for r in trained if include_all or r["status"] == "finished"]
left_out = [r for r in trained if r["status"] == "diverged"] if not include_all else []
examples = not candidates
if examples:
    runs = charts.example_runs()
    url.check()
    if not runs:
        st.info("No finished runs yet — launch a comparison on the Train / compare page. (The example runs are "
                "not part of this build: engine.tools.demo.example_runs or assets/demo/example_runs.json is missing.)")
        st.stop()
    with st.container(key="example-note"):
        st.info("**Example runs** (shipped with the lab, trained once with its default comparison): your own "
                "finished runs replace them here — launch a comparison on the Train / compare page.",
                icon=":material/science:")
else:
    # Options are the runs' short labels ("INO-SGD #12"): unique, stable, and readable in the URL (?runs=…).
    by_label = {run_label(r): r for r in candidates}
    latest_group = next((r["group_id"] for r in candidates if r["group_id"]), None)
    default = [run_label(r) for r in sorted(candidates, key=lambda r: r["id"])
               if r["group_id"] == latest_group] if latest_group else [run_label(candidates[0])]
    picked = c1.multiselect("Runs", list(by_label), default=default, key="runs", bind="query-params",
                            help="Finished runs, newest first (any past comparison too)")
    url.check()
    if not picked:
        st.info("Pick one or more runs.")
        st.stop()
    st.caption(" · ".join(run_option_label(by_label[p]) for p in picked))  # (escaped labels)
    runs = [run_record(store, by_label[p]["id"]) for p in picked]
    runs = [r for r in runs if r is not None and r["evals"]]
if not runs:
    st.warning("The selected runs have no evaluations yet.")
    st.stop()
with st.container():  # a variable number of notes must not shift (remount) the widgets below
    if left_out:
        them = "it" if len(left_out) == 1 else "them"
        st.caption(md(f"Left out: {', '.join(run_label(r) for r in left_out)} diverged (a tier's loss went non-finite "
                      f"or stayed far above its start); turn on **Include unfinished** to choose {them}."))
    rerun_of = evidence.reruns(runs)  # a rerun's notes are its kept run's: said once
    if rerun_of:
        st.caption(md(f"⚠ {evidence.rerun_note(runs)}"))
    for r in evidence.distinct(runs, rerun_of):
        if diverged_note(r):
            st.warning(md(f"{run_label(r)} {diverged_note(r)}"), icon=":material/trending_up:")
        if dp_note(r):
            st.caption(md(f"⚠ {run_label(r)}: {dp_note(r)}"))

audits = [] if examples else store.list_runs(kind="audit", status="finished")
audit_ids = [None] + [a["id"] for a in audits]
audit_by_id = {a["id"]: a for a in audits}
theme = plot_theme()
key = selection_key(runs)
# the first row first (drawn before the other figures are built), the rest below it
first = cached_figures(key, theme, ("mid_curves",), "overlay", runs) | \
    cached_figures(key, theme, ("recall_gain_time",), "facet", runs)
mid = first["mid_curves"]

st.subheader("MID and the INO gain of the most private tier")
tier = tf.most_private_tier(runs)
gain = tf.gain_summary(runs)
span = common_span(runs)  # every compared number below is over it (engine.figures.common_span)
with st.container(key="span-note"):  # a note that comes and goes must not shift (remount) the widgets below
    if span.words() is not None:
        st.warning(md(f"Compared {span.words()}: every gain, recall AUC, final value and Pearson r on this page "
                      "(and in its exports) is computed over that span."), icon=":material/straighten:")
    sparse = undersampled_note(runs)
    if sparse:
        st.caption(md(f"⚠ {sparse}"))
with st.container(key="headline"):
    m1, m2, m3 = st.columns(3)
    if gain is not None:  # the engine's headline rules (engine.figures.evidence): no winner of a diverged pair
        if gain["not_comparable"]:
            st.warning(md(gain["not_comparable"]), icon=":material/block:")
        over = f", {md(gain['span'])}" if gain["span"] else ""
        m1.metric(f"INO gain, {md(gain['tier'])} recall AUC", format_pp(gain["auc_gain"]),
                  help=md(gain["not_comparable"] or gain["auc_words"]) + over)
        m2.metric(f"INO gain in IDP-SGD's MID, {md(gain['tier'])} recall", format_pp(gain["mid_gain"]),
                  help=md(gain["not_comparable"] or gain["mid_words"]) + over)
    else:
        m1.metric("INO gain", "—", help="select an INO-SGD run and the IDP-SGD run it builds on")
    spans = frames.mid_spans(evidence.distinct(runs, rerun_of))  # a rerun is counted once
    if tier is not None and not spans.empty:
        s_t = spans[spans.tier == tier[0]]
        mids = [f"{r['run']}: " + ("none" if r["state"] == "none" else f"steps {r['onset_step']}–"
                                   + (f"{int(r['end_step'])}" if r["state"] == "recovered" else "now"))
                for _, r in s_t.iterrows()]
        m3.metric(f"MID of tier {md(tier[0])}", f"{int((s_t.state != 'none').sum())}/{len(s_t)} runs",
                  help=md("loss above its initial value: " + "; ".join(mids)))
c1, c2 = st.columns(2)
with c1:
    charts.chart(mid, key="res-mid", export_key="e-mid-curves", narrow=True)
with c2:
    charts.chart(first["recall_gain_time"], key="res-gain-time", export_key="e-gain-time", narrow=True)
st.caption("On easy tasks the INO gain lives early, in the MID window, and fades by the end: "
           "the area under each tier's recall curve keeps it visible.")

st.subheader("Who pays for privacy?")
rest = cached_figures(key, theme, tuple(n for n in RESULT_FIGURES if n != "recall_gain_time"), "facet", runs)
specs = {n: first[n] if n in first else rest[n] for n in RESULT_FIGURES}  # (the pack lists them in this order)
charts.chart(specs["recall_vs_budget"], key="res-budget", export_key="e-budget")
stats = frames.pearson_by_run(frames.owner_recall(runs))
with st.container(key="pearson-table"):
    st.dataframe(pearson_table(stats), hide_index=True, width="content", column_config=PEARSON_COLUMNS)

st.subheader("INO-SGD vs IDP-SGD")
c1, c2 = st.columns(2)
with c1:
    charts.chart(specs["recall_gain_class"], key="res-gain-class", export_key="e-gain-class", narrow=True)
with c2:
    charts.chart(specs["recall_auc"], key="res-auc", export_key="e-auc", narrow=True)

st.subheader("For a talk")
c1, c2 = st.columns([2, 1], vertical_alignment="bottom")
datasets = {dataset_name(r) for r in runs}
same_data = [a["id"] for a in audits if dataset_name(a) in datasets]  # newest first
audit_id = c1.selectbox("Audit (GPR vs ε, Δ in the table)", audit_ids, key="res_audit", disabled=len(audit_ids) == 1,
                        index=audit_ids.index(same_data[0]) if same_data else 0,
                        help="default: the newest finished audit on the selection's dataset",
                        format_func=lambda i: "none" if i is None else widgets.audit_label(audit_by_id[i]))
sweep = any(is_sweep_group(r.get("group_id")) for r in runs)
sweep_metric = c2.segmented_control("Sweep gain", ["auc", "epoch"], default="auc", key="res_sweep_metric",
                                    format_func={"auc": "recall AUC", "epoch": "recall at epoch 1"}.get,
                                    disabled=not sweep) or "auc"
report = as_report(audit_by_id[audit_id]["summary"]) if audit_id is not None and audit_by_id[audit_id].get("summary") else None
talk = dict(cached_talk_figures(key, theme, audit_id, sweep_metric, runs, report))
talk["results_table"] = talk_table = readable_results_table(talk["results_table"], theme)
charts.chart(talk["privacy_frontier"], key="res-frontier", export_key="e-frontier")
# the results table as a table of the page, full width (its Plotly figure, in a half-width column, showed only
# its header: the long column names wrapped into a header taller than the figure); the figure is its export
with st.container(key="talk-table"):
    st.markdown(f"**{md(talk_table.title)}**")
    st.dataframe(talk_table.data, hide_index=True, width="stretch", column_config=TALK_TABLE_COLUMNS)
    charts.export_menu(talk_table, key="e-table")
if any(draws(r.get("algorithm"), "ino_internals") for r in runs):  # INO-SGD's (its registry entry's figures)
    charts.chart(talk["ino_internals"], key="res-ino", export_key="e-ino")
if any(draws(r.get("algorithm"), "group_clip") for r in runs):  # DP-SGD-S's, DPSGD-F's
    charts.chart(talk["group_clip"], key="res-clip", export_key="e-clip")
if any(draws(r.get("algorithm"), "global_scale") for r in runs):  # DPSGD-Global-Adapt's Z, C / max(Z, C), noise
    charts.chart(talk["global_scale"], key="res-scale", export_key="e-scale")
if "individual_epsilon" in talk and not talk["individual_epsilon"].data.empty:  # whose privacy the runs spent
    st.subheader("Whose privacy was spent: individual ε per group")
    charts.chart(talk["individual_epsilon"], key="res-individual", export_key="e-individual")
if sweep:
    charts.chart(talk["tif_sweep"], key="res-sweep", export_key="e-sweep")
if report is not None:
    charts.chart(talk["audit_tiers"], key="res-audit", export_key="e-audit")

st.subheader("Utility and fairness")
c1, c2 = st.columns(2)
with c1:
    charts.chart(specs["overall_bars"], key="res-overall", export_key="e-overall", narrow=True)
with c2:
    if specs["fairness_bars"].data.empty:
        st.info("Outcome-fairness metrics (demographic parity, equalized odds) are computed for binary tabular "
                "datasets with a sensitive attribute, e.g. adult.")
    else:
        charts.chart(specs["fairness_bars"], key="res-fair", export_key="e-fair", narrow=True)

st.subheader("MID summary")
st.dataframe(specs["mid_summary"].data, hide_index=True, width="stretch")
charts.export_menu(specs["mid_summary"], key="e-mid")

@st.fragment
def export_section(runs: list[dict], names: list[str], report, examples: bool) -> None:
    """The pack's options and buttons: a fragment, so changing them reruns only this section."""
    ids = "-".join(str(r["id"]) for r in runs)
    ok, reason = export.static_export_available()
    with st.container():
        if not ok:
            st.warning(reason)
    c1, c2, c3, c4 = st.columns(4)
    width = c1.number_input("Width (px)", 400, 4000, 1600, 100, key="pack_w")
    height = c2.number_input("Height (px)", 300, 3000, 900, 100, key="pack_h")
    scale = c3.number_input("Scale", 0.5, 4.0, 2.0, 0.5, key="pack_scale")
    pack_theme = c4.selectbox("Theme", ["presentation", "light", "dark"], key="pack_theme")
    titles = {n: export.figure_titles()[n] for n in names}
    chosen = st.multiselect("Figures in the pack", list(titles), default=list(titles), key="pack_figures",
                            format_func=lambda n: titles.get(n, n), help="Default: every figure of the selection")
    request = (ids, tuple(chosen), int(width), int(height), float(scale), pack_theme)
    c1, c2, c3 = st.columns(3)
    if c1.button("Build presentation pack", icon=":material/slideshow:", key="pack-build", type="primary",
                 disabled=not chosen, help="The chosen figures as PNG, SVG, PDF and HTML (one shared plotly.js), "
                                           "their data as CSV, and the configs, zipped"):
        with st.status(f"Building the presentation pack ({len(chosen)} figures)…", expanded=True) as status:
            bar = st.progress(0.0, text="preparing figures")

            def step(done: int, total: int, title: str) -> None:
                bar.progress(done / max(total, 1), text=f"{done}/{total} · {title}")

            data = export.presentation_pack(runs, names=chosen, width=int(width), height=int(height), scale=float(scale),
                                            theme=pack_theme, progress=step, audit=report)
            status.update(label=f"Presentation pack ready: {len(chosen)} figures, {len(data) / 1e6:.1f} MB",
                          state="complete", expanded=False)
        st.session_state["pack-data"] = (request, data)
    built = st.session_state.get("pack-data")
    if built is not None and built[0] == request:
        c2.download_button("Download pack (zip)", data=built[1], file_name=f"privacy-lab-runs-{ids}.zip",
                           mime=export.MIME["zip"], key="pack", on_click="ignore", icon=":material/download:")
    elif built is not None:
        c2.caption("The selection changed: build the pack again.")
    c3.download_button("Run configs (JSON)", data=export.configs_json(runs), file_name=f"runs-{ids}-configs.json",
                       mime=export.MIME["json"], key="configs", on_click="ignore")
    if not examples:
        st.caption(f"CLI: `privacy-lab export {' '.join(str(r['id']) for r in runs)} --format png --out export/`")


st.subheader("Export")
# the pack's figures: the live ones (every run here has evaluations), the non-empty result and talk figures
export_section(runs, list(LIVE_FIGURES) + [n for n, s in {**specs, **talk}.items() if not s.data.empty], report,
               examples)
