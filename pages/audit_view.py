"""Audit: PA-ALOOA group privacy risk — configure, launch in the background, watch, cancel/resume, and
read GPR per group, the Δ table, accuracy, per-tier ε lower bounds, LiRA ROC and advantage histograms."""
from __future__ import annotations

import io
import json
import time

import numpy as np
import pandas as pd
import streamlit as st

from engine.figures.audit import build_audit_figures
from engine.audit.config import AUDIT_MODELS, THRESHOLDS, AuditConfig
from engine.audit.runner import load_array, preview_audit
from engine.config import AlgorithmConfig, ConfigError, TiersConfig
from engine.data import DATASETS, DataError, dataset_names
from engine.jobs import eta_seconds
from engine.tiers import preset, preset_names
from pages import _common as ui

DEFAULT_ALGOS = ["idp_sample", "ino", "dpsgd_s", "dpsgd", "nonprivate"]

st.title("Privacy audit")
ui.intro()
st.caption("**PA-ALOOA**: for r = 1..R the training set is split into two random halves and one model is trained on "
           "each, so every sample is a member of exactly R of the 2R models. A sample's **advantage** is the best "
           "TPR − FPR of the rule *member if −loss ≥ t* over those models; a group's **GPR** is the mean "
           "advantage "
           "of its samples and **Δ** the gap between the riskiest and the safest group (percentage points). The "
           "dashed **null floor** is the same estimator on shuffled membership labels: bars near it show no "
           "measurable leakage.")


@st.cache_data(show_spinner=False, max_entries=64)
def _preview(config_json: str) -> dict:
    return preview_audit(AuditConfig.from_json(config_json))


mgr = ui.manager()
store = mgr.store
errors: list[str] = []

# --- configuration --------------------------------------------------------------------------------------------
names = dataset_names()
left, right = st.columns([3, 2], gap="large")
with left:
    st.subheader("Data, model and groups")
    c1, c2, c3 = st.columns(3)
    dataset_name = c1.selectbox("Dataset", names, index=names.index("adult"), key="a_dataset", bind="query-params",
                                format_func=lambda n: n if DATASETS[n].is_available() else f"{n} (files missing)",
                                help="Adult (sex as the sensitive attribute) ships with the lab and works offline")
    max_train = c2.number_input("Training samples (0 = all)", min_value=0, value=0, step=500, key="a_max_train",
                                bind="query-params")
    model = c3.selectbox("Model", AUDIT_MODELS, key="a_model", bind="query-params",
                         help="lr: logistic regression, mlp: one tanh hidden layer, cnn: the Papernot CNN (images)")
    dataset = None
    try:
        dataset = ui.dataset(dataset_name, int(max_train) or None)
    except (DataError, ConfigError) as e:
        errors.append(str(e))
        ui.show_error(e)
    group_options = ["attribute", "class", "tier"]
    if dataset is not None and not dataset.sensitive_train:
        group_options = ["class", "tier"]
    c1, c2, c3 = st.columns(3)
    group_by = c1.selectbox("Groups (GPR per …)", group_options, key="a_group_by",
                            help="attribute: a sensitive attribute's values (e.g. sex); class: the label; "
                                 "tier: the privacy tiers below")
    attrs = sorted(dataset.sensitive_train) if dataset is not None else []
    attribute = None
    if group_by == "attribute" and attrs:
        default_attr = dataset.default_sensitive if dataset.default_sensitive in attrs else attrs[0]
        attribute = c2.selectbox("Attribute", attrs, index=attrs.index(default_attr), key="a_attr")
    tier_mode = c3.selectbox("Privacy tiers", ["single ε"] + (preset_names(dataset) if dataset is not None else []),
                             key="a_tiers", help="single ε: everyone shares one budget; presets come from the engine")
    tiers_cfg: TiersConfig | None = None
    epsilon = 10.0
    if tier_mode == "single ε":
        epsilon = st.number_input("ε (all samples)", min_value=0.01, value=10.0, step=0.5, key="a_eps",
                                  bind="query-params")
    elif dataset is not None:
        try:
            base = preset(tier_mode, dataset)
            if base.assign in ("class", "attribute", "random"):
                table = ui.tiers_to_rows(base, dataset)
                edited = st.data_editor(table, key=f"a-tier-editor-{dataset_name}-{tier_mode}", hide_index=True,
                                        disabled=[c for c in ("class", "name", "value") if c in table.columns],
                                        height="auto")
                tiers_cfg = ui.rows_to_tiers(edited, base)
            else:
                tiers_cfg = base
            tiers_cfg.validate()
        except ConfigError as e:
            errors.append(str(e))
            ui.show_error(e)
            tiers_cfg = None

