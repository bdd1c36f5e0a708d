"""The Audit page's one-run section: per-tier empirical ε̂ from ONE training run per algorithm (Steinke, Nasr &
Jagielski 2023), next to each tier's claimed ε — configure, launch through the page's job manager (kind
"one_run"), watch, and read the figure, the table and a sentence per algorithm. Compute and the figure live in
the engine (``engine.audit.one_run*``, ``engine.figures.one_run``); this module only lays them out.

(Helper modules of app_pages/ start with "_": app.py's navigation names the pages, these never are.)
"""
from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from app_pages import _charts as charts
from app_pages import _handles as handles
from app_pages import _status as status
from app_pages import _widgets as widgets
from app_pages._look import field_label, md, plot_theme, user_message
from engine.audit.one_run import presets as studies
from engine.audit.one_run.run import preview_one_run
from engine.audit.one_run.config import DEFAULT_ONE_RUN, ONE_RUN_ALGORITHMS, OneRunConfig
from engine.audit.one_run.report import OneRunReport
from engine.config.run import ACCOUNTANTS, AlgorithmConfig
from engine.config.schema import ConfigError
from engine.data import DATASETS, DataError, dataset_names
from engine.dp.accountants import DESCRIPTIONS
from engine.dp.algorithms import ALGORITHM_REGISTRY
from engine.dp.tiers import preset, preset_names
from engine.figures import export
from engine.figures.experiments import COLLUSION_COLUMNS, collusion_sentence
from engine.figures.one_run import build_one_run_figures
from engine.jobs.runs import algorithm_label, run_config

PA_ALOOA, ONE_RUN = "PA-ALOOA audit", "One-run audit (per-tier ε̂)"
SECTIONS = {PA_ALOOA: "pa_alooa", ONE_RUN: "one_run"}  # label → the URL's ?section= value
PARAM = "one_run"  # ?one_run=<id>: the one-run audit shown
FORM = "form"  # the preset picker's first choice: the form's own audit, not a study
# the registry's order, the non-private reference last (it has no ε to audit)
ALGORITHM_CHOICES = sorted(ALGORITHM_REGISTRY, key=lambda name: not ALGORITHM_REGISTRY[name].private)
DEFAULT_ALGOS = [a.name for a in ONE_RUN_ALGORITHMS]
EXPLAINER = ("**One-run audit** (Steinke, Nasr & Jagielski, NeurIPS 2023): each tier gets m canaries, each included in "
             "training with probability ½ and treated as a member of its tier (its sampling rate, its clip). After ONE "
             "run per algorithm the auditor guesses which canaries were in from their scores — white-box: the noisy "
             "updates' projection on each gradient canary (a spare coordinate of its own, so no other sample's "
             "gradient blurs it); black-box: the final model's confidence on mislabeled input "
             "canaries — and turns the correct guesses into **ε̂**, a lower bound on the ε the tier leaks, valid with "
             "confidence 1 − β. ε̂ above a tier's claimed ε means the implementation breaks its promise.")
FIELDS = {"canaries": "Gradient canaries per tier", "input_canaries": "Input canaries per tier", "beta": "β",
          "run.epochs": "Epochs", "algorithms": "Algorithms", "run.tiers": "Privacy tiers",
          "run.batch_size": "Batch size"}
_WORDS = (("input_canaries", "input canaries"), ("canaries (white-box)", "gradient canaries (white-box)"))

TABLE_COLUMNS = {
    "label": st.column_config.TextColumn("algorithm", width="medium"),
    "tier": st.column_config.TextColumn("tier"),
    "kind_label": st.column_config.TextColumn("canaries", help="white-box: gradient canaries, the auditor sees every "
                                                               "noisy update; black-box: input canaries, the final model"),
    "epsilon": st.column_config.NumberColumn("claimed ε", format="%.3g",
                                             help="empty: no formal DP guarantee (ε̂ shown without a claim)"),
    "epsilon_hat": st.column_config.NumberColumn("ε̂ Steinke", format="%.3f",
                                                 help="lower bound by Steinke, Nasr & Jagielski (2023)"),
    "epsilon_hat_fdp": st.column_config.NumberColumn(
        "ε̂ f-DP", format="%.3f", help="lower bound from the same guesses by the f-DP analysis (Mahloujifar, Melis "
                                      "& Chaudhuri 2025); each bound holds at the confidence shown"),
    "ratio": st.column_config.NumberColumn("ε̂ / ε", format="%.2f", help="tightness of Steinke's bound; above 1: broken"),
    "ratio_fdp": st.column_config.NumberColumn("ε̂ f-DP / ε", format="%.2f",
                                               help="tightness of the f-DP bound; above 1: broken"),
    "verdict": st.column_config.TextColumn("verdict", width="medium"),
    "canaries": st.column_config.NumberColumn("m", help="canaries of this tier and kind", format="%d"),
    "guesses": st.column_config.NumberColumn("guesses", help="k₊ + k₋ of the best guess (abstained on the rest)",
                                             format="%d"),
    "correct": st.column_config.NumberColumn("correct", format="%d"),
    "confidence": st.column_config.NumberColumn("confidence", format="%.3f", help="1 − β"),
    "accuracy": st.column_config.NumberColumn("accuracy", format="%.4f",
                                              help="on the test examples not used as canaries"),
}


