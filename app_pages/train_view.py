"""Train / compare: configure, preview the privacy plan, launch one background run per algorithm,
watch them live (MID curves, recall, accuracy, ε spent), cancel."""
from __future__ import annotations

import time
from dataclasses import asdict

import streamlit as st

from app_pages import _handles as handles
from app_pages import _plans as plans
from app_pages import _status as status
from app_pages import _widgets as widgets
from app_pages import _your_data as your_data
from app_pages._look import intro, md, plot_theme, show_error
from app_pages._tiers import tier_labels, url_tier_editor
from engine.config.run import (MODELS, TIF_SHAPES, AlgorithmConfig, DataConfig, ModelConfig, OptimizerConfig, RunConfig,
                               comparison_advisories)
from engine.config.schema import ConfigError
from engine.data import dataset_names
from engine.dp.tiers import preset, preset_names
from engine.jobs.estimates import format_seconds
from engine.jobs.manager import new_group_id, queue_positions
from engine.jobs.runs import algorithm_label
from engine.jobs.runs import dataset_name as run_dataset
from engine.tools.demo import DEFAULT_TRAIN

# The live view's secondary charts (accuracy, ε spent, per-class recall) redraw at most this often, one per
# refresh (and all at once when the options change or the last run ends): each redraw of a Plotly chart costs
# the browser ~0.2 s of CPU, and on 2 cores five charts twice a second kept the headline MID and tier charts
# ~2 s behind.
DETAIL_INTERVAL = 3.0
X_AXES = {"step": "steps", "epoch": "epochs", "elapsed": "wall time", "epsilon": "ε spent"}  # figure x_axis option


def comparison_label(group: str, runs: list[dict]) -> str:
    """A comparison for the picker, in words (its group id stays in the URL): its runs' numbers first (a
    narrow picker cuts the end of its text, never them), its algorithms (× k seeds), its dataset and when it was
    launched — "runs #3–#4 · IDP-SGD (SAMPLE) vs INO-SGD · digits · 05-12 14:03:27"."""
    members = sorted((r for r in runs if r["group_id"] == group), key=lambda r: r["id"])
    if not members:
        return "comparison (no runs)"
    when = time.strftime("%m-%d %H:%M:%S", time.localtime(min(r.get("created_at") or 0 for r in members)))
    algos = list(dict.fromkeys(algorithm_label(r["algorithm"]) for r in members))
    per = len(members) // max(len(algos), 1)
    what = " vs ".join(algos) + (f" × {per} seeds" if per > 1 and per * len(algos) == len(members) else "")
    data = run_dataset(members[0])
    ids = f"#{members[0]['id']}" if len(members) == 1 else f"#{members[0]['id']}–#{members[-1]['id']}"
    kind = "TIF sweep · " if is_sweep_group(group) else ""
    runs_word = "runs" if len(members) > 1 else "run"
    return f"{runs_word} {ids} · {kind}{what}" + (f" · {data}" if data else "") + f" · {when}"


def live_records(store, runs: list[dict]) -> list[dict]:
    """Run records with their evaluations, fetched incrementally (only new evaluations each refresh)."""
    cache = st.session_state.setdefault("evals", {})
    out = []
    for run in runs:
        have = cache.get(run["id"], [])
        new = store.eval_metrics(run["id"], after_step=have[-1]["step"] if have else -1)
        if new:
            have = cache[run["id"]] = have + new
        out.append(dict(run, evals=have))
    return out


def live_figures(group: str, names, **options) -> "LiveFigures":
    """The :class:`engine.figures.live.LiveFigures` of ``group`` for these figures, kept in the session (one per
    set of figure names): a refresh that only brings new evaluations patches its figures, and a view change
    (``options``, given to its ``update``) redraws them from the frames it keeps. A new group starts a new one."""
    slots = st.session_state.setdefault("live-figures", {})
    kept = slots.get(tuple(names))
    if kept is None or kept[0] != group:
        kept = slots[tuple(names)] = (group, LiveFigures(names, **options))
    return kept[1]