with right:
    st.subheader("Algorithms and audit")
    algos = st.multiselect("Algorithms to compare", ui.algorithm_options(), default=DEFAULT_ALGOS,
                           format_func=ui.algo_label, key="a_algos", bind="query-params",
                           help="Non-private SGD is the reference; DP-SGD-S clips per audit group")
    c1, c2, c3 = st.columns(3)
    R = c1.number_input("R (2R models each)", min_value=2, max_value=2000, value=16, step=2, key="a_R",
                        bind="query-params", help="The design uses R = 200 (400 models); small R is quicker but "
                                                  "raises the in-sample null floor")
    threshold = c2.selectbox("Thresholds", THRESHOLDS, key="a_threshold", bind="query-params",
                             help="in_sample: the design's estimator (optimistic by the null floor); held_out: "
                                  "chosen on half of the models, scored on the other half (unbiased, noisier)")
    looa_k = c3.number_input("PA-LOOA records", min_value=0, max_value=20, value=2, step=1, key="a_looa",
                             bind="query-params",
                             help="Baseline: records audited one at a time with dedicated models")
    with st.expander("Training", expanded=False):
        c1, c2, c3 = st.columns(3)
        epochs = c1.number_input("Epochs", min_value=0.1, value=2.0, step=0.5, key="a_epochs", bind="query-params")
        batch = c2.number_input("Batch size", min_value=1, value=256, step=16, key="a_batch", bind="query-params")
        lr = c3.number_input("Learning rate", min_value=0.0001, value=1.0, step=0.1, format="%.4g", key="a_lr",
                             bind="query-params")
        c1, c2, c3 = st.columns(3)
        delta = c1.number_input("δ", min_value=1e-12, max_value=0.5, value=1e-5, format="%.1e", key="a_delta",
                                bind="query-params")
        clip = c2.number_input("Clip norm C", min_value=0.001, value=1.0, step=0.1, key="a_clip", bind="query-params")
        seed = c3.number_input("Seed", min_value=0, value=0, step=1, key="a_seed", bind="query-params")
        c1, c2 = st.columns(2)
        n_boot = c1.number_input("Bootstrap resamples", min_value=10, max_value=100000, value=1000, step=100,
                                 key="a_boot")
        tail_pct = c2.slider("INO tail γ, % of expected batch clip mass", 1, 100, 50, key="a_tail")

config: AuditConfig | None = None
if not algos:
    st.info("Choose at least one algorithm.")
elif not errors:
    try:
        algo_cfgs = []
        for a in algos:
            kw = {"name": a}
            if a == "ino":
                kw["tail_fraction"] = tail_pct / 100.0
            if a == "dpsgd_s":
                kw["group_by"] = group_by  # DP-SGD-S clips per audit group
            algo_cfgs.append(AlgorithmConfig(**kw))
        config = AuditConfig(dataset=dataset_name, max_train=int(max_train) or None, model=model, tiers=tiers_cfg,
                             epsilon=float(epsilon), group_by=group_by, group_attribute=attribute,
                             algorithms=tuple(algo_cfgs), R=int(R), epochs=float(epochs), batch_size=int(batch),
                             lr=float(lr), delta=float(delta), clip_norm=float(clip), seed=int(seed),
                             threshold=threshold, n_boot=int(n_boot), looa_k=int(looa_k)).validate()
    except ConfigError as e:
        errors.append(str(e))
        ui.show_error(e)
        config = None

preview = None
if config is not None:
    try:
        with st.spinner("Planning…"):
            preview = _preview(config.to_json())
    except (ConfigError, DataError) as e:
        errors.append(str(e))
        ui.show_error(e)
if preview is not None:
    with st.expander(f"Plan: {len(preview['algorithms'])} × {preview['n_models']} models of "
                     f"{preview['steps_per_model']} steps on {preview['n_train']} samples"
                     + (f" + {preview['looa_models']} PA-LOOA models each" if preview["looa_models"] else ""),
                     expanded=False):
        sizes = ", ".join(f"{g}: {n}" for g, n in preview["group_sizes"].items())
        st.caption(f"Groups — {sizes} · trained {preview['chunk_models']} models at a time on {preview['device']}")
        rows = []
        for a in preview["algorithms"]:
            for t in a["plan"] or [{"tier": "—"}]:
                rows.append({"algorithm": a["label"], "tier": t["tier"], "q": t.get("sample_rate"),
                             "C": t.get("clip_norm"), "σ": t.get("noise_multiplier"), "ε claimed": t.get("epsilon"),
                             "formal DP": "yes" if a["formal_dp"] else "no"})
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")

launch = st.button("Launch audit", type="primary", key="a_launch", icon=":material/policy:",
                   disabled=bool(errors) or preview is None)
if launch and config is not None:
    (run_id,) = mgr.submit([config], kind="audit", names=[f"audit {dataset_name}"])
    st.query_params["audit"] = str(run_id)

# --- runs -----------------------------------------------------------------------------------------------------------
st.divider()
audits = store.list_runs(kind="audit")
if not audits:
    st.info("No audits yet: launch one above. Audits keep running in the background when you close the tab.")
    st.stop()
by_id = {r["id"]: r for r in audits}
current = st.query_params.get("audit")
try:
    current = int(current) if current is not None else None
except ValueError:
    current = None
if current not in by_id:
    active = [r["id"] for r in audits if ui.is_active(r)]
    current = active[0] if active else audits[0]["id"]


