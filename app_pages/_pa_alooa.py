"""The Audit page's PA-ALOOA section: group privacy risk — configure (field by field or a named preset), launch
through the page's job manager (kind "audit"), watch, cancel/resume, and read the verdict, GPR per group, the Δ
table, accuracy, per-tier ε lower bounds, LiRA ROC and advantage histograms. Compute and figures live in the engine
(``engine.audit``, ``engine.figures.audit``); this module only lays them out.

(Helper modules of app_pages/ start with "_": app.py's navigation names the pages, these never are.)
"""
from __future__ import annotations

import streamlit as st

from app_pages import _charts as charts
from app_pages import _handles as handles
from app_pages import _plans as plans
from app_pages import _status as status
from app_pages import _widgets as widgets
from app_pages._look import md, plot_theme, show_error
from app_pages._tiers import tier_editor
from engine.audit.pa_alooa.config import AUDIT_MODELS, DEFAULT_RUN, SCORES, THRESHOLDS, AuditConfig
from engine.audit.pa_alooa.frames import ACCURACY_VS_DPSGD
from engine.audit.pa_alooa.presets import PRESETS, describe, settings
from engine.audit.pa_alooa.report import as_report
from engine.audit.pa_alooa.stats import DELTA_METHOD, DELTA_METHOD_SHORT
from engine.audit.pa_alooa.verdict import verdict_lines
from engine.config.run import AlgorithmConfig, TiersConfig
from engine.config.schema import ConfigError
from engine.data import DATASETS, dataset_names
from engine.dp.tiers import preset, preset_names
from engine.figures import export
from engine.figures.audit import build_audit_figures
from engine.jobs.runs import algorithm_label

DEFAULT_ALGOS = ["idp_sample", "ino", "dpsgd_s", "dpsgd"]  # on tiered ε, so IDP-SGD differs from DP-SGD
CUSTOM = "custom (the settings below)"
PRESETS_HELP = ("Named audits from the engine (engine/audit/pa_alooa/presets.py): quick (digits LR, seconds to a minute) and "
                "quick-eps1 show non-private > DP-SGD ε = 10 > DP-SGD ε = 1; adult-paper and mnist-paper follow the "
                "papers' training (20 epochs, lr 0.1, C 5, 2R = 400)")
AUDIT_EXPLAINER = ("**PA-ALOOA**: for r = 1..R the training set is split into two random halves and one model is trained on each, "
                   "so every sample is a member of exactly R of the 2R models. A sample's **advantage** is the best TPR − FPR of "
                   "the rule *member if score ≥ t* over those models (score: the logit-scaled confidence of the true class, "
                   "log p_y − log(1 − p_y), in float64); a group's **GPR** is the mean advantage of its samples and "
                   "**Δ** the gap between the riskiest and the safest group (percentage points). The tick on each bar is that "
                   "group's **null floor**, the same estimator on shuffled membership labels: bars near it show no measurable "
                   "leakage. Δ is *not resolved* when its CI reaches the spread of Δ under shuffled labels. "
                   + md(DELTA_METHOD) + ".")  # the engine's words, escaped (Δ* is not emphasis)


def null_floor_warning(report) -> None:
    """Say in words when every bar sits at its null floor (the audit measured no leakage)."""
    at_floor = report.at_null_floor()
    if at_floor:
        st.warning("Every bar sits at its null floor: this audit measures no membership leakage for "
                   f"{', '.join(at_floor)} (each group's GPR CI reaches its floor under shuffled labels). Train models "
                   "that fit their half more closely (more epochs, fewer samples, a larger model), raise R, or start "
                   "from the quick preset.")


