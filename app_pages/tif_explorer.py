"""TIF explorer: what a tail importance function does to a batch — no training involved."""
from __future__ import annotations

import time

import streamlit as st

from app_pages import _charts as charts
from app_pages import _handles as handles
from app_pages import _widgets as widgets
from app_pages._look import intro, md, plot_theme, show_error
from app_pages._status import is_active
from engine.config.run import MODELS, AlgorithmConfig, DataConfig, ModelConfig, RunConfig
from engine.config.schema import ConfigError
from engine.data import DataError, dataset_names
from engine.dp.importance import expected_dropped_mass, resolve_tail_length
from engine.dp.mechanisms import build_tif
from engine.dp.tiers import preset, preset_names
from engine.figures.explorer import fig_bif_batch, fig_tier_rho, fig_tif
from engine.figures.scaffold import FigureSpec
from engine.figures.talk import build_talk_figures
from engine.jobs.estimates import format_seconds
from engine.jobs.manager import new_group_id
from engine.jobs.runs import run_record
from engine.tools import sweep, tif_explorer

st.title("TIF explorer")
intro()
url = widgets.UrlParams()
store = handles.store()
st.caption("INO-SGD sorts a batch by loss and lays the clipped gradients end to end as clip mass; the first γ of "
           "that mass (the easiest items) is weighted by the TIF, the rest gets weight 1. Move the sliders: "
           "nothing is trained, the batch is sampled once per dataset/tier setting and cached.")


@st.cache_data(show_spinner="Sampling a batch…", max_entries=32)
def _sample(name: str, preset_name: str, batch: int, seed: int, mode: str) -> dict:
    ds = handles.dataset(name)
    return tif_explorer.explorer_sample(ds, preset(preset_name, ds), batch_size=batch, seed=seed, mode=mode)


controls, view = st.columns([1.3, 2.4], gap="large")  # the TIF shape's four buttons fit their column
with controls:
    names = dataset_names()
    name = st.selectbox("Dataset", names, index=names.index("digits"), key="x_dataset", bind="query-params")
    try:
        ds = handles.dataset(name)
    except DataError as e:
        show_error(e)
        st.stop()
    preset_name = st.selectbox("Tiers", preset_names(ds), key="x_tiers", bind="query-params")
    c1, c2 = st.columns(2)
    batch = c1.number_input("Batch size", 4, 1024, 64, 8, key="x_batch", bind="query-params")
    seed = c2.number_input("Batch seed", 0, 10_000, 0, 1, key="x_seed", bind="query-params")
    mode = st.segmented_control("IDP-SGD planner", ["sample", "scale"], default="sample", key="x_mode",
                                bind="query-params", help="sets the per-tier sampling rates q and clip norms C")
    st.divider()
    shape = st.segmented_control("TIF shape", ["beta", "linear", "power", "step"], default="beta", key="x_shape",
                                 bind="query-params")
    # every parameter stays on screen (greyed out when the shape ignores it): no layout jumps on a switch
    c1, c2 = st.columns(2)
    alpha = c1.slider("α (Beta)", 0.1, 10.0, 1.0, 0.1, key="x_alpha", bind="query-params", disabled=shape != "beta")
    beta = c2.slider("β (Beta)", 0.1, 10.0, 1.0, 0.1, key="x_beta", bind="query-params", disabled=shape != "beta")
    c1, c2 = st.columns(2)
    power = c1.slider("power", 0.1, 8.0, 2.0, 0.1, key="x_power", bind="query-params", disabled=shape != "power")
    cut = c2.slider("step cut", 0.0, 1.0, 0.5, 0.01, key="x_cut", bind="query-params", disabled=shape != "step")
    tail_mode = st.radio("Tail length γ given as", ["% of expected batch clip mass", "absolute"], key="x_tail_mode",
                         bind="query-params", horizontal=True)

try:
    sample = _sample(name, preset_name, int(batch), int(seed), mode or "sample")
except (ConfigError, DataError) as e:
    with view:
        show_error(e)
    st.stop()

mass = sample["expected_clip_mass"]
with controls:
    if tail_mode == "absolute":
        tail = {"tail_length": st.slider("γ (clip-mass units)", 0.0, float(max(1.0, round(2 * mass, 1))),
                                         float(round(mass / 2, 1)), 0.1, key="x_tail_abs", bind="query-params")}
    else:
        pct = st.slider("γ, % of the expected batch clip mass", 0, 100, 50, 1, key="x_tail_pct", bind="query-params")
        tail = {"tail_fraction": pct / 100.0}
    # the INO-SGD settings a run would use: the engine's own TIF and γ (fixed once from the expected clip mass)
    algo = AlgorithmConfig(name="ino", idp_mode=mode or "sample", tif=shape or "beta", alpha=float(alpha),
                           beta=float(beta), power=float(power), step_cut=float(cut), **tail)
    gamma = resolve_tail_length(algo, mass)
    st.caption(f"expected batch clip mass Σ q·N·C = {mass:.2f} · γ = {gamma:.2f}")

t0 = time.perf_counter()
tif = build_tif(algo)
batch_df = tif_explorer.explorer_batch(sample["losses"], sample["clip_norms"], sample["tiers"], sample["tier_names"],
                                sample["tier_epsilons"], tif=tif, tail_length=gamma)
tiers_df = tif_explorer.explorer_tier_table(batch_df)
theme = plot_theme()
spec_bif = FigureSpec("bif_batch", "BIF over a batch", fig_bif_batch(batch_df, tif, gamma, theme=theme),
                            batch_df)
spec_tif = FigureSpec("tif", "TIF", fig_tif(tif, theme=theme), tiers_df)
spec_rho = FigureSpec("tier_rho", "Mean ρ per tier", fig_tier_rho(tiers_df, theme=theme), tiers_df)
elapsed_ms = (time.perf_counter() - t0) * 1000