st.session_state["page-runs"] = st.session_state.get("page-runs", 0) + 1  # vs "view-runs": the live fragment's
st.title("Train / compare")
intro()
# the primary action in view on a first visit: filled once the settings below are read and checked (a widget
# written into this earlier container appears here, above them)
launch_row = st.container(key="launch-row")
url = widgets.UrlParams(labels={"algos": algorithm_label}, known=(
    "dataset", "max_train", "model", "epochs", "batch", "lr", "delta", "accountant", "clip", "seed", "eval_every",
    "seeds", "momentum",
    "algos", "idp_mode", "tif", "alpha", "beta", "power", "cut", "tail_pct", "tau", "quantile", "c_min", "c_max",
    "clip_rule", "private_q", "preset", "tiers", "group", "xaxis", "smooth", "mid_layout",
    "table_file", "table_label", "table_attributes", "table_budget", "table_bins"))
D = dict(asdict(DEFAULT_TRAIN), seeds=1)  # the default comparison's widget values (engine.tools.demo)
slots = widgets.FieldSlots()  # an error slot under each setting: a bad value is explained next to its field


# --- configuration ------------------------------------------------------------------------------------
names = [*dataset_names(), your_data.CHOICE]
cfg_col, algo_col = st.columns([3, 2], gap="large")
with cfg_col:
    st.subheader("Data, model and training")
    c1, c2, c3 = st.columns(3)
    dataset_name = c1.selectbox("Dataset", names, index=names.index(D["dataset"]) if D["dataset"] in names else 0,
                                key="dataset", bind="query-params",
                                help="digits, MNIST and Adult are always available offline; others need their "
                                     "files (the engine says which and where); or your own table")
    slots.add(c1, "Dataset", "data.name", "data")
    max_train = c2.number_input("Training samples (0 = all)", min_value=0, value=D["max_train"], step=100,
                                key="max_train", bind="query-params")
    slots.add(c2, "Training samples", "data.max_train", "max_train")
    model = c3.selectbox("Model", MODELS, index=MODELS.index(D["model"]), key="model", bind="query-params",
                         help="auto: the CNN for images, logistic regression for tabular data")
    slots.add(c3, "Model", "model.name", "model")
    table_errors: list[str] = []
    table_fields, table_tiers, table_dataset = ({"name": dataset_name}, None, None)
    if dataset_name == your_data.CHOICE:
        with st.container(key="your-data"):
            table_fields, table_tiers, table_dataset = your_data.table_inputs(table_errors)
    train = widgets.training_inputs(epochs=D["epochs"], batch=D["batch"], batch_step=8, lr=D["lr"], lr_step=0.05,
                                    slots=slots)
    c1, c2, c3 = st.columns(3)
    row = slots.row()
    # (no bounds on these inputs: a bounded one refuses silently and keeps its last valid value; the engine's
    # checks refuse a bad value with a message next to its field, and Launch waits)
    eval_every = c1.number_input("Evaluate every (steps, 0 = auto)", value=D["eval_every"], step=1,
                                 key="eval_every", bind="query-params")
    slots.add(c1, "Evaluate every", "eval_every", row=row)
    seeds = c2.number_input("Repeat over k seeds", value=D["seeds"], step=1, key="seeds",
                            bind="query-params",
                            help="k models per algorithm trained together (seeds seed … seed + k − 1, k from 1 to "
                                 "16); the charts draw the mean with a band (standard error) and pair IDP and INO "
                                 "by seed")
    slots.add(c2, "Repeat over k seeds", "seeds", row=row)
    momentum = c3.number_input("Momentum", value=float(D["momentum"]), step=0.1,
                               key="momentum", bind="query-params", help="in [0, 1)")
    slots.add(c3, "Momentum", "optimizer.momentum", row=row)

