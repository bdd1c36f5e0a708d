"""The pages' widgets: URL-parameter checks, run pickers bound to the URL, settings with an error slot per
field, the tier editor, and figures kept between live refreshes (a run's status row is in ``_status``).
Pages are layout plus calls to these.

(The file name starts with "_": Streamlit never lists it as a page.)
"""
from __future__ import annotations

import time
from typing import Callable

import streamlit as st

from engine import export
from engine.config import ConfigError, TiersConfig, parse_tiers_param
from engine.data import DataError
from engine.runs import algorithm_label, run_config
from pages import _common as ui


# --- URL parameters ---------------------------------------------------------------------------------

class UrlParams:
    """What the URL asked for, captured before any widget runs, so that nothing is dropped silently.

    Streamlit drops a query parameter bound to a widget when its value is not valid for the widget (and
    also when it equals the default). :meth:`check`, called after the widgets, tells the two apart and
    shows one ``st.warning`` per invalid parameter, naming it, in a slot at the top of the page (the slot
    always exists, so a warning never shifts the widgets below).
    """

    def __init__(self, labels: dict[str, Callable] | None = None, known: tuple[str, ...] | None = None):
        self.initial = {k: st.query_params.get_all(k) for k in st.query_params}
        self.labels = labels or {}  # key → format_func of a widget whose URL may carry labels
        self.known = known  # every parameter the page reads (None: do not check names)
        self.slot = st.container()

    def warn(self, param: str, message: str) -> None:
        with self.slot:
            st.warning(f"URL parameter **{ui.md(param)}**: {ui.md(message)}", icon=":material/link_off:")

    def check(self) -> None:
        for key, raw in self.initial.items():
            if self.known is not None and key not in self.known and key not in st.session_state:
                self.warn(key, "is not a setting of this page; ignored")
                continue
            if key in st.query_params or key not in st.session_state:
                continue  # kept, or not a widget's parameter (the page checks those itself)
            value = st.session_state[key]
            if not _same(raw, value, self.labels.get(key)):
                shown = ", ".join(raw) if raw else "(empty)"
                self.warn(key, f"{shown[:80]} is not a valid value; using {_show(value, self.labels.get(key))}")


def _show(value, label) -> str:
    vals = value if isinstance(value, (list, tuple)) else [value]
    return ", ".join(str(label(v) if label else v) for v in vals) or "nothing"


def _same(raw: list[str], value, label) -> bool:
    """True when the URL's strings mean the widget's value (then Streamlit dropped a default)."""
    vals = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(raw) != len(vals):
        return False
    for r, v in zip(raw, vals):
        if r == str(v) or (label is not None and r == str(label(v))) or r.lower() == str(v).lower():
            continue
        try:
            if float(r) == float(v):
                continue
        except (TypeError, ValueError, OverflowError):
            pass
        return False
    return True


def tiers_from_url(url: UrlParams, base: TiersConfig) -> tuple[TiersConfig, str | None]:
    """The ``?tiers=`` setting (``engine.config.parse_tiers_param``: the config file's own checks) or
    ``base``; an invalid value is warned about and removed from the URL. Returns (tiers, URL text or None)."""
    custom = st.query_params.get("tiers")
    if not custom:
        return base, None
    try:
        return parse_tiers_param(custom), custom
    except ConfigError as e:
        url.warn("tiers", f"{e}; using the preset instead")
        st.query_params.pop("tiers", None)
        return base, None


# --- pickers ----------------------------------------------------------------------------------------------

def run_picker(label: str, options: list, *, key: str, param: str, default, format_func: Callable,
               url: UrlParams | None = None, cast: Callable = str, where=st, **kwargs):
    """A selectbox of runs (or comparisons) bound to the URL parameter ``param``; returns the choice.

    The URL (or a new launch writing it) decides what is shown; a value naming nothing in the store
    is warned about, removed from the URL, and ``default`` is shown instead.
    """
    raw = st.query_params.get(param)
    try:
        current = cast(raw) if raw is not None else None
    except (TypeError, ValueError):
        current = None
    if current not in options:
        if raw is not None and url is not None:
            url.warn(param, f"{raw[:80]} names nothing in the store; showing the latest instead")
            st.query_params.pop(param, None)
        current = default

    def _on_pick() -> None:
        st.query_params[param] = str(st.session_state[key])

    if st.session_state.get(key) != current:
        st.session_state[key] = current
    where.selectbox(label, options, format_func=format_func, key=key, on_change=_on_pick, **kwargs)
    return current


def comparison_label(group: str, runs: list[dict]) -> str:
    """A comparison (group id) and its algorithms, for a picker."""
    members = sorted((r for r in runs if r["group_id"] == group), key=lambda r: r["id"])
    return f"{group} — {', '.join(algorithm_label(r['algorithm']) for r in members)}"


