"""Runs: the store's history — status, config, duration; cancel, delete, rerun, copy as CLI command,
download the config JSON and the metrics CSV."""
from __future__ import annotations

import json
import shlex
import time

import pandas as pd
import streamlit as st

from app_pages import _handles as handles
from app_pages import _widgets as widgets
from app_pages._look import md
from app_pages._status import cancelling, state_words
from engine.figures import export
from engine.config.schema import ConfigError
from engine.jobs.kinds import JOB_KINDS, rerun_of
from engine.jobs.runs import algorithms_label, dataset_name, diverged_note, dp_note, run_label, run_record
from engine.jobs.estimates import format_seconds
from engine.store.db import ACTIVE, STATUSES

st.title("Runs")
url = widgets.UrlParams()
mgr = handles.manager()
store = mgr.store

c1, c2, c3 = st.columns([2, 2, 1], vertical_alignment="bottom")
status_filter = c1.multiselect("Status", list(STATUSES),
                               key="status", bind="query-params", placeholder="all")
kind_filter = c2.segmented_control("Kind", list(JOB_KINDS), key="kind", bind="query-params",
                                   selection_mode="single", format_func=lambda k: k.replace("_", "-"))
url.check()
runs = store.list_runs(kind=kind_filter or None)
if status_filter:
    runs = [r for r in runs if r["status"] in status_filter]
any_active = any(r["status"] in ACTIVE for r in runs)


def rerun_command(run_id: int) -> str:
    """The short ``privacy-lab rerun`` line of a run: this store and data folder as absolute paths
    (shell-quoted, whatever they contain)."""
    from engine.data.files import data_dir

    return (f"privacy-lab --store {shlex.quote(str(store.path.resolve()))} "
            f"--data-dir {shlex.quote(str(data_dir()))} rerun {int(run_id)}")


def _duration(r: dict) -> float | None:
    if not r["started_at"]:
        return None
    end = r["finished_at"] or (time.time() if r["status"] == "running" else r["started_at"])
    return end - r["started_at"]


def watched(run: dict) -> tuple:
    """What reruns the whole page when it changes: a run's status and its Cancel (not its steps: a page rerun per
    step kept the page busy redrawing the table and the details for as long as a run trained)."""
    return run["id"], run["status"], run.get("cancel_requested_at") is not None


@st.fragment(run_every=1.0 if any_active else None)
def watch(snapshot: tuple) -> None:
    """While runs are active: their steps in one line, redrawn every second here; the page reruns only when a
    status changes (keeps the selection)."""
    now = [r for r in (store.get_run(x["id"]) for x in runs) if r]
    if tuple(watched(r) for r in now) != snapshot:
        st.rerun()
    live = [f"{run_label(r)}: step {r['step']}/{r['total_steps'] or '?'}" for r in now if r["status"] == "running"]
    if live:
        st.caption(md("Training now — " + " · ".join(live)))


if not runs:
    st.info("No runs in the store yet.")
    st.stop()
df = pd.DataFrame([{
    "id": r["id"], "status": r["status"],
    "algorithm": algorithms_label(r), "dataset": dataset_name(r),
    "kind": r["kind"], "progress": f"{r['step']}/{r['total_steps'] or '?'}", "duration": format_seconds(_duration(r)),
    "created": time.strftime("%m-%d %H:%M:%S", time.localtime(r["created_at"])),
    "comparison": r["group_id"] or "",
    "note": "; ".join(filter(None, (state_words(r) if cancelling(r) else None, r["error"], dp_note(r)))),
} for r in runs])
# Every column's width set: with widths from their content the table outgrew the page (1211 px in a box of 938 at
# 1400 × 900, its last column cut at the right edge). 915 px with the selection column: a longer text shows its
# start in the cell and whole in the run's details below.
RUNS_COLUMNS = {
    "id": st.column_config.NumberColumn("id", width=50, format="%d"),
    "status": st.column_config.TextColumn("status", width=90),
    "algorithm": st.column_config.TextColumn("algorithm", width=130),
    "dataset": st.column_config.TextColumn("dataset", width=75),
    "kind": st.column_config.TextColumn("kind", width=65),
    "progress": st.column_config.TextColumn("progress", width=75, help="steps done / planned"),
    "duration": st.column_config.TextColumn("duration", width=70),
    "created": st.column_config.TextColumn("created", width=100, help="month-day time"),
    "comparison": st.column_config.TextColumn("comparison", width=85),
    "note": st.column_config.TextColumn("note", width=140, help="why it stopped (its error) and its DP warning; "
                                                                "empty: formal DP and no error"),
}
event = st.dataframe(df, hide_index=True, width="stretch", key="runs-table", on_select="rerun",
                     selection_mode="multi-row", column_config=RUNS_COLUMNS)