with algo_col:
    st.subheader("Algorithms (side by side)")
    algos = st.multiselect("Algorithms", widgets.ALGORITHM_CHOICES, default=list(D["algos"]),
                           format_func=algorithm_label, key="algos", bind="query-params",
                           help="One background run per algorithm, same seed, data and tiers")
    with st.expander("INO-SGD options", expanded=False):
        a1, a2 = st.columns(2)
        idp_mode = a1.selectbox("Built on IDP-SGD", ["sample", "scale"], key="idp_mode", bind="query-params")
        slots.add(a1, "Built on IDP-SGD", "algorithm.idp_mode")
        tif = a2.selectbox("TIF shape", [s for s in TIF_SHAPES if s != "piecewise"], key="tif", bind="query-params")
        slots.add(a2, "TIF shape", "algorithm.tif")
        a1, a2 = st.columns(2)
        alpha = a1.number_input("α (Beta)", value=1.0, step=0.25, key="alpha", bind="query-params")
        slots.add(a1, "α", "algorithm.alpha")
        beta = a2.number_input("β (Beta)", value=1.0, step=0.25, key="beta", bind="query-params")
        slots.add(a2, "β", "algorithm.beta")
        a1, a2 = st.columns(2)
        power = a1.number_input("Power", value=2.0, step=0.5, key="power", bind="query-params")
        slots.add(a1, "Power", "algorithm.power")
        cut = a2.number_input("Step cut", value=0.5, step=0.05, key="cut",
                              bind="query-params")
        slots.add(a2, "Step cut", "algorithm.step_cut")
        tail_pct = st.slider("Tail length γ, % of the expected batch clip mass", 1, 100, 50, key="tail_pct",
                             bind="query-params")
        slots.add(st, "Tail length γ", "algorithm.tail_fraction")
    with st.expander("DP-SGD-S options (its quantile is also DPSGD-Global-Adapt's)", expanded=False):
        a1, a2 = st.columns(2)
        tau = a1.number_input("τ", value=1.0, step=0.1, key="tau", bind="query-params")
        slots.add(a1, "τ", "algorithm.tau")
        quantile = a2.number_input("Quantile", value=0.75, step=0.05, key="quantile", bind="query-params",
                                   help="DP-SGD-S: the gradient-norm quantile each group's clip tracks. "
                                        "DPSGD-Global-Adapt: the fraction of gradients its threshold Z keeps within")
        slots.add(a2, "Quantile", "algorithm.quantile")
        a1, a2 = st.columns(2)
        c_min = a1.number_input("c_min (× C)", value=0.5, step=0.1, key="c_min", bind="query-params")
        slots.add(a1, "c_min", "algorithm.c_min")
        c_max = a2.number_input("c_max (× C)", value=4.0, step=0.5, key="c_max", bind="query-params")
        slots.add(a2, "c_max", "algorithm.c_max")
        clip_rule = st.selectbox("Clip rule", ["quantile", "reference"], key="clip_rule", bind="query-params",
                                 format_func={"quantile": "bounded relative quantile (private)",
                                              "reference": "fair-privacy reference (not private)"}.get,
                                 help="reference: C_k = C · min(c_max, ‖batch mean grad‖ / ‖group mean grad‖)")
        slots.add(st, "Clip rule", "algorithm.clip_rule")
        private_q = st.toggle("Private quantile (formal DP)", value=True, key="private_q", bind="query-params",
                              help="Off: the exact batch quantile is used — no formal DP guarantee")
        slots.add(st, "Private quantile", "algorithm.private_quantile")
        if not private_q:
            st.warning("DP-SGD-S with a non-private quantile has **no formal DP guarantee**.")
        if clip_rule == "reference":
            st.warning("DP-SGD-S with the reference clip rule has **no formal DP guarantee**.")

# --- tiers ------------------------------------------------------------------------------------------------
st.subheader("Privacy tiers")
# (each conditional region lives in its own container: a message appearing or vanishing never shifts
# the widgets below, which would remount them and break their URL binding)
errors: list[str] = list(table_errors)  # a bad table or table field: said by its field above
with st.container():
    tiers_cfg = None
    if dataset_name == your_data.CHOICE:
        dataset = table_dataset
        if table_tiers is not None and dataset is not None:  # each owner's ε from the table: no editor
            tiers_cfg = table_tiers
            st.caption(md(f"Tiers from the owners' budgets in `{table_tiers.column}`: one per distinct ε"
                          + (" bin" if table_tiers.bins else "") + " (the preview above lists them)."))
            dataset = None
    else:
        dataset = handles.dataset_or_error(dataset_name, max_train, errors)
    if dataset is not None:
        t1, t2 = st.columns([1, 3])
        presets = preset_names(dataset)
        preset_name = t1.selectbox("Preset", presets, index=presets.index(D["preset"]) if D["preset"] in presets else 0,
                                   key="preset", bind="query-params",
                                   on_change=lambda: st.query_params.pop("tiers", None),
                                   help="Tier splits from the engine; edit the table to customise")
        tier_key = f"tier-editor-{dataset_name}-{preset_name}"
        with t2:
            editor_box = st.container()
            slots.add(st, "Privacy tiers", "tiers")  # every tier message, once, under the tables
        problem = None
        try:
            with editor_box:
                tiers_cfg = url_tier_editor(url, preset(preset_name, dataset), dataset, key=tier_key)
        except ConfigError as e:
            errors.append(str(e))
            problem = e
        slots.tier_labels, slots.tiers = tier_labels(tier_key), tiers_cfg  # messages name tiers as the table does
        if problem is not None and not slots.show(problem):
            show_error(problem, user_terms=True)

