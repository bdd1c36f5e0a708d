"""Train / compare: configure, preview the privacy plan, launch one background run per algorithm,
watch them live (MID curves, recall, accuracy, ε spent), cancel."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.figures.training import LIVE_FIGURES, build_figures
from engine.runs import algorithm_label, dp_note, run_label
from engine.config import (AlgorithmConfig, ConfigError, DataConfig, ModelConfig, OptimizerConfig, RunConfig,
                           MODELS, TIF_SHAPES)
from engine.data import DataError, dataset_names
from engine.jobs import eta_seconds, new_group_id, preview
from engine.tiers import preset, preset_names
from pages import _common as ui

st.title("Train / compare")
ui.intro()


@st.cache_data(show_spinner=False, max_entries=128)
def _preview(config_json: str) -> dict:
    return preview(RunConfig.from_json(config_json))


def _plan_frame(p: dict) -> pd.DataFrame:
    plan = p.get("plan")
    rows = []
    for k, name in enumerate(p["tier_names"]):
        row = {"tier": name, "owners": p["tier_sizes"][k], "ε target": p["target_epsilons"][k]}
        if plan:
            row.update({"ε planned": round(plan["epsilons"][k], 4), "q (sample rate)": round(plan["sample_rates"][k], 5),
                        "C (clip)": round(plan["clip_norms"][k], 4),
                        "σ (noise mult.)": round(plan["noise_std"] / plan["clip_norms"][k], 4)})
        rows.append(row)
    return pd.DataFrame(rows)


# --- configuration ------------------------------------------------------------------------------------
names = dataset_names()
cfg_col, algo_col = st.columns([3, 2], gap="large")
with cfg_col:
    st.subheader("Data, model and training")
    c1, c2, c3 = st.columns(3)
    dataset_name = c1.selectbox("Dataset", names, index=names.index("digits"), key="dataset", bind="query-params",
                                help="digits is always available offline; others need their files "
                                     "(the engine says which and where)")
    max_train = c2.number_input("Training samples (0 = all)", min_value=0, value=0, step=100, key="max_train",
                                bind="query-params")
    model = c3.selectbox("Model", MODELS, key="model", bind="query-params",
                         help="auto: the CNN for images, logistic regression for tabular data")
    c1, c2, c3, c4 = st.columns(4)
    epochs = c1.number_input("Epochs", min_value=0.1, value=3.0, step=0.5, key="epochs", bind="query-params")
    batch = c2.number_input("Batch size", min_value=1, value=64, step=8, key="batch", bind="query-params")
    lr = c3.number_input("Learning rate", min_value=0.0001, value=0.5, step=0.05, format="%.4g", key="lr",
                         bind="query-params")
    seed = c4.number_input("Seed", min_value=0, value=0, step=1, key="seed", bind="query-params")
    c1, c2, c3 = st.columns(3)
    delta = c1.number_input("δ", min_value=1e-12, max_value=0.5, value=1e-5, format="%.1e", key="delta",
                            bind="query-params")
    clip = c2.number_input("Clip norm C", min_value=0.001, value=1.0, step=0.1, key="clip", bind="query-params")
    eval_every = c3.number_input("Evaluate every (steps, 0 = auto)", min_value=0, value=0, step=1, key="eval_every",
                                 bind="query-params")

with algo_col:
    st.subheader("Algorithms (side by side)")
    algos = st.multiselect("Algorithms", ui.algorithm_options(), default=["idp_sample", "ino"],
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
        private_q = st.toggle("Private quantile (formal DP)", value=True, key="private_q", bind="query-params",
                              help="Off: the exact batch quantile is used — no formal DP guarantee")
        if not private_q:
            st.warning("DP-SGD-S with a non-private quantile has **no formal DP guarantee**.")

# --- tiers ------------------------------------------------------------------------------------------------
st.subheader("Privacy tiers")
# (each conditional region lives in its own container: a message appearing or vanishing never shifts
# the widgets below, which would remount them and break their URL binding)
with st.container():
    dataset = None
    try:
        dataset = ui.dataset(dataset_name, int(max_train) or None)
    except (DataError, ConfigError) as e:
        ui.show_error(e)

    tiers_cfg = None
    errors: list[str] = []
    if dataset is not None:
        presets = preset_names(dataset)

        def _clear_custom():
            st.query_params.pop("tiers", None)

        t1, t2 = st.columns([1, 3])
        preset_name = t1.selectbox("Preset", presets, key="preset", bind="query-params", on_change=_clear_custom,
                                   help="Tier splits from the engine; edit the table to customise")
        base = preset(preset_name, dataset)
        custom = st.query_params.get("tiers")
        start = base
        if custom:
            try:
                start = ui.tiers_from_param(custom)
            except ConfigError as e:
                errors.append(str(e))
                ui.show_error(e)
        if start.assign == "explicit":
            t2.info("Explicit per-sample tier assignments are set in a JSON config (python -m engine run).")
            tiers_cfg = start
        else:
            table = ui.tiers_to_rows(start, dataset)
            with t2:
                edited = st.data_editor(
                    table, key=f"tier-editor-{dataset_name}-{preset_name}-{hash(custom or '')}", hide_index=True,
                    disabled=[c for c in ("class", "name", "value") if c in table.columns],
                    column_config={"tier": st.column_config.NumberColumn("tier", step=1, help="tier number (1, 2, …)"),
                                   "ε": st.column_config.NumberColumn("ε", format="%.4g", help="privacy budget of the tier"),
                                   "ratio": st.column_config.NumberColumn("ratio", format="%.3f")},
                    height="auto")
            try:
                tiers_cfg = ui.rows_to_tiers(edited, start)
                tiers_cfg.validate()
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
                                          tau=float(tau), quantile=float(quantile), private_quantile=bool(private_q)),
                optimizer=OptimizerConfig(lr=float(lr)),
                epochs=float(epochs), batch_size=int(batch), delta=float(delta), clip_norm=float(clip), seed=int(seed),
                eval_every=int(eval_every))
            base_cfg.validate()
            configs = [base_cfg.replace(**{"algorithm.name": a}) for a in algos]
        except ConfigError as e:
            errors.append(str(e))
            ui.show_error(e)
    if not algos:
        st.info("Choose at least one algorithm.")

    previews: dict[str, dict] = {}
    if configs:
        with st.expander("Privacy plan (per-tier q, C, σ) — computed before launching", expanded=True):
            tabs = st.tabs([ui.algo_label(c.algorithm.name) for c in configs])
            for tab, cfg in zip(tabs, configs):
                with tab:
                    try:
                        with st.spinner("Planning…"):
                            p = _preview(cfg.to_json())
                    except (ConfigError, DataError) as e:
                        errors.append(str(e))
                        ui.show_error(e)
                        continue
                    previews[cfg.algorithm.name] = p
                    plan = p.get("plan")
                    if plan is None:
                        st.caption(f"Non-private reference: no clipping, no noise, no DP guarantee · {p['steps']} steps")
                    else:
                        extra = f" · INO tail γ = {p['tail_length']:.3g}" if p.get("tail_length") else ""
                        st.caption(f"{p['steps']} steps · expected batch {plan['expected_batch_size']:.1f} · noise std "
                                   f"{plan['noise_std']:.4g} · σ* = {plan['noise_multiplier']:.4g}{extra}")
                        for note in plan.get("notes") or []:
                            st.caption(ui.md(f"note: {note}"))
                    if not p["formal_dp"] and cfg.algorithm.name != "nonprivate":
                        st.warning("No formal DP guarantee (DP-SGD-S with a non-private quantile).")
                    st.dataframe(_plan_frame(p), hide_index=True, width="stretch")

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
current = st.query_params.get("group")
if current not in groups:
    active = [r["group_id"] for r in runs_all if r["group_id"] and ui.is_active(r)]
    current = active[0] if active else (groups[0] if groups else None)

if current is None:
    st.info("No runs yet: launch a comparison above. Runs keep going in the background when you close the tab.")
    st.stop()


def _group_label(g: str) -> str:
    members = [r for r in runs_all if r["group_id"] == g]
    algos_ = ", ".join(algorithm_label(r["algorithm"]) for r in sorted(members, key=lambda r: r["id"]))
    return f"{g} — {algos_}"


h1, h2 = st.columns([3, 1])
h1.subheader("Live view")


def _on_pick() -> None:
    st.query_params["group"] = st.session_state["group_pick"]


if st.session_state.get("group_pick") != current:
    st.session_state["group_pick"] = current  # the URL (or a new launch) decides which comparison is shown
h2.selectbox("Comparison", groups, format_func=_group_label, key="group_pick", label_visibility="collapsed",
             on_change=_on_pick)
mid_layout = h2.segmented_control("MID layout", ["facet", "overlay"], default="facet", key="mid_layout",
                                  bind="query-params", label_visibility="collapsed")
any_active = any(ui.is_active(r) for r in runs_all if r["group_id"] == current)


def _records(runs: list[dict]) -> list[dict]:
    """Run records with their evaluations, fetched incrementally (only new evaluations each refresh)."""
    cache = st.session_state.setdefault("evals", {})
    out = []
    for run in runs:
        have = cache.get(run["id"], [])
        last = have[-1]["step"] if have else -1
        new = store.eval_metrics(run["id"], after_step=last)
        if new:
            have = have + new
            cache[run["id"]] = have
        out.append(dict(run, evals=have))
    return out


@st.fragment(run_every=ui.LIVE_INTERVAL if any_active else None)
def live(group: str) -> None:
    runs = sorted(store.list_runs(group_id=group), key=lambda r: r["id"])
    active_now = any(ui.is_active(r) for r in runs)
    with st.container(key="live-status"):
        for run in runs:
            c1, c2, c3 = st.columns([6, 1.3, 1], vertical_alignment="center")
            total = run["total_steps"] or 0
            step = run["step"] or 0
            label = run_label(run)
            note = dp_note(run)
            if run["status"] == "queued":
                pos = mgr.queue_position(run["id"])
                text = f"{label} — queued" + (f" (#{pos} in the queue)" if pos else "")
            elif run["status"] == "running" and not total:
                text = f"{label} — starting…"
            else:
                eta = eta_seconds(run)
                text = f"{label} — step {step}/{total or '?'}" + (f" · ETA {ui.fmt_seconds(eta)}" if eta is not None else "")
            if note:
                text += f" · ⚠ {note}"
            c1.progress(min(1.0, step / total) if total else 0.0, text=ui.md(text))
            with c2:
                ui.status_badge(run["status"])
            if ui.is_active(run):
                if c3.button("Cancel", key=f"cancel-{run['id']}", icon=":material/stop_circle:"):
                    mgr.cancel(run["id"])
                    st.rerun(scope="fragment")
            if run["status"] in ("failed", "interrupted", "cancelled") and run.get("error"):
                c1.caption(ui.md(f"{run['status']}: {run['error']}"))
    records = _records(runs)
    theme = ui.plot_theme()
    sig = (group, theme, mid_layout, tuple((r["id"], r["status"], len(r["evals"])) for r in records))
    cached = st.session_state.get("live-figures")
    if cached is not None and cached[0] == sig:
        specs = cached[1]  # nothing new: resend the same figures (the browser does not redraw them)
    else:
        specs = {s.name: s for s in build_figures(records, theme=theme, names=LIVE_FIGURES,
                                                        mid_layout=mid_layout or "facet")}
        st.session_state["live-figures"] = (sig, specs)
    ui.chart(specs["mid_curves"], key="live-mid", export_key="x-mid")
    ui.chart(specs["tier_recall"], key="live-tier-recall", export_key="x-tier")
    c1, c2 = st.columns(2)
    with c1:
        ui.chart(specs["accuracy"], key="live-accuracy", export_key="x-acc")
    with c2:
        ui.chart(specs["epsilon_spent"], key="live-epsilon", export_key="x-eps")
    ui.chart(specs["class_recall"], key="live-class-recall", export_key="x-class")
    if any_active and not active_now:
        st.rerun()  # all done: one full rerun stops the polling


live(current)
