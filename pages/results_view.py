"""Results: compare finished (or any past) runs — recall vs budget with Pearson r, INO − IDP gains,
recall AUC, loss/accuracy, fairness, the MID table — and export everything."""
from __future__ import annotations

import streamlit as st

from engine import export
from engine.figures import frames
from engine.figures.training import LIVE_FIGURES, RESULT_FIGURES, build_figures
from engine.runs import dp_note, run_label, run_record
from pages import _common as ui
from pages import _widgets as widgets

st.title("Results")
ui.intro()
url = widgets.UrlParams()
store = ui.store()

c1, c2 = st.columns([4, 1], vertical_alignment="bottom")
include_all = c2.toggle("Include unfinished", value=False, key="all", bind="query-params",
                        help="Also cancelled / interrupted / running runs (their last evaluation counts)")
candidates = [r for r in store.list_runs(kind="train") if include_all or r["status"] == "finished"]
if not candidates:
    st.info("No finished runs yet — launch a comparison on the Train / compare page.")
    st.stop()
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
st.caption(" · ".join(ui.run_option_label(by_label[p]) for p in picked))  # (escaped labels)

runs = [run_record(store, by_label[p]["id"]) for p in picked]
runs = [r for r in runs if r is not None and r["evals"]]
if not runs:
    st.warning("The selected runs have no evaluations yet.")
    st.stop()
with st.container():  # a variable number of notes must not shift (remount) the widgets below
    for r in runs:
        if dp_note(r):
            st.caption(ui.md(f"⚠ {run_label(r)}: {dp_note(r)}"))

theme = ui.plot_theme()
specs = {s.name: s for s in build_figures(runs, theme=theme, names=RESULT_FIGURES)}

st.subheader("Who pays for privacy?")
ui.chart(specs["recall_vs_budget"], key="res-budget", export_key="e-budget")
stats = frames.pearson_by_run(frames.owner_recall(runs))
st.dataframe(stats.drop(columns=["run_id"]).rename(columns={"r": "Pearson r", "p": "p-value", "n": "owners"}),
             hide_index=True, width="content")

st.subheader("INO-SGD vs IDP-SGD")
c1, c2 = st.columns(2)
with c1:
    ui.chart(specs["recall_gain_class"], key="res-gain-class", export_key="e-gain-class")
with c2:
    ui.chart(specs["recall_gain_time"], key="res-gain-time", export_key="e-gain-time")
st.caption("On easy tasks the INO gain lives early, in the MID window, and fades by the end: "
           "the area under each tier's recall curve keeps it visible.")
ui.chart(specs["recall_auc"], key="res-auc", export_key="e-auc")

st.subheader("Utility and fairness")
c1, c2 = st.columns(2)
with c1:
    ui.chart(specs["overall_bars"], key="res-overall", export_key="e-overall")
with c2:
    if specs["fairness_bars"].data.empty:
        st.info("Outcome-fairness metrics (demographic parity, equalized odds) are computed for binary tabular "
                "datasets with a sensitive attribute, e.g. adult.")
    else:
        ui.chart(specs["fairness_bars"], key="res-fair", export_key="e-fair")

st.subheader("MID summary")
st.dataframe(specs["mid_summary"].data, hide_index=True, width="stretch")
ui.export_menu(specs["mid_summary"], key="e-mid")

st.subheader("Export")
ok, reason = export.static_export_available()
with st.container():
    if not ok:
        st.warning(reason)
c1, c2, c3, c4 = st.columns(4)
width = c1.number_input("Width (px)", 400, 4000, 1600, 100, key="pack_w")
height = c2.number_input("Height (px)", 300, 3000, 900, 100, key="pack_h")
scale = c3.number_input("Scale", 0.5, 4.0, 2.0, 0.5, key="pack_scale")
pack_theme = c4.selectbox("Theme", ["presentation", "light", "dark"], key="pack_theme")
ids = "-".join(str(r["id"]) for r in runs)
# the pack's figures: the live ones (every run here has evaluations) and the non-empty result figures
names = list(LIVE_FIGURES) + [n for n, s in specs.items() if not s.data.empty]
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
                                        theme=pack_theme, progress=step)
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
st.caption(f"CLI: `privacy-lab export {' '.join(str(r['id']) for r in runs)} --format png --out export/`")