COMPARISON_COLUMNS = {
    "comparison": st.column_config.TextColumn("DP-SGD-S −", width="medium"),
    "quantity": st.column_config.TextColumn("difference", help="Δ and GPR in percentage points; accuracy in points"),
    "value": st.column_config.NumberColumn("a − b", format="%+.2f"),
    "low": st.column_config.NumberColumn("CI low (paired)", format="%+.2f"),
    "high": st.column_config.NumberColumn("CI high (paired)", format="%+.2f"),
    "unpaired": st.column_config.TextColumn("unpaired CI", help="what two independent CIs side by side imply"),
    "answer": st.column_config.TextColumn("resolved?", help="the paired CI excludes 0"),
}


def delta_columns(report) -> dict:
    """Column formats of the Δ table (``engine.audit.pa_alooa.frames.delta_frame``), one for every column it has: the
    table shows these columns only, in this order (``column_order``), each wide enough for its header."""
    def num(label, fmt, help=None):
        # the header is the widest cell of a number column: size it to the header, never below "small"
        return st.column_config.NumberColumn(label, format=fmt, help=help, width=max(80, 7 * len(label) + 36))

    cols = {"algorithm": st.column_config.TextColumn("algorithm", width="medium"),
            "Δ (pp)": num("Δ (pp)", "%.2f", "(max − min GPR) × 100, percentage points, "
                          + (DELTA_METHOD_SHORT if report.delta_bias_corrected else "the plug-in (an older audit)")),
            "Δ CI low": num("Δ CI low", "%.2f"), "Δ CI high": num("Δ CI high", "%.2f"),
            "null Δ low": num("null Δ low", "%.2f", "Δ under shuffled membership labels: the spread's low end"),
            "null Δ high": num("null Δ high", "%.2f", "Δ under shuffled membership labels: the spread's high end"),
            "resolved": st.column_config.TextColumn("Δ resolved?", width=120,
                                                    help="Δ's CI lies above the null Δ spread"),
            "accuracy": num("accuracy", "%.4f", "mean test accuracy over the models"),
            "null floor": num("null floor", "%.4f", "GPR under shuffled membership labels (all groups)"),
            "formal DP": st.column_config.TextColumn("formal DP", width=100),
            "claimed ε": st.column_config.TextColumn("claimed ε", width=110, help="per tier; empty: no guarantee"),
            **{f"GPR {g}": num(f"GPR {g}", "%.4f") for g in report.group_names}}
    if report.comparisons:
        cols[ACCURACY_VS_DPSGD] = num(ACCURACY_VS_DPSGD, "%+.2f", "DP-SGD-S's test accuracy minus DP-SGD's, paired "
                                      "over models: below 0, DP-SGD-S is less accurate")
        cols["noise × DP-SGD"] = num("noise × DP-SGD", "%.2f", "DP-SGD-S's realised noise / DP-SGD's at the same ε")
    return cols


def delta_table(report) -> None:
    """The Δ table: full width, every column formatted and labelled, no index."""
    df = report.delta_frame()
    cols = delta_columns(report)
    st.dataframe(df, hide_index=True, width="stretch", column_config=cols,
                 column_order=[c for c in cols if c in df.columns])


def preset_settings(config):
    """A preset's settings as the table the page shows in place of the form."""
    import pandas as pd

    return pd.DataFrame(settings(config), columns=["setting", "value"])


def show_verdict(report) -> None:
    """The audit's answer in words, above the figures: the Δ ranking as the headline, the rest as a list."""
    verdict = verdict_lines(report)
    if not verdict:
        return
    with st.container(key="audit-verdict", border=True):
        st.markdown(f"**Verdict:** {md(verdict[0])}")
        if verdict[1:]:
            st.markdown("\n".join(f"- {md(line)}" for line in verdict[1:]))


def comparison_table(report):
    """The paired comparisons as the page shows them (engine.audit.pa_alooa.frames.comparison_frame, formatted)."""
    df = report.comparison_frame()
    out = df.assign(comparison=df["b_label"],
                    quantity=df["quantity"].where(df["group"].isna(), "GPR " + df["group"].astype(str)),
                    unpaired=[f"[{lo:+.2f}, {hi:+.2f}]" if lo == lo else "" for lo, hi in
                              zip(df["unpaired_low"], df["unpaired_high"])],
                    answer=[("lower" if h < 0 else "higher") if r else "not resolved" for r, h in
                            zip(df["resolved"], df["high"])])
    return out[list(COMPARISON_COLUMNS)]


