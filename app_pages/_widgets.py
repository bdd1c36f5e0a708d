"""The pages' settings widgets: URL-parameter checks, run pickers bound to the URL, an error slot under each
setting, the training settings Train and Audit share, the algorithm choices, and how long an unbound setting
keeps its value (``KEEP``).

(Helper modules of app_pages/ start with "_": app.py's navigation names the pages, these never are.)
"""
from __future__ import annotations

import time
from typing import Callable

import streamlit as st

from app_pages._look import field_label, md, user_error
from engine.config.run import ACCOUNTANTS, MAX_DELTA
from engine.config.schema import ConfigError
from engine.dp.accountants import DESCRIPTIONS
from engine.dp.algorithms import ALGORITHM_REGISTRY, find_algorithm
from engine.jobs.runs import run_config

# the algorithms in the order the pickers (Train, Audit) list them: their registry entries' ``picker_rank``
ALGORITHM_CHOICES = sorted(ALGORITHM_REGISTRY, key=lambda name: ALGORITHM_REGISTRY[name].picker_rank)


def algorithm_fields(name: str, *, group_by: str | None = None, tail_fraction: float | None = None) -> dict:
    """A form's values for the config fields the algorithm ``name`` uses (its registry entry): ``group_by`` for
    one that clips per group (DP-SGD-S), ``tail_fraction`` for one with a tail length γ (INO-SGD); None: not set."""
    entry = find_algorithm(name)
    out = {}
    if entry is not None and entry.grouped and group_by is not None:
        out["group_by"] = group_by
    if entry is not None and entry.tail_length is not None and tail_fraction is not None:
        out["tail_fraction"] = tail_fraction
    return out


# ``persist_state`` of the settings widgets that are not bound to the URL. Streamlit drops the value of a widget
# that a run does not draw (the Audit page's form while a preset is shown, the attribute while the groups are the
# classes), and the field came back with its default; kept for the session, as a bound widget's value is by its
# binding. (A tier table keeps its edits with ``_tiers.tier_editor(resume=True)``.)
KEEP = "session"


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
            st.warning(f"URL parameter **{md(param)}**: {md(message)}", icon=":material/link_off:")

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


def audit_label(run: dict) -> str:
    """An audit for a picker: id, dataset, R, algorithms, when (no status: the badge below is live)."""
    when = time.strftime("%m-%d %H:%M", time.localtime(run.get("created_at") or 0))
    cfg = run_config(run)  # an AuditConfig (configs stored flat are migrated)
    what = f"{cfg.run.data.name} · R={cfg.R} · {', '.join(a.name for a in cfg.algorithms)}" if cfg else "(unreadable config)"
    return f"#{run['id']} · {what} · {when}"


# --- settings -------------------------------------------------------------------------------------------

class FieldSlots:
    """An empty slot under each settings widget, so that an invalid value is explained next to its field, once,
    in the user's terms.

    ``add(col, label, *fields)`` puts the slot (always emitted: a message never shifts the widgets below) under
    the widget just drawn in ``col``; ``row`` (a slot from :meth:`row`, under the whole row of fields) takes the
    field's messages too long for a narrow column (they would wrap a word per line). ``show(error)`` writes a
    :class:`ConfigError` into the slot of its field (dotted config path, e.g. ``batch_size`` or
    ``algorithm.alpha``; a registered prefix such as ``tiers`` owns ``tiers.tiers[0].epsilon``) and returns False
    when no widget owns it. The path and the engine's words are translated in one place
    (``_look.user_error``): tiers by the number the tier table shows (``tier_labels``, the table's number of
    each tier in config order; ``tiers``, the TiersConfig the plan was made for). A message already shown is not
    shown again (a plan error comes once per algorithm). ``reasons`` names the fields whose message was shown
    (once each), for the caption next to the disabled Launch button: it names them, the message stays in one
    place.
    """

    NARROW = 60  # characters: a longer message goes to the row's slot (a column is ~20 characters wide)

    def __init__(self):
        self.slots: dict[str, tuple[object, str, object]] = {}
        self.reasons: list[str] = []
        self.tier_labels = None
        self.tiers = None
        self._shown: dict[tuple[int, str], bool] = {}
        self._filled: dict[int, list[str]] = {}
        self._warned: dict[int, list[str]] = {}

    @staticmethod
    def row(where=None):
        """A full-width slot under a row of fields (call it right after ``st.columns``)."""
        return (where or st).empty()

    def add(self, where, label: str, *fields: str, row=None) -> None:
        slot = where.empty()
        for f in fields:
            self.slots[f] = (slot, label, row)

    def owner(self, field: str):
        """(slot, label, row slot) of the widget owning ``field``: the exact path, its last part, or the longest
        registered prefix (``tiers`` for ``tiers.tiers[0].epsilon``); None if none."""
        field = field or ""
        hit = self.slots.get(field) or self.slots.get(field.split(".")[-1])
        if hit is None:
            prefixes = [f for f in self.slots if field.startswith(f + ".") or field.startswith(f + "[")]
            hit = self.slots[max(prefixes, key=len)] if prefixes else None
        return hit

    def explain(self, error: Exception, label: str = "") -> tuple[str, str]:
        """(who, message) in the user's terms: who is ``label`` (the widget's), refined for a tier path."""
        field = getattr(error, "field", "") or ""
        if getattr(error, "in_user_terms", False):  # the tier table's own words (``_tiers.TierTableError``)
            what, message = field_label(field, getattr(error, "labels", None)), error.message
        else:
            what, message = user_error(error, labels=self.tier_labels, tiers=self.tiers)
        if field.startswith("tiers.tiers[") or not label:
            label = what  # "tier 1 ε": the tier table's words
        return label, message

    def show(self, error: ConfigError) -> bool:
        hit = self.owner(getattr(error, "field", "") or "")
        if hit is None:
            return False
        slot, label, row = hit
        who, message = self.explain(error, label)
        text = f"{who}: {message}"
        if (id(slot), text) in self._shown:
            return True  # shown already (the same plan error of another algorithm)
        self._shown[(id(slot), text)] = True
        target = row if row is not None and len(message) > self.NARROW else slot
        lines = self._filled.setdefault(id(target), [])
        lines.append(md(message) if target is slot and who == label else f"**{md(who)}**: {md(message)}")
        target.error("  \n".join(lines), icon=":material/error:")  # one box per slot, every message once
        self.reasons.append(who)
        return True

    def warn(self, advisory: ConfigError) -> bool:
        """An advisory (``RunConfig.advisories``: valid, but far from what trains or ignored by the algorithms
        chosen) as a warning in its field's slot, in the user's terms; it does not disable Launch (not in
        ``reasons``). False when no widget owns the field."""
        hit = self.owner(getattr(advisory, "field", "") or "")
        if hit is None:
            return False
        slot, label, row = hit
        who, message = self.explain(advisory, label)
        target = row if row is not None and len(message) > self.NARROW else slot
        lines = self._warned.setdefault(id(target), [])
        line = f"**{md(who)}**: {md(message)}"
        if line not in lines:  # every warning of a slot in one box (a second one replaced the first), once each
            lines.append(line)
        target.warning("  \n".join(lines), icon=":material/warning:")
        return True