watch(tuple(watched(r) for r in runs))
rows = list(event.selection.rows) if event is not None else []
selected = [runs[i] for i in rows if i < len(runs)]
if not selected:
    st.caption("Select rows for details, downloads, cancel and delete.")
    st.stop()

ids = [r["id"] for r in selected]
c1, c2, c3 = st.columns(3)
if c1.button("Open in Results", icon=":material/insights:", key="to-results"):
    st.switch_page("app_pages/results_view.py", query_params={"runs": [run_label(r) for r in selected], "all": "true"})
if any(r["status"] in ACTIVE for r in selected) and c2.button("Cancel selected", icon=":material/stop_circle:",
                                                                 key="cancel-selected"):
    for r in selected:  # without waiting for the workers: their rows say "cancelling…" at once (the table's note)
        if r["status"] in ACTIVE:
            mgr.cancel(r["id"], wait=False, step=r["step"])
    st.rerun()
with c3.popover("Delete selected", icon=":material/delete:"):
    st.write(f"Delete run(s) {', '.join(map(str, ids))} and their metrics? This cannot be undone.")
    if st.button("Delete", type="primary", key="confirm-delete"):
        for i in ids:
            mgr.delete(i)
        st.session_state.pop("runs-table", None)
        st.rerun()

for r in selected:
    with st.expander(md(f"{run_label(r)} — {r['status']}"), expanded=len(selected) == 1):
        if r["error"]:
            st.caption(md(f"{r['status']}: {r['error']}"))
        if diverged_note(r):
            st.warning(md(diverged_note(r)), icon=":material/trending_up:")
        if dp_note(r):
            st.warning(md(dp_note(r)))
        config_text = json.dumps(r["config"], indent=2, sort_keys=True)
        if st.button("Rerun", icon=":material/replay:", key=f"rerun-{r['id']}",
                     help="Queue this run's config again as a new comparison of its own (a row of a k-seed job: "
                          "the whole job); the original comparison is left as it is"):
            try:
                job, config = rerun_of(r)
                new_ids = mgr.submit([config], kind=job.name, names=[r["name"]])
            except ConfigError as e:
                st.error(md(f"Cannot re-run run {r['id']}: {e}"))
            else:
                st.session_state["rerun-note"] = (r["id"], new_ids, job.name)
        note = st.session_state.get("rerun-note")
        if note is not None and note[0] == r["id"]:
            with st.container(key=f"rerun-note-{r['id']}"):
                st.success(f"Queued as run {', '.join(map(str, note[1]))} in a new comparison.")
                page, link = JOB_KINDS[note[2]].watch(int(note[1][0]), store.get_run(note[1][0])["group_id"])
                st.markdown(f"[Watch it on the {page} page]({link})")
        st.caption("Copy as CLI command (re-runs this config as a new run, from any directory; add "
                   "`--set key=value` to change a field, e.g. `--set epochs=4`):")
        st.code(rerun_command(r["id"]), language="bash")
        d1, d2 = st.columns(2)
        d1.download_button("Config (JSON)", data=config_text, file_name=f"run_{r['id']}.json",
                           mime=export.MIME["json"], key=f"cfg-{r['id']}", on_click="ignore")
        d2.download_button("Metrics (CSV)", data=lambda rid=r["id"]: export.metrics_csv(run_record(store, rid)),
                           file_name=f"run_{r['id']}_metrics.csv", mime=export.MIME["csv"], key=f"csv-{r['id']}",
                           on_click="ignore")
        if r["plan"]:
            st.caption("Plan")
            st.json(r["plan"], expanded=False)
        if r["summary"]:
            st.caption("Summary")
            st.json(r["summary"], expanded=False)
        st.caption(md(f"Worker log: {mgr.log_path(r['id'])}"))