# --- base config, validation and plan preview ------------------------------------------------------------------
with st.container():
    configs: list[RunConfig] = []
    if tiers_cfg is not None:
        try:
            base_cfg = RunConfig(
                data=DataConfig(**table_fields, max_train=int(max_train) or None),
                tiers=tiers_cfg,
                model=ModelConfig(name=model),
                algorithm=AlgorithmConfig(name="ino", idp_mode=idp_mode, tif=tif, alpha=float(alpha), beta=float(beta),
                                          power=float(power), step_cut=float(cut), tail_fraction=tail_pct / 100.0,
                                          tau=float(tau), quantile=float(quantile), private_quantile=bool(private_q),
                                          c_min=float(c_min), c_max=float(c_max), clip_rule=str(clip_rule)),
                optimizer=OptimizerConfig(lr=float(train["lr"]), momentum=float(momentum)), epochs=float(train["epochs"]),
                batch_size=int(train["batch"]), delta=float(train["delta"]), accountant=str(train["accountant"]),
                clip_norm=float(train["clip"]), seed=int(train["seed"]), eval_every=int(eval_every), seeds=int(seeds))
            base_cfg.validate()
            configs = [base_cfg.replace(**{"algorithm.name": a}) for a in algos]
            # valid but far from what trains, or ignored by every algorithm chosen: a warning by the field
            for advice in comparison_advisories(configs):
                if not slots.warn(advice):
                    st.warning(md(str(advice)), icon=":material/warning:")
        except ConfigError as e:
            errors.append(str(e))
            if not slots.show(e):
                show_error(e, user_terms=True)
    if not algos:
        st.info("Choose at least one algorithm.")
    previews = plans.run_plans(configs, errors, slots)

with launch_row:
    l1, l2 = st.columns([3, 8], vertical_alignment="center")
launch = l1.button("Launch comparison", type="primary", key="launch", icon=":material/rocket_launch:",
                   disabled=bool(errors) or not configs or len(previews) < len(configs))
# started once Launch is drawn: on a fresh server its standby workers' torch imports share the cores with this run
mgr = handles.manager()
if configs and len(previews) == len(configs) and not errors:
    mgr.hint(configs)  # the warm standby worker prepares the first run ahead of the click
with l2.container(key="launch-note"):
    if slots.reasons:
        fields = list(dict.fromkeys(slots.reasons))  # the messages themselves stay next to their fields
        st.caption(md("Launch is disabled until this is fixed: " + ", ".join(fields)
                      + " (see its message below, by the field)"))  # (the settings are below the Launch row)
    elif errors:
        st.caption("Launch is disabled: see the message below.")
    elif configs and len(previews) == len(configs):
        jobs = [(c, previews[c.algorithm.name].steps, previews[c.algorithm.name].expected_batch_size) for c in configs]
        est = mgr.run_time_estimate(jobs)
        if est is not None:
            st.caption(md(f"about {format_seconds(est[0])} from Launch to the end of {len(configs)} run(s) "
                          f"({est[1]})"))
if launch:
    group = new_group_id()
    mgr.submit(configs, group_id=group)
    st.query_params["group"] = group
    st.session_state.pop("evals", None)
    st.session_state.pop("live-figures", None)