def training_inputs(prefix: str = "", *, epochs: float, batch: int, batch_step: int, lr: float, lr_step: float,
                    slots: FieldSlots | None = None) -> dict:
    """Epochs, batch size, learning rate, δ, clip norm and seed (two rows of three) and the accountant, bound to
    the URL as ``{prefix}epochs``, ``{prefix}batch``, ``{prefix}lr``, ``{prefix}delta``, ``{prefix}clip``,
    ``{prefix}seed``, ``{prefix}accountant``.

    With ``slots``, each field gets a slot for its error message (:class:`FieldSlots`, long ones under its row)
    and the fields take any number, so that the engine's checks refuse a bad one with a message: a bounded
    number input refuses silently (a red outline; the page keeps the last valid value, so Launch would run
    that); a URL's ``batch=-5`` then shows the same message next to the field. Without ``slots`` the fields
    keep their bounds."""
    fields = {"epochs": ("epochs",), "batch": ("batch_size",), "lr": ("optimizer.lr", "lr"), "delta": ("delta",),
              "clip": ("clip_norm",), "seed": ("seed",)}
    checked = slots is not None  # the engine's checks explain a bad value next to its field

    def number(col, row, label, name, bounds, **kw):
        if not checked:
            kw.update(bounds)
        value = col.number_input(label, key=f"{prefix}{name}", bind="query-params", **kw)
        if slots is not None:
            slots.add(col, label, *fields[name], row=row)
        return value

    c1, c2, c3 = st.columns(3)
    row = FieldSlots.row() if checked else None
    out = {"epochs": number(c1, row, "Epochs", "epochs", dict(min_value=0.1), value=epochs, step=0.5),
           "batch": number(c2, row, "Batch size", "batch", dict(min_value=1), value=batch, step=batch_step),
           "lr": number(c3, row, "Learning rate", "lr", dict(min_value=0.0001), value=lr, step=lr_step,
                        format="%.4g")}
    c1, c2, c3 = st.columns(3)
    row = FieldSlots.row() if checked else None
    out.update(delta=number(c1, row, "δ", "delta", dict(min_value=1e-12, max_value=MAX_DELTA), value=1e-5,
                            format="%.1e"),
               clip=number(c2, row, "Clip norm C", "clip", dict(min_value=0.001), value=1.0, step=0.1),
               seed=number(c3, row, "Seed", "seed", dict(min_value=0), value=0, step=1))
    c1, _, _ = st.columns(3)
    out["accountant"] = c1.selectbox(
        "Accountant", ACCOUNTANTS, key=f"{prefix}accountant", bind="query-params",
        help="Whose ε the plan meets and the run reports: " + "; ".join(
            f"**{k}**: {v}" for k, v in DESCRIPTIONS.items()) + ". The papers' scripts keep rdp.")
    return out