def audit_label(run: dict) -> str:
    """An audit for a picker: id, dataset, R, algorithms, when (no status: the badge below is live)."""
    when = time.strftime("%m-%d %H:%M", time.localtime(run.get("created_at") or 0))
    cfg = run_config(run)  # an AuditConfig (configs stored flat are migrated)
    what = f"{cfg.run.data.name} · R={cfg.R} · {', '.join(a.name for a in cfg.algorithms)}" if cfg else "(unreadable config)"
    return f"#{run['id']} · {what} · {when}"


# --- live view --------------------------------------------------------------------------------------------

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


def dataset(name: str, max_train, errors: list[str]):
    """The (cached) dataset, or None after showing why it cannot be loaded (the reason goes to ``errors``)."""
    try:
        return ui.dataset(name, int(max_train) or None)
    except (DataError, ConfigError) as e:
        errors.append(str(e))
        ui.show_error(e)
        return None


# --- settings -------------------------------------------------------------------------------------------

class FieldSlots:
    """An empty slot under each settings widget, so that an invalid value is explained next to its field.

    ``add(col, *fields)`` puts the slot (always emitted: a message never shifts the widgets below) under the
    widget just drawn in ``col``; ``show(error)`` writes a :class:`ConfigError` into the slot of its field
    (dotted config path, e.g. ``batch_size`` or ``algorithm.alpha``) and returns False when no widget owns it.
    ``reasons`` lists what was shown, for the caption next to the disabled Launch button.
    """

    def __init__(self):
        self.slots: dict[str, tuple[object, str]] = {}
        self.reasons: list[str] = []

    def add(self, where, label: str, *fields: str) -> None:
        slot = where.empty()
        for f in fields:
            self.slots[f] = (slot, label)

    def show(self, error: ConfigError) -> bool:
        field = getattr(error, "field", "") or ""
        hit = self.slots.get(field) or self.slots.get(field.split(".")[-1])
        if hit is None:
            return False
        slot, label = hit
        slot.error(ui.md(error.message), icon=":material/error:")
        self.reasons.append(f"{label}: {error.message}")
        return True


def training_inputs(prefix: str = "", *, epochs: float, batch: int, batch_step: int, lr: float, lr_step: float,
                    slots: FieldSlots | None = None) -> dict:
    """Epochs, batch size, learning rate, δ, clip norm and seed (two rows of three), bound to the URL as
    ``{prefix}epochs``, ``{prefix}batch``, ``{prefix}lr``, ``{prefix}delta``, ``{prefix}clip``, ``{prefix}seed``.
    With ``slots``, each field gets a slot for its error message (:class:`FieldSlots`)."""
    fields = {"epochs": ("epochs",), "batch": ("batch_size",), "lr": ("optimizer.lr", "lr"), "delta": ("delta",),
              "clip": ("clip_norm",), "seed": ("seed",)}

    def number(col, label, name, **kw):
        value = col.number_input(label, key=f"{prefix}{name}", bind="query-params", **kw)
        if slots is not None:
            slots.add(col, label, *fields[name])
        return value

    c1, c2, c3 = st.columns(3)
    out = {"epochs": number(c1, "Epochs", "epochs", min_value=0.1, value=epochs, step=0.5),
           "batch": number(c2, "Batch size", "batch", min_value=1, value=batch, step=batch_step),
           "lr": number(c3, "Learning rate", "lr", min_value=0.0001, value=lr, step=lr_step, format="%.4g")}
    c1, c2, c3 = st.columns(3)
    out.update(delta=number(c1, "δ", "delta", min_value=1e-12, max_value=0.5, value=1e-5, format="%.1e"),
               clip=number(c2, "Clip norm C", "clip", min_value=0.001, value=1.0, step=0.1),
               seed=number(c3, "Seed", "seed", min_value=0, value=0, step=1))
    return out


def audit_downloads(run: dict, report, store) -> None:
    """The audit's results (JSON, as stored) and per-sample advantages (CSV) as downloads."""
    rid, keys = run["id"], [a.key for a in report.algorithms]
    c1, c2 = st.columns(2)
    c1.download_button("Results (JSON)", data=export.results_json(run["summary"]), file_name=f"audit-{rid}.json",
                       mime="application/json", key=f"a-json-{rid}", on_click="ignore", icon=":material/download:")
    c2.download_button("Per-sample advantages (CSV)", data=lambda: export.audit_advantages_csv(store, rid, keys),
                       file_name=f"audit-{rid}-advantages.csv", mime="text/csv", key=f"a-csv-{rid}",
                       on_click="ignore", icon=":material/download:")


# --- tiers ------------------------------------------------------------------------------------------------