# --- live view ----------------------------------------------------------------------------------------------------
# the chart code (plotly figures, the live figures' frames) is imported once Launch is drawn: a fresh server's first
# page shows the form and its Launch button without waiting for it
from app_pages import _charts as charts  # noqa: E402
from engine.figures.headline import gain_sentence, undersampled_note  # noqa: E402
from engine.figures.live import LiveFigures  # noqa: E402
from engine.figures.sweep_frame import is_sweep_group  # noqa: E402
from engine.figures.talk_frames import noise_cost_sentence  # noqa: E402
from engine.figures.training import live_figure_names  # noqa: E402

# redrawn on every refresh that brings new evaluations (the gain first, with an INO-SGD/IDP-SGD pair: the lab's
# headline)
HEADLINE_FIGURES = ("private_gain", "mid_curves", "tier_recall")
# the others of engine.figures.training.live_figure_names (DP-SGD-S's clips with a DP-SGD-S run): at most every
# DETAIL_INTERVAL
st.divider()
store = mgr.store
runs_all = store.list_runs(kind="train")
groups = list(dict.fromkeys(r["group_id"] for r in runs_all if r["group_id"]))
if not groups:
    url.check()
    st.info("No runs yet: launch a comparison above. Runs keep going in the background when you close the tab.")
    preview = charts.example_preview(plot_theme())
    if preview is not None:
        st.caption("What the default comparison shows — the lab's shipped example runs (3 seeds, 12 epochs of "
                   "MNIST): the most private tier's test loss under IDP-SGD and INO-SGD, mean ± s.e.; the shaded "
                   "span is its minority initial drop.")
        charts.chart(preview, key="example-mid", export_key="x-example")
    st.stop()
active = [r["group_id"] for r in runs_all if r["group_id"] and status.is_active(r)]
h1, h2 = st.columns([1, 2])  # the picker wide enough for its label (the run numbers come first in it)
h1.subheader("Live view")
current = widgets.run_picker("Comparison", groups, key="group_pick", param="group", default=(active or groups)[0],
                             format_func=lambda g: comparison_label(g, runs_all), url=url, where=h2,
                             label_visibility="collapsed")
any_active = any(status.is_active(r) for r in runs_all if r["group_id"] == current)


def view_options() -> dict:
    """The live view's controls (x unit, smoothing, MID layout), drawn inside its fragment: a change reruns the
    fragment alone, which redraws the charts from the evaluations it has read (a widget outside a fragment
    reruns the whole page: the form, its checks and the plan preview, seconds on a busy machine). Bound to the
    URL as before (the page's own run checks them with ``url.check``)."""
    o1, o2, o3 = st.columns([1, 1, 1], vertical_alignment="bottom")
    x_axis = o1.selectbox("x axis", list(X_AXES), format_func=X_AXES.get, key="xaxis", bind="query-params")
    smoothing = o2.slider("Smoothing (EMA weight; raw drawn faint)", 0.0, 0.95, 0.0, 0.05, key="smooth",
                          bind="query-params")
    mid_layout = o3.segmented_control("MID layout", ["facet", "overlay"], default="facet", key="mid_layout",
                                      bind="query-params",
                                      help="overlay: IDP and INO of the most-private tier on one panel")
    return dict(theme=plot_theme(), mid_layout=mid_layout or "facet", x_axis=x_axis or "step",
                smoothing=float(smoothing or 0.0))


def cached_gain_sentence(group: str, records: list[dict], gain) -> str | None:
    """The gain in words, computed once per logged step (it reads every seed's curve: ~1 s on a slow machine),
    not on every view change or refresh that brings nothing new."""
    key = (group, tuple((r["id"], len(r["evals"])) for r in records))
    kept = st.session_state.get("live-gain-sentence")
    if kept is None or kept[0] != key:
        kept = st.session_state["live-gain-sentence"] = (key, gain_sentence(gain))
    return kept[1]