with view:
    dropped_batch = float(((1 - batch_df["rho"]) * batch_df["clip_norm"]).sum()) if not batch_df.empty else 0.0
    m1, m2, m3, m4 = st.columns(4)
    m1.metric("Items in this batch", len(batch_df), help=f"expected {sample['expected_batch']:.1f}")
    m2.metric("Dropped, full batch", f"{expected_dropped_mass(tif, gamma):.3f}",
              help="clip mass down-weighted per full batch: γ·(1 − ∫TIF) = γ·α/(α+β) for Beta")
    m3.metric("Dropped here", f"{dropped_batch:.3f}", help="clip mass down-weighted here: Σ (1 − ρ_i) · C_i")
    m4.metric("Mean ρ", f"{batch_df['rho'].mean():.3f}" if not batch_df.empty else "—")
    charts.chart(spec_bif, key="x-bif", export_key="xe-bif")
    c1, c2 = st.columns(2)
    with c1:
        charts.chart(spec_tif, key="x-tif", export_key="xe-tif", height=360, narrow=True)
    with c2:
        charts.chart(spec_rho, key="x-rho", export_key="xe-rho", height=360, narrow=True)
    st.caption(f"Figures computed in {elapsed_ms:.0f} ms · losses from an under-fitted reference model "
               f"(logistic regression), rates and clip norms from the IDP-SGD {mode or 'sample'} plan.")

# --- a sweep: train one IDP-SGD reference and one INO-SGD run per grid cell -------------------------------
st.divider()
st.subheader("Sweep: the most private tier's INO gain over two TIF parameters")
st.caption("Trains the IDP-SGD reference and one INO-SGD run per cell (this page's dataset, tiers, batch size, "
           "planner and TIF settings; the swept parameters replace theirs) as one group; the heatmap shows the most "
           "private tier's recall gain INO − IDP in each cell. Results shows it too (pick the sweep's runs).")
labels = sweep.PARAM_LABELS
c1, c2, c3, c4 = st.columns(4)
x_param = c1.selectbox("x parameter", list(labels), format_func=labels.get, key="sw_x", bind="query-params")
x_text = c2.text_input("x values", "0.5, 2", key="sw_xv", bind="query-params", help="comma-separated")
y_param = c3.selectbox("y parameter", list(labels), index=2, format_func=labels.get, key="sw_y", bind="query-params")
y_text = c4.text_input("y values", "0.25, 0.75", key="sw_yv", bind="query-params", help="comma-separated")
c1, c2, c3, c4 = st.columns(4)
sw_epochs = c1.number_input("Epochs per run", 0.1, 100.0, 2.0, 0.5, key="sw_epochs", bind="query-params")
sw_max = c2.number_input("Training samples (0: all)", 0, 1_000_000, 0, 100, key="sw_max", bind="query-params")
sw_model = c3.selectbox("Model", [m for m in MODELS if m != "resnet18"], key="sw_model", bind="query-params")
url.check()  # every URL-bound widget of the page has run
sweep_error = None
configs, run_names = [], []
try:
    xs, ys = sweep.parse_grid(x_text, x_param), sweep.parse_grid(y_text, y_param)
    base = RunConfig(data=DataConfig(name=name, max_train=int(sw_max) or None), tiers=preset(preset_name, ds),
                     model=ModelConfig(name=sw_model), algorithm=algo, epochs=float(sw_epochs), batch_size=int(batch))
    configs, run_names = sweep.sweep_configs(base, x_param, xs, y_param, ys)
    n_train = len(ds.y_train) if not int(sw_max) else min(int(sw_max), len(ds.y_train))
    jobs = [(c, c.planned_steps(n_train), None) for c in configs]  # (config, steps, its batch size)
except ConfigError as e:
    sweep_error = e
mgr = handles.manager()
if sweep_error is not None:
    show_error(sweep_error)
else:
    steps = jobs[0][1]  # every cell trains the reference's epochs and batch size
    secs, how = mgr.run_time_estimate(jobs)
    c4.metric("Runs", len(configs), help=f"1 IDP-SGD reference + {len(configs) - 1} INO-SGD cells, {steps} steps each")
    st.caption(md(f"{len(configs)} runs × {steps} steps · ≈ {format_seconds(secs)} ({how}; "
                  f"{mgr.max_workers} at a time)"))
if st.button("Launch sweep", type="primary", icon=":material/grid_on:", key="sw_launch", disabled=sweep_error is not None):
    group = new_group_id(sweep.group_prefix(x_param, y_param))
    mgr.submit(configs, group_id=group, names=run_names)
    st.session_state["sweep_group"] = group

groups = [r["group_id"] for r in store.list_runs(kind="train") if sweep.is_sweep_group(r["group_id"])]
shown = st.session_state.get("sweep_group") or (groups[0] if groups else None)
sweep_active = shown is not None and any(is_active(r) for r in store.list_runs(group_id=shown))


@st.fragment(run_every=1.0 if sweep_active else None)
def sweep_view(group: str) -> None:
    rows = sorted(handles.store().list_runs(group_id=group), key=lambda r: r["id"])
    done = sum(r["status"] == "finished" for r in rows)
    st.caption(md(f"Sweep {group}: {done}/{len(rows)} runs finished") + (" · training…" if any(
        is_active(r) for r in rows) else ""))
    records = [rec for rec in (run_record(handles.store(), r["id"]) for r in rows) if rec is not None]
    spec = build_talk_figures(records, theme=plot_theme(), names=["tif_sweep"])[0]
    charts.chart(spec, key="x-sweep", export_key="xe-sweep")


if shown is not None:
    with st.container(key="sweep-view"):
        sweep_view(shown)