def _label(i: int) -> str:
    # no status here: it changes while the page shows it (the badge below is live)
    r = by_id[i]
    cfg = r.get("config") or {}
    algos = ", ".join(a["name"] if isinstance(a, dict) else str(a) for a in cfg.get("algorithms") or [])
    when = time.strftime("%m-%d %H:%M", time.localtime(r.get("created_at") or 0))
    return f"#{i} · {cfg.get('dataset', '?')} · R={cfg.get('R', '?')} · {algos} · {when}"


def _on_pick() -> None:
    st.query_params["audit"] = str(st.session_state["a_pick"])


if st.session_state.get("a_pick") != current:
    st.session_state["a_pick"] = current
st.selectbox("Audit", list(by_id), format_func=_label, key="a_pick", on_change=_on_pick)
any_active = ui.is_active(by_id[current])


@st.fragment(run_every=ui.LIVE_INTERVAL if any_active else None)
def view(run_id: int) -> None:
    run = store.get_run(run_id)
    if run is None:
        st.warning(f"Audit #{run_id} was deleted.")
        return
    with st.container(key="audit-status"):
        c1, c2, c3 = st.columns([6, 1.3, 1.2], vertical_alignment="center")
        total, step = run["total_steps"] or 0, run["step"] or 0
        if run["status"] == "queued":
            pos = mgr.queue_position(run_id)
            text = "queued" + (f" (#{pos} in the queue)" if pos else "")
        else:
            eta = eta_seconds(run)
            text = f"training step {step}/{total or '?'} (all chunks of all algorithms)"
            if eta is not None:
                text += f" · ETA {ui.fmt_seconds(eta)}"
            if run["status"] == "running" and total and step >= total:
                text = "statistics…"
        c1.progress(min(1.0, step / total) if total else 0.0, text=text)
        with c2:
            ui.status_badge(run["status"])
        if ui.is_active(run):
            if c3.button("Cancel", key=f"a-cancel-{run_id}", icon=":material/stop_circle:"):
                mgr.cancel(run_id)
                st.rerun(scope="fragment")
        elif run["status"] in ("cancelled", "interrupted", "failed"):
            if c3.button("Resume", key=f"a-resume-{run_id}", icon=":material/play_arrow:",
                         help="Continue from the last completed chunk of models"):
                mgr.resume(run_id)
                st.rerun()
        if run.get("error") and run["status"] in ("failed", "interrupted", "cancelled"):
            c1.caption(f"{run['status']}: {ui.md(run['error'])}")
    results = run.get("summary") or {}
    if not results.get("algorithms"):
        if ui.is_active(run):
            st.caption("The figures appear as soon as the first algorithm's models are trained and analysed.")
        return
    if results.get("partial"):
        done = ", ".join(a["label"] for a in results["algorithms"])
        st.caption(f"Partial results (done: {done}); the rest is still training.")
    theme = ui.plot_theme()
    sig = (run_id, theme, len(results["algorithms"]), bool(results.get("partial")))
    cached = st.session_state.get("audit-figures")
    if cached is not None and cached[0] == sig:
        specs = cached[1]
    else:
        specs = {s.name: s for s in build_audit_figures(results, theme=theme)}
        st.session_state["audit-figures"] = (sig, specs)
    ui.chart(specs["gpr_bars"], key="audit-gpr", export_key="ax-gpr")
    c1, c2 = st.columns([3, 2])
    with c1:
        ui.chart(specs["delta_table"], key="audit-delta", export_key="ax-delta")
    with c2:
        ui.chart(specs["accuracy"], key="audit-accuracy", export_key="ax-acc")
    ui.chart(specs["epsilon_bounds"], key="audit-eps", export_key="ax-eps")
    ui.chart(specs["lira_roc"], key="audit-lira", export_key="ax-lira")
    ui.chart(specs["advantage_hist"], key="audit-hist", export_key="ax-hist")
    with st.expander("Baselines (PA-GA, PA-GBA, PA-LOOA)", expanded=False):
        ui.chart(specs["baselines"], key="audit-baselines", export_key="ax-base")
    c1, c2 = st.columns(2)
    c1.download_button("Results (JSON)", data=json.dumps(results, indent=2, sort_keys=True).encode("utf-8"),
                       file_name=f"audit-{run_id}.json", mime="application/json", key=f"a-json-{run_id}",
                       on_click="ignore", icon=":material/download:")
    keys = [a["key"] for a in results["algorithms"]]
    c2.download_button("Per-sample advantages (CSV)", data=lambda: _advantages_csv(run_id, keys),
                       file_name=f"audit-{run_id}-advantages.csv", mime="text/csv", key=f"a-csv-{run_id}",
                       on_click="ignore", icon=":material/download:")
    if any_active and not ui.is_active(run):
        st.rerun()  # finished: one full rerun stops the polling


def _advantages_csv(run_id: int, keys: list[str]) -> bytes:
    cols = {}
    for k in keys:
        blob = store.get_artifact(run_id, f"advantage/{k}")
        if blob is not None:
            cols[f"advantage_{k}"] = load_array(blob)
    df = pd.DataFrame(cols)
    df.insert(0, "sample", np.arange(len(df)))
    buf = io.StringIO()
    df.to_csv(buf, index=False)
    return buf.getvalue().encode("utf-8")


view(current)