@st.fragment(run_every=status.LIVE_INTERVAL if any_active else None)
def live(group: str) -> None:
    st.session_state["view-runs"] = st.session_state.get("view-runs", 0) + 1
    options = view_options()
    runs = sorted(store.list_runs(group_id=group), key=lambda r: r["id"])  # the refresh's one read of the runs
    queue = queue_positions(store.list_runs(status="queued"))  # every row of a k-seed job: its job's place
    with st.container(key="live-status"):
        for run in runs:
            status.kind_status_row(run, mgr, queue)
    records = live_records(store, runs)
    names = live_figure_names(runs)  # the gain with an INO-SGD/IDP-SGD pair, DP-SGD-S's clips with a DP-SGD-S run
    headline = live_figures(group, tuple(n for n in names if n in HEADLINE_FIGURES), **options)
    detail_names = tuple(n for n in names if n not in HEADLINE_FIGURES)
    details = [live_figures(group, (name,), **options) for name in detail_names]
    specs = headline.update(records, **options)  # every refresh (rebuilds nothing when nothing is new)
    view = charts.view_revision(group, options["x_axis"])  # the live charts' views re-range when these change
    if "private_gain" in specs:  # the phenomenon first, in words and as the paired gain over steps
        with st.container(key="live-gain-sentence"):
            sentence = cached_gain_sentence(group, records, specs["private_gain"].data)
            if sentence:
                st.info(md(sentence), icon=":material/trending_up:")
            else:
                st.caption("INO − IDP recall gain on the most private tier: waiting for both runs' first evaluations")
            sparse = undersampled_note(runs)
            if sparse:
                st.caption(md(f"⚠ {sparse}"))
        charts.chart(specs["private_gain"], key="live-gain", export_key="x-gain", uirevision=view)
    charts.chart(specs["mid_curves"], key="live-mid", export_key="x-mid",
                 uirevision=charts.view_revision(view, options["mid_layout"]))
    charts.chart(specs["tier_recall"], key="live-tier-recall", export_key="x-tier", uirevision=view)
    # each detail chart at most every DETAIL_INTERVAL, one per refresh (all at once when the options change
    # or the last run ends); computed after the headline charts are drawn, which the browser gets first (a view
    # change redraws the MID chart before the details are built)
    redraw = {name: (lambda f=f: f.update(records, **options)) for name, f in zip(detail_names, details)}
    for name, got in charts.staggered(DETAIL_INTERVAL, f"live-detail-{group}", redraw, unless_changed=(
            tuple(options.items()), any(status.is_active(r) for r in runs))).items():
        specs[name] = got[name]
    c1, c2 = st.columns(2)
    with c1:
        charts.chart(specs["accuracy"], key="live-accuracy", export_key="x-acc", uirevision=view, narrow=True)
    with c2:
        charts.chart(specs["epsilon_spent"], key="live-epsilon", export_key="x-eps", uirevision=view, narrow=True)
    charts.chart(specs["class_recall"], key="live-class-recall", export_key="x-class", uirevision=view)
    if "group_clip" in specs:  # a DP-SGD-S run in the comparison: its clips and its noise vs DP-SGD's
        charts.chart(specs["group_clip"], key="live-group-clip", export_key="x-clip", uirevision=view)
        cost = noise_cost_sentence(specs["group_clip"].data)
        if cost:
            st.warning(md(cost), icon=":material/warning:")
    if "global_scale" in specs:  # a DPSGD-Global-Adapt run: its threshold Z, scale C / max(Z, C) and noise
        charts.chart(specs["global_scale"], key="live-global-scale", export_key="x-scale", uirevision=view)
    if "individual_epsilon" in specs and not specs["individual_epsilon"].data.empty:  # whose privacy it spends
        charts.chart(specs["individual_epsilon"], key="live-individual", export_key="x-individual", uirevision=view)
    with st.container(key="live-stats"):  # for the curious (and the browser test): rebuilds vs patches
        figures = [headline, *details]
        st.caption(f"figures built {sum(f.builds for f in figures)}× · patched {sum(f.patches for f in figures)}× "
                   f"(accuracy, ε spent and per-class recall redraw every {DETAIL_INTERVAL:g} s) · "
                   f"page runs {st.session_state.get('page-runs', 0)} · view runs {st.session_state['view-runs']}")
    if any_active and not any(status.is_active(r) for r in runs):
        st.rerun()  # all done: one full rerun stops the polling


live(current)
url.check()  # every URL-bound widget has run (the view's, in the fragment, too): warn about the values dropped