# --- pure helpers (no Streamlit) ------------------------------------------------------------------------------

def build_config(*, dataset: str, tiers, epochs: float, canaries: int, input_canaries: int, algorithms: list[str],
                 beta: float, accountant: str = "rdp") -> OneRunConfig:
    """The validated one-run audit of the form's values (raises ConfigError naming the field)."""
    if not algorithms:
        raise ConfigError("algorithms", "choose at least one algorithm")
    run = DEFAULT_ONE_RUN.replace(**{"data.name": dataset, "tiers": tiers, "epochs": float(epochs),
                                     "accountant": accountant})
    # DP-SGD-S (an algorithm that clips per group) clips per privacy tier
    algos = tuple(AlgorithmConfig(name=a, **widgets.algorithm_fields(a, group_by="tier")) for a in algorithms)
    return OneRunConfig(run=run, algorithms=algos,
                        canaries=int(canaries), input_canaries=int(input_canaries), beta=float(beta)).validate()


def error_words(e: Exception) -> str:
    """An engine error of the one-run form in the form's words: "Gradient canaries per tier: …"."""
    field, message = getattr(e, "field", None), getattr(e, "message", None)
    if field is None or message is None:
        return user_message(str(e))
    for key, words in _WORDS:
        message = message.replace(key, words)
    label = FIELDS.get(field) or field_label(field.removeprefix("run."))
    return f"{label}: {user_message(message)}"


def table(report: OneRunReport) -> pd.DataFrame:
    """The report's tidy frame as the page shows it: the columns of :data:`TABLE_COLUMNS`, the report's verdict
    in words per row."""
    f = report.frame()
    return f.assign(epsilon=pd.to_numeric(f["epsilon"]), ratio=pd.to_numeric(f["ratio"]),
                    ratio_fdp=pd.to_numeric(f["ratio_fdp"]))[list(TABLE_COLUMNS)]


def run_words(run: dict) -> str:
    """A one-run audit for the picker: id, dataset, algorithms, canaries, when."""
    when = time.strftime("%m-%d %H:%M", time.localtime(run.get("created_at") or 0))
    cfg = run_config(run)
    if not isinstance(cfg, OneRunConfig):
        return f"#{run['id']} · (unreadable config) · {when}"
    return (f"#{run['id']} · {cfg.run.data.name} · {', '.join(a.name for a in cfg.algorithms)} · "
            f"{cfg.canaries}+{cfg.input_canaries} canaries/tier · {when}")


def section_picker() -> str:
    """PA-ALOOA or one-run: a horizontal radio, remembered in the URL as ``?section=`` (a link to a one-run
    audit, ``?one_run=<id>``, opens its section)."""
    wanted = st.query_params.get("section")
    default = ONE_RUN if wanted == SECTIONS[ONE_RUN] or (wanted is None and PARAM in st.query_params) else PA_ALOOA

    def _on_change() -> None:
        st.query_params["section"] = SECTIONS[st.session_state["a_section"]]

    if "a_section" not in st.session_state:
        st.session_state["a_section"] = default
    return st.radio("Audit", list(SECTIONS), key="a_section", horizontal=True, label_visibility="collapsed",
                    on_change=_on_change)


@st.cache_data(show_spinner=False, max_entries=64)
def _preview(config_json: str) -> dict:
    return preview_one_run(OneRunConfig.from_json(config_json))