TIER_COLUMNS = {"tier": st.column_config.NumberColumn("tier", step=1, help="tier number (1, 2, …)"),
                "ε": st.column_config.NumberColumn("ε", format="%.4g", help="privacy budget of the tier"),
                "ratio": st.column_config.NumberColumn("ratio", format="%.3f")}


def tier_editor(start: TiersConfig, dataset, *, key: str) -> TiersConfig:
    """The editable tier table (owners fixed, tier number and ε editable); raises ConfigError naming the
    bad cell or field. Explicit per-sample assignments have no table: ``start`` is returned as is."""
    if start.assign == "explicit":
        st.info("Explicit per-sample tier assignments are set in a JSON config (python -m engine run).")
        return start
    table = ui.tiers_to_rows(start, dataset)
    edited = st.data_editor(table, key=key, hide_index=True, column_config=TIER_COLUMNS, height="auto",
                            disabled=[c for c in ("class", "name", "value") if c in table.columns])
    tiers = ui.rows_to_tiers(edited, start)
    tiers.validate()
    return tiers


# --- figures ----------------------------------------------------------------------------------------------

def live_figures(group: str, names, **options):
    """The Train page's :class:`engine.figures.live.LiveFigures` of ``group`` for these figures and options,
    kept in the session: a refresh that only brings new evaluations patches its figures instead of
    rebuilding them. A new group or option starts a new one (one is kept per set of figure names)."""
    from engine.figures.live import LiveFigures

    key = (group, tuple(sorted(options.items())))
    slots = st.session_state.setdefault("live-figures", {})
    kept = slots.get(tuple(names))
    if kept is None or kept[0] != key:
        kept = slots[tuple(names)] = (key, LiveFigures(names, **options))
    return kept[1]


def staggered(seconds: float, name: str, computes: dict[str, Callable[[], object]], *, unless_changed) -> dict:
    """{key: compute()} kept in the session under ``name``: each value is computed again at most every
    ``seconds`` and at most one per call (the oldest due one), so the redraws they cause are spread over
    refreshes instead of landing on one; all at once on the first call, for a new set of keys, or when
    ``unless_changed`` (any comparable value, e.g. the figure options) differs from the last call's."""
    now = time.monotonic()
    kept = st.session_state.get(name)
    if kept is None or kept["changed"] != unless_changed or set(kept["values"]) != set(computes):
        kept = {"changed": unless_changed, "at": {k: now for k in computes},
                "values": {k: f() for k, f in computes.items()}}
    else:
        due = [k for k in computes if now - kept["at"][k] >= seconds]
        if due:
            k = min(due, key=kept["at"].get)
            kept["values"][k], kept["at"][k] = computes[k](), now
    st.session_state[name] = kept
    return dict(kept["values"])


def cached_figures(name: str, signature: tuple, build: Callable[[], list]) -> dict:
    """name → FigureSpec, rebuilt only when ``signature`` changes (else the browser gets the same figures
    and does not redraw them on a refresh)."""
    cached = st.session_state.get(name)
    if cached is not None and cached[0] == signature:
        return cached[1]
    specs = {s.name: s for s in build()}
    st.session_state[name] = (signature, specs)
    return specs


PRESETS_HELP = ("Named audits from the engine (engine/audit/presets.py): quick (digits LR, seconds to a minute) and "
                "quick-eps1 show non-private > DP-SGD ε = 10 > DP-SGD ε = 1; adult-paper and mnist-paper follow the "
                "papers' training (20 epochs, lr 0.1, C 5, 2R = 400)")
AUDIT_EXPLAINER = ("**PA-ALOOA**: for r = 1..R the training set is split into two random halves and one model is trained on each, "
           "so every sample is a member of exactly R of the 2R models. A sample's **advantage** is the best TPR − FPR of "
           "the rule *member if score ≥ t* over those models (score: the logit-scaled confidence of the true class, "
           "log p_y − log(1 − p_y), in float64); a group's **GPR** is the mean advantage of its samples and "
           "**Δ** the gap between the riskiest and the safest group (percentage points). The tick on each bar is that "
           "group's **null floor**, the same estimator on shuffled membership labels: bars near it show no measurable "
           "leakage. Δ is *not resolved* when its CI reaches the spread of Δ under shuffled labels.")


def null_floor_warning(report) -> None:
    """Say in words when every bar sits at its null floor (the audit measured no leakage)."""
    at_floor = report.at_null_floor()
    if at_floor:
        st.warning("Every bar sits at its null floor: this audit measures no membership leakage for "
                   f"{', '.join(at_floor)} (each group's GPR CI reaches its floor under shuffled labels). Train models "
                   "that fit their half more closely (more epochs, fewer samples, a larger model), raise R, or start "
                   "from the quick preset.")