def audit_downloads(run: dict, report, store) -> None:
    """The audit's results (JSON, as stored) and per-sample advantages (CSV) as downloads."""
    rid, keys = run["id"], [a.key for a in report.algorithms]
    c1, c2 = st.columns(2)
    c1.download_button("Results (JSON)", data=export.results_json(run["summary"]), file_name=f"audit-{rid}.json",
                       mime="application/json", key=f"a-json-{rid}", on_click="ignore", icon=":material/download:")
    c2.download_button("Per-sample advantages (CSV)", data=lambda: export.audit_advantages_csv(store, rid, keys),
                       file_name=f"audit-{rid}-advantages.csv", mime="text/csv", key=f"a-csv-{rid}",
                       on_click="ignore", icon=":material/download:")


def page(mgr, store, url) -> None:
    """The PA-ALOOA section: the form (or a preset's settings), Launch, and the chosen audit (live while it runs).
    The fields not bound to the URL keep their values while a preset or the other section is shown
    (``widgets.KEEP``, ``tier_editor(resume=True)``)."""
    st.caption(AUDIT_EXPLAINER)
    errors: list[str] = []

    # --- configuration --------------------------------------------------------------------------------------------
    preset_name = st.selectbox("Audit preset", [CUSTOM, *PRESETS], key="a_preset", persist_state=widgets.KEEP,
                               help=PRESETS_HELP)
    names = dataset_names()
    chosen = PRESETS.get(preset_name)
    if chosen is None:  # custom: the form's fields are what runs
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
            dataset = handles.dataset_or_error(dataset_name, max_train, errors)
            group_options = ["attribute", "class", "tier"]
            if dataset is not None and not dataset.sensitive_train:
                group_options = ["class", "tier"]
            c1, c2, c3 = st.columns(3)
            group_by = c1.selectbox("Groups (GPR per …)", group_options, key="a_group_by", persist_state=widgets.KEEP,
                                    help="attribute: a sensitive attribute's values (e.g. sex); class: the label; "
                                         "tier: the privacy tiers below")
            attrs = sorted(dataset.sensitive_train) if dataset is not None else []
            attribute = None
            if group_by == "attribute" and attrs:
                default_attr = dataset.default_sensitive if dataset.default_sensitive in attrs else attrs[0]
                attribute = c2.selectbox("Attribute", attrs, index=attrs.index(default_attr), key="a_attr",
                                         persist_state=widgets.KEEP)
            tier_modes = ["single ε"] + [n for n in (preset_names(dataset) if dataset is not None else []) if n != "single"]
            tier_mode = c3.selectbox("Privacy tiers", tier_modes, index=min(1, len(tier_modes) - 1), key="a_tiers",
                                     persist_state=widgets.KEEP,
                                     help="single ε: everyone shares one budget (then IDP-SGD is DP-SGD); tiered presets come "
                                          "from the engine")
            tiers_cfg: TiersConfig | None = None
            epsilon = 10.0
            if tier_mode == "single ε":
                epsilon = st.number_input("ε (all samples)", min_value=0.01, value=10.0, step=0.5, key="a_eps",
                                          bind="query-params")
            elif dataset is not None:
                try:
                    tiers_cfg = tier_editor(preset(tier_mode, dataset), dataset,
                                            key=f"a-tier-editor-{dataset_name}-{tier_mode}", resume=True)
                except ConfigError as e:
                    errors.append(str(e))
                    show_error(e)
                    tiers_cfg = None

        with right:
            st.subheader("Algorithms and audit")
            algos = st.multiselect("Algorithms to compare", widgets.ALGORITHM_CHOICES, default=DEFAULT_ALGOS,
                                   format_func=algorithm_label, key="a_algos", bind="query-params", wrap=True,
                                   help="Non-private SGD is the reference; DP-SGD-S clips per audit group")
            add_controls = st.toggle(
                "Add DP-SGD-S controls", key="a_controls", bind="query-params",
                help="DP-SGD at the noise DP-SGD-S realises (noise-matched, a lower ε) and at the ε where DP-SGD's accuracy "
                     "equals DP-SGD-S's (accuracy-matched), audited on the same splits: Δ and GPR differences get paired "
                     "CIs, and the verdict says whether DP-SGD-S lowers Δ beyond what its extra noise explains. Needs "
                     "DP-SGD-S and DP-SGD among the algorithms; adds two algorithms' worth of models and a short ε search.")
            c1, c2, c3 = st.columns(3)
            R = c1.number_input("R (2R models each)", min_value=2, max_value=2000, value=50, step=2, key="a_R",
                                bind="query-params", help="The design uses R = 200 (400 models); small R is quicker but "
                                                          "noisier (wider CIs, a wider null Δ spread)")
            threshold = c2.selectbox("Thresholds", THRESHOLDS, index=THRESHOLDS.index("held_out"), key="a_threshold",
                                     bind="query-params",
                                     help="held_out: chosen on half of the models, scored on the other half (unbiased); "
                                          "in_sample: the design's estimator (optimistic by the null floor)")
            looa_k = c3.number_input("PA-LOOA records", min_value=0, max_value=20, value=2, step=1, key="a_looa",
                                     bind="query-params",
                                     help="Baseline: records audited one at a time with dedicated models")
            with st.expander("Training", expanded=False):
                train = widgets.training_inputs("a_", epochs=2.0, batch=256, batch_step=16, lr=1.0, lr_step=0.1)
                c1, c2, c3 = st.columns(3)
                n_boot = c1.number_input("Bootstrap resamples", min_value=10, max_value=100000, value=1000, step=100,
                                         key="a_boot", persist_state=widgets.KEEP)
                score = c3.selectbox("Score", SCORES, key="a_score", persist_state=widgets.KEEP,
                                     help="logit_confidence: log p_y − log(1 − p_y) (LiRA's score; ties are rare); loss: "
                                          "−cross-entropy (both float64)")
                tail_pct = c2.slider("INO tail γ, % of expected batch clip mass", 1, 100, 50, key="a_tail",
                                     persist_state=widgets.KEEP)
    else:  # a preset: its settings in place of the form's fields (what the page shows is what runs); the fields keep
        # their values meanwhile (widgets.KEEP, tier_editor(resume=True)): back on custom, the form is as the user left it
        with st.container(key="a-preset-settings"):
            st.info(md(f"Preset {preset_name} runs {describe(chosen)}."), icon=":material/tune:")
            st.dataframe(preset_settings(chosen), hide_index=True, width="stretch", column_config={
                "setting": st.column_config.TextColumn("setting", width="medium"),
                "value": st.column_config.TextColumn("value", width="large")})
            st.caption(f"Choose “{CUSTOM}” above to set an audit up field by field.")

    config: AuditConfig | None = None
    if chosen is not None:
        config = chosen
    elif not algos:
        st.info("Choose at least one algorithm.")
    elif not errors:
        try:
            algo_cfgs = [AlgorithmConfig(name=a, **widgets.algorithm_fields(a, group_by=group_by,  # (clips per group)
                                                                            tail_fraction=tail_pct / 100.0))
                         for a in algos]
            run = DEFAULT_RUN.replace(**{"data.name": dataset_name, "data.max_train": int(max_train) or None,
                                         "model.name": model, "tiers": tiers_cfg, "optimizer.lr": float(train["lr"]),
                                         "epochs": float(train["epochs"]), "batch_size": int(train["batch"]),
                                         "delta": float(train["delta"]), "accountant": str(train["accountant"]),
                                         "clip_norm": float(train["clip"]),
                                         "seed": int(train["seed"])})
            config = AuditConfig(run=run, epsilon=float(epsilon), group_by=group_by, group_attribute=attribute,
                                 algorithms=tuple(algo_cfgs), R=int(R), threshold=threshold, score=score,
                                 n_boot=int(n_boot), controls=bool(add_controls),
                                 looa_k=int(looa_k)).validate()
        except ConfigError as e:
            errors.append(str(e))
            show_error(e)
            config = None

    preview = plans.audit_plan(config, errors)

    launch = st.button("Launch audit", type="primary", key="a_launch", icon=":material/policy:",
                       disabled=bool(errors) or preview is None)
    if launch and config is not None:
        (run_id,) = mgr.submit([config], kind="audit",
                               names=[config.name or f"audit {config.run.data.name}"])
        st.query_params["audit"] = str(run_id)

    # --- runs -----------------------------------------------------------------------------------------------------------
    st.divider()
    audits = store.list_runs(kind="audit")
    any_active = False
    # the run goes on to its end, never st.stop(): Streamlit keeps the state of the widgets a stopped run did not draw,
    # so a tier table hidden behind a preset came back drawn from its start while the page read the old edits
    if not audits:
        url.check()
        st.info("No audits yet: launch one above. Audits keep running in the background when you close the tab.")
    else:
        by_id = {r["id"]: r for r in audits}
        active = [r["id"] for r in audits if status.is_active(r)]
        current = widgets.run_picker("Audit", list(by_id), key="a_pick", param="audit", default=(active or list(by_id))[0],
                                     format_func=lambda i: widgets.audit_label(by_id[i]), url=url, cast=int)
        url.check()  # every URL-bound widget has run: warn about the values Streamlit dropped
        any_active = status.is_active(by_id[current])


    @st.fragment(run_every=status.LIVE_INTERVAL if any_active else None)
    def view(run_id: int) -> None:
        run = store.get_run(run_id)
        if run is None:
            st.warning(f"Audit #{run_id} was deleted.")
            return
        with st.container(key="audit-status"):
            status.kind_status_row(run, mgr)
        report = as_report(run["summary"]) if run.get("summary") else None
        if report is None or not report.algorithms:
            if status.is_active(run):
                st.caption("The figures appear as soon as the first algorithm's models are trained and analysed.")
            return
        if report.partial:
            st.caption(md(f"Partial results (done: {', '.join(a.label for a in report.algorithms)}); "
                             "the rest is still training."))
        show_verdict(report)  # the answer first, in words
        null_floor_warning(report)
        theme = plot_theme()
        sig = (run_id, theme, len(report.algorithms), report.partial)
        specs = charts.cached_figures("audit-figures", sig, lambda: build_audit_figures(report, theme=theme))
        charts.chart(specs["gpr_bars"], key="audit-gpr", export_key="ax-gpr")
        with st.container(key="audit-delta-table"):  # full width, formatted (the figure version exports with the rest)
            delta_table(report)
        charts.chart(specs["accuracy"], key="audit-accuracy", export_key="ax-acc")
        charts.chart(specs["epsilon_bounds"], key="audit-eps", export_key="ax-eps")
        charts.chart(specs["lira_roc"], key="audit-lira", export_key="ax-lira")
        charts.chart(specs["advantage_hist"], key="audit-hist", export_key="ax-hist")
        if report.comparisons:
            charts.chart(specs["paired_differences"], key="audit-paired", export_key="ax-paired")
            with st.container(key="audit-comparisons"):
                st.dataframe(comparison_table(report), hide_index=True, width="stretch",
                             column_config=COMPARISON_COLUMNS)
        with st.expander("Baselines (PA-GA, PA-GBA, PA-LOOA)", expanded=False):
            charts.chart(specs["baselines"], key="audit-baselines", export_key="ax-base")
        audit_downloads(run, report, store)
        if any_active and not status.is_active(run):
            st.rerun()  # finished: one full rerun stops the polling


    if audits:
        view(current)