def _form(errors: list[str]) -> OneRunConfig | None:
    """The one-run form; its fields keep their values while the PA-ALOOA section is shown (``widgets.KEEP``)."""
    names = dataset_names()
    left, right = st.columns([3, 2], gap="large")
    with left:
        st.subheader("Data and tiers")
        c1, c2 = st.columns(2)
        dataset_name = c1.selectbox("Dataset", names, index=names.index("digits"), key="o_dataset", persist_state=widgets.KEEP,
                                    format_func=lambda n: n if DATASETS[n].is_available() else f"{n} (files missing)",
                                    help="digits ships with the lab and works offline; MNIST is the paper's")
        dataset = handles.dataset_or_error(dataset_name, 0, errors)
        tier_names = [n for n in (preset_names(dataset) if dataset is not None else []) if n != "single"]
        tier_mode = c2.selectbox("Privacy tiers", tier_names or ["—"], key="o_tiers", persist_state=widgets.KEEP,
                                 help="paper: ε 1/2/3 by class (MNIST/digits); the tiers' ε are what the audit checks")
        c1, c2, c3 = st.columns(3)
        epochs = c1.number_input("Epochs", value=float(DEFAULT_ONE_RUN.epochs), step=1.0, key="o_epochs", persist_state=widgets.KEEP)
        canaries = c2.number_input("Gradient canaries per tier", value=500, step=100, key="o_canaries", persist_state=widgets.KEEP,
                                   help="white-box: the auditor sees every noisy update (0: none)")
        inputs = c3.number_input("Input canaries per tier", value=500, step=100, key="o_inputs", persist_state=widgets.KEEP,
                                 help="black-box: mislabeled test examples, scored on the final model (0: none; at "
                                      "most what half the test set affords)")
    with right:
        st.subheader("Algorithms and bound")
        algos = st.multiselect("Algorithms", ALGORITHM_CHOICES, default=DEFAULT_ALGOS, format_func=algorithm_label,
                               key="o_algos", persist_state=widgets.KEEP, help="one training run each, with the same canaries")
        c1, c2 = st.columns(2)
        beta = c1.number_input("β (the bound holds with confidence 1 − β)", value=0.05, step=0.01, format="%.3f",
                               key="o_beta", persist_state=widgets.KEEP)
        accountant = c2.selectbox("Accountant", ACCOUNTANTS, key="o_accountant", persist_state=widgets.KEEP,
                                  help="whose ε the runs are planned for and claim: " + "; ".join(
                                      f"**{k}**: {v}" for k, v in DESCRIPTIONS.items()))
    if errors or dataset is None:
        return None
    try:
        tiers = preset(tier_mode, dataset) if tier_names else None
        return build_config(dataset=dataset_name, tiers=tiers, epochs=epochs, canaries=canaries,
                            input_canaries=inputs, algorithms=algos, beta=beta, accountant=accountant)
    except ConfigError as e:
        errors.append(str(e))
        st.error(md(error_words(e)), icon="🚫")
        return None


def _plan(config: OneRunConfig | None, errors: list[str]) -> dict | None:
    if config is None:
        return None
    try:
        with st.spinner("Planning…"):
            p = _preview(config.to_json())
    except (ConfigError, DataError) as e:
        errors.append(str(e))
        st.error(md(error_words(e)), icon="🚫")
        return None
    capped = f" (capped from {config.input_canaries}: half the test set)" if p["input_canaries"] < config.input_canaries \
        else ""
    st.caption(md(f"Plan: {p['runs']} run(s) × {p['steps_per_run']} steps on {p['n_train']} samples "
                  f"({p['total_steps']} steps in all) · tiers {', '.join(p['tier_names'])} · {p['canaries']} gradient "
                  f"and {p['input_canaries']} input canaries per tier{capped}"))
    return p


def study_table(name: str) -> pd.DataFrame:
    """A study's settings as the page lists them: one row per one-run audit, its tiers and their ε."""
    study = studies.preset(name)
    return pd.DataFrame([{"setting": setting, "tiers": ", ".join(f"{t.name} (ε = {t.epsilon:g})" for t in c.run.tiers.tiers),
                          "algorithms": ", ".join(algorithm_label(a.name) for a in c.algorithms),
                          "dataset": c.run.data.name, "gradient canaries per tier": c.canaries}
                         for (setting, _), c in zip(study.settings, study.configs)])


def study_words(run: dict, store) -> str | None:
    """The sentence of the study a one-run audit belongs to (its comparison's finished settings so far), or None
    for an audit of the form."""
    cfg = run_config(run)
    found = studies.study_setting(cfg) if isinstance(cfg, OneRunConfig) else None
    if found is None:
        return None
    study, _ = found
    reports = {}
    for r in store.list_runs(kind="one_run", group_id=run.get("group_id")):
        other = run_config(r)
        mine = studies.study_setting(other) if isinstance(other, OneRunConfig) else None
        if mine is not None and mine[0].name == study.name and r.get("summary"):
            reports[mine[1]] = OneRunReport.from_dict(r["summary"])
    rows = studies.study_rows(study, reports)
    done = f"{len(rows)} of {len(study.settings)} settings finished"
    if not rows:
        return f"{study.name} study: {done}."
    return f"{collusion_sentence(pd.DataFrame(rows, columns=COLLUSION_COLUMNS))} ({study.name} study: {done}.)"


