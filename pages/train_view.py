"""Train / compare: configure, preview the privacy plan, launch one background run per algorithm,
watch them live (MID curves, recall, accuracy, ε spent), cancel."""
from __future__ import annotations

import streamlit as st

from engine.config import (AlgorithmConfig, ConfigError, DataConfig, ModelConfig, OptimizerConfig, RunConfig,
                           MODELS, TIF_SHAPES)
from engine.data import dataset_names
from engine.demo import DEFAULT_TRAIN
from engine.figures.training import LIVE_FIGURES, build_figures
from engine.jobs import new_group_id
from engine.tiers import preset, preset_names
from pages import _common as ui
from pages import _plans, _widgets as widgets

st.title("Train / compare")
ui.intro()
url = widgets.UrlParams(labels={"algos": ui.algo_label})


# --- configuration ------------------------------------------------------------------------------------
names = dataset_names()
cfg_col, algo_col = st.columns([3, 2], gap="large")
with cfg_col:
    st.subheader("Data, model and training")
    c1, c2, c3 = st.columns(3)
    dataset_name = c1.selectbox("Dataset", names, index=names.index(DEFAULT_TRAIN.dataset), key="dataset",
                                bind="query-params",
                                help="digits, MNIST and Adult are always available offline; others need their "
                                     "files (the engine says which and where)")
    max_train = c2.number_input("Training samples (0 = all)", min_value=0, value=DEFAULT_TRAIN.max_train, step=100,
                                key="max_train", bind="query-params")
    model = c3.selectbox("Model", MODELS, index=MODELS.index(DEFAULT_TRAIN.model), key="model",
                         bind="query-params",
                         help="auto: the CNN for images, logistic regression for tabular data")
    train = widgets.training_inputs(epochs=DEFAULT_TRAIN.epochs, batch=DEFAULT_TRAIN.batch, batch_step=8,
                                    lr=DEFAULT_TRAIN.lr, lr_step=0.05)
    eval_every = st.number_input("Evaluate every (steps, 0 = auto)", min_value=0, value=DEFAULT_TRAIN.eval_every,
                                 step=1, key="eval_every", bind="query-params")

with algo_col:
    st.subheader("Algorithms (side by side)")
    algos = st.multiselect("Algorithms", ui.algorithm_options(), default=list(DEFAULT_TRAIN.algos),
                           format_func=ui.algo_label, key="algos", bind="query-params",
                           help="One background run per algorithm, same seed, data and tiers")
    with st.expander("INO-SGD options", expanded=False):
        a1, a2 = st.columns(2)
        idp_mode = a1.selectbox("Built on IDP-SGD", ["sample", "scale"], key="idp_mode", bind="query-params")
        tif = a2.selectbox("TIF shape", [s for s in TIF_SHAPES if s != "piecewise"], key="tif", bind="query-params")
        a1, a2 = st.columns(2)
        alpha = a1.number_input("α (Beta)", min_value=0.01, value=1.0, step=0.25, key="alpha", bind="query-params")
        beta = a2.number_input("β (Beta)", min_value=0.01, value=1.0, step=0.25, key="beta", bind="query-params")
        a1, a2 = st.columns(2)
        power = a1.number_input("Power", min_value=0.05, value=2.0, step=0.5, key="power", bind="query-params")
        cut = a2.number_input("Step cut", min_value=0.0, max_value=1.0, value=0.5, step=0.05, key="cut",
                              bind="query-params")
        tail_pct = st.slider("Tail length γ, % of the expected batch clip mass", 1, 100, 50, key="tail_pct",
                             bind="query-params")
    with st.expander("DP-SGD-S options", expanded=False):
        a1, a2 = st.columns(2)
        tau = a1.number_input("τ", min_value=0.01, value=1.0, step=0.1, key="tau", bind="query-params")
        quantile = a2.number_input("Quantile", min_value=0.01, max_value=0.99, value=0.75, step=0.05,
                                   key="quantile", bind="query-params")
        a1, a2 = st.columns(2)
        c_min = a1.number_input("c_min (× C)", min_value=0.01, value=0.5, step=0.1, key="c_min", bind="query-params")
        c_max = a2.number_input("c_max (× C)", min_value=0.01, value=4.0, step=0.5, key="c_max", bind="query-params")
        clip_rule = st.selectbox("Clip rule", ["quantile", "reference"], key="clip_rule", bind="query-params",
                                 format_func={"quantile": "bounded relative quantile (private)",
                                              "reference": "fair-privacy reference (not private)"}.get,
                                 help="reference: C_k = C · min(c_max, ‖batch mean grad‖ / ‖group mean grad‖)")
        private_q = st.toggle("Private quantile (formal DP)", value=True, key="private_q", bind="query-params",
                              help="Off: the exact batch quantile is used — no formal DP guarantee")
        if not private_q:
            st.warning("DP-SGD-S with a non-private quantile has **no formal DP guarantee**.")
        if clip_rule == "reference":
            st.warning("DP-SGD-S with the reference clip rule has **no formal DP guarantee**.")