def _study(name: str, errors: list[str]) -> list[OneRunConfig]:
    """A preset study in place of the form: its question, its settings, its plan."""
    study = studies.preset(name)
    st.caption(md(study.question))
    st.dataframe(study_table(name), hide_index=True, width="stretch")
    try:
        with st.spinner("Planning…"):
            previews = [_preview(c.to_json()) for c in study.configs]
    except (ConfigError, DataError) as e:
        errors.append(str(e))
        st.error(md(error_words(e)), icon="🚫")
        return []
    st.caption(md(f"Plan: {len(previews)} one-run audits, {sum(p['total_steps'] for p in previews)} steps in all on "
                  f"{previews[0]['n_train']} samples · {previews[0]['canaries']} gradient canaries per tier · launched "
                  "together as one comparison; the sentence below an audit of the study follows the ε = 1 tier "
                  "across the finished settings"))
    return list(study.configs)


def _view(mgr, store, run_id: int) -> None:
    run = store.get_run(run_id)
    if run is None:
        st.warning(f"One-run audit #{run_id} was deleted.")
        return
    with st.container(key="one-run-status"):
        status.kind_status_row(run, mgr)
    report = OneRunReport.from_dict(run["summary"]) if run.get("summary") else None
    if report is None or not report.algorithms:
        if status.is_active(run):
            st.caption("The figure appears as soon as the first algorithm's run is trained and its canaries scored.")
        return
    if report.partial:
        st.caption(md(f"Partial results (done: {', '.join(a.label for a in report.algorithms)}); the rest is still "
                      "training."))
    with st.container(key="one-run-verdict", border=True):
        for line in report.verdict_sentences():
            (st.error if "BROKEN" in line else st.markdown)(md(line))
    study = study_words(run, store)
    if study:
        with st.container(key="one-run-study"):
            st.info(md(study), icon=":material/groups:")
    theme = plot_theme()
    sig = (run_id, theme, len(report.algorithms), report.partial)
    specs = charts.cached_figures("one-run-figures", sig, lambda: build_one_run_figures(report, theme=theme))
    charts.chart(specs["one_run_epsilon"], key="one-run-eps", export_key="ox-eps")
    with st.container(key="one-run-table"):
        rows = table(report)
        st.dataframe(rows, hide_index=True, width="stretch", column_config=TABLE_COLUMNS,
                     height=min(36 * (len(rows) + 1) + 4, 760))  # every row of a paper-sized audit at once
    for note in report.notes:
        st.caption(md(note))
    st.download_button("Results (JSON)", data=export.results_json(run["summary"]), file_name=f"one-run-{run_id}.json",
                       mime="application/json", key=f"o-json-{run_id}", on_click="ignore", icon=":material/download:")


def page(mgr, store, url) -> None:
    """The one-run section: the form, Launch, and the chosen one-run audit (live while it runs)."""
    st.caption(EXPLAINER)
    errors: list[str] = []
    chosen = st.selectbox("Preset", [FORM, *studies.PRESETS], key="o_preset", persist_state=widgets.KEEP,
                          format_func=lambda n: "none: the form below" if n == FORM else f"{n} study",
                          help="a study launches several one-run audits together (its settings replace the form)")
    if chosen == FORM:
        config = _form(errors)
        configs = [config] if _plan(config, errors) is not None else []
    else:
        configs = _study(chosen, errors)
    what = "one-run audit" if chosen == FORM else f"{chosen} study ({len(configs)} one-run audits)"
    launch = st.button(f"Launch {what}", type="primary", key="o_launch", icon=":material/policy:",
                       disabled=bool(errors) or not configs)
    if launch and configs:
        ids = mgr.submit(configs, kind="one_run", names=[c.name or f"one-run {c.run.data.name}" for c in configs])
        st.query_params[PARAM] = str(ids[0])
    st.divider()
    audits = store.list_runs(kind="one_run")
    if not audits:
        url.check()
        st.info("No one-run audits yet: launch one above. They keep running in the background when you close the tab.")
        return
    by_id = {r["id"]: r for r in audits}
    active = [r["id"] for r in audits if status.is_active(r)]
    current = widgets.run_picker("One-run audit", list(by_id), key="o_pick", param=PARAM,
                                 default=(active or list(by_id))[0], format_func=lambda i: run_words(by_id[i]),
                                 url=url, cast=int)
    url.check()
    live = status.is_active(by_id[current])

    @st.fragment(run_every=status.LIVE_INTERVAL if live else None)
    def view(run_id: int) -> None:
        _view(mgr, store, run_id)
        run = store.get_run(run_id)
        if live and run is not None and not status.is_active(run):
            st.rerun()  # finished: one full rerun stops the polling

    view(current)