# --- tiers ------------------------------------------------------------------------------------------------
st.subheader("Privacy tiers")
# (each conditional region lives in its own container: a message appearing or vanishing never shifts
# the widgets below, which would remount them and break their URL binding)
errors: list[str] = []
with st.container():
    tiers_cfg = None
    dataset = widgets.dataset(dataset_name, max_train, errors)
    if dataset is not None:
        t1, t2 = st.columns([1, 3])
        presets = preset_names(dataset)
        preset_name = t1.selectbox("Preset", presets, index=presets.index(DEFAULT_TRAIN.preset)
                                   if DEFAULT_TRAIN.preset in presets else 0, key="preset", bind="query-params",
                                   on_change=lambda: st.query_params.pop("tiers", None),
                                   help="Tier splits from the engine; edit the table to customise")
        base = preset(preset_name, dataset)
        start, custom = widgets.tiers_from_url(url, base)
        try:
            with t2:
                tiers_cfg = widgets.tier_editor(start, dataset,
                                                key=f"tier-editor-{dataset_name}-{preset_name}-{hash(custom or '')}")
            encoded = ui.tiers_to_param(tiers_cfg)
            if tiers_cfg != base and st.query_params.get("tiers") != encoded:
                st.query_params["tiers"] = encoded
        except ConfigError as e:
            errors.append(str(e))
            ui.show_error(e)
            tiers_cfg = None

# --- base config, validation and plan preview ------------------------------------------------------------------
with st.container():
    configs: list[RunConfig] = []
    if tiers_cfg is not None:
        try:
            base_cfg = RunConfig(
                data=DataConfig(name=dataset_name, max_train=int(max_train) or None),
                tiers=tiers_cfg,
                model=ModelConfig(name=model),
                algorithm=AlgorithmConfig(name="ino", idp_mode=idp_mode, tif=tif, alpha=float(alpha), beta=float(beta),
                                          power=float(power), step_cut=float(cut), tail_fraction=tail_pct / 100.0,
                                          tau=float(tau), quantile=float(quantile), private_quantile=bool(private_q),
                                          c_min=float(c_min), c_max=float(c_max), clip_rule=str(clip_rule)),
                optimizer=OptimizerConfig(lr=float(train["lr"]), momentum=DEFAULT_TRAIN.momentum),
                epochs=float(train["epochs"]),
                batch_size=int(train["batch"]), delta=float(train["delta"]), clip_norm=float(train["clip"]),
                seed=int(train["seed"]), eval_every=int(eval_every))
            base_cfg.validate()
            configs = [base_cfg.replace(**{"algorithm.name": a}) for a in algos]
        except ConfigError as e:
            errors.append(str(e))
            ui.show_error(e)
    if not algos:
        st.info("Choose at least one algorithm.")
    previews = _plans.run_plans(configs, errors)

mgr = ui.manager()
if configs and len(previews) == len(configs) and not errors:
    mgr.hint(configs)  # the warm standby worker prepares the first run ahead of the click
launch = st.button("Launch comparison", type="primary", key="launch", icon=":material/rocket_launch:",
                   disabled=bool(errors) or not configs or len(previews) < len(configs))
if launch:
    group = new_group_id()
    mgr.submit(configs, group_id=group)
    st.query_params["group"] = group
    st.session_state.pop("evals", None)

# --- live view ----------------------------------------------------------------------------------------------------
st.divider()
store = mgr.store
runs_all = store.list_runs(kind="train")
groups = list(dict.fromkeys(r["group_id"] for r in runs_all if r["group_id"]))
if not groups:
    url.check()
    st.info("No runs yet: launch a comparison above. Runs keep going in the background when you close the tab.")
    st.stop()
active = [r["group_id"] for r in runs_all if r["group_id"] and ui.is_active(r)]
h1, h2 = st.columns([3, 1])
h1.subheader("Live view")
current = widgets.run_picker("Comparison", groups, key="group_pick", param="group", default=(active or groups)[0],
                             format_func=lambda g: widgets.comparison_label(g, runs_all), url=url, where=h2,
                             label_visibility="collapsed")
mid_layout = h2.segmented_control("MID layout", ["facet", "overlay"], default="facet", key="mid_layout",
                                  bind="query-params", label_visibility="collapsed")
url.check()  # every URL-bound widget has run: warn about the values Streamlit dropped
any_active = any(ui.is_active(r) for r in runs_all if r["group_id"] == current)


@st.fragment(run_every=ui.LIVE_INTERVAL if any_active else None)
def live(group: str) -> None:
    runs = sorted(store.list_runs(group_id=group), key=lambda r: r["id"])
    with st.container(key="live-status"):
        for run in runs:
            widgets.status_row(run, widgets.progress_text(run, mgr), mgr)
    records = widgets.live_records(store, runs)
    theme = ui.plot_theme()
    sig = (group, theme, mid_layout, tuple((r["id"], r["status"], len(r["evals"])) for r in records))
    specs = widgets.cached_figures("live-figures", sig, lambda: build_figures(
        records, theme=theme, names=LIVE_FIGURES, mid_layout=mid_layout or "facet"))
    ui.chart(specs["mid_curves"], key="live-mid", export_key="x-mid")
    ui.chart(specs["tier_recall"], key="live-tier-recall", export_key="x-tier")
    c1, c2 = st.columns(2)
    with c1:
        ui.chart(specs["accuracy"], key="live-accuracy", export_key="x-acc")
    with c2:
        ui.chart(specs["epsilon_spent"], key="live-epsilon", export_key="x-eps")
    ui.chart(specs["class_recall"], key="live-class-recall", export_key="x-class")
    if any_active and not any(ui.is_active(r) for r in runs):
        st.rerun()  # all done: one full rerun stops the polling


live(current)
