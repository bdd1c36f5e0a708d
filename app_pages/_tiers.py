"""The tier editor: the one adapter between the privacy tiers a user edits and ``TiersConfig``.

    tier_editor(start, dataset, key)            the tier tables: one row per tier (its owners, its one ε,
                                                editable) above the owners' table (tier number editable)
                                                → TiersConfig, validated (TierTableError names the tier or owner
                                                in the tables' words: "tier 2 ε: …", never a config path);
                                                ``resume=True``: back as the user left them after runs that
                                                did not draw them (the Audit page's presets)
    url_tier_editor(url, base, dataset, key)    the same tables bound to the URL's ``?tiers=`` (the Train page)
    tier_labels(key)                            the table's number of each tier (for the page's messages)
    tiers_to_rows / rows_to_tiers               TiersConfig ↔ one row per owner (class / attribute value)
    tiers_to_param / tiers_from_url             TiersConfig ↔ the URL's ``?tiers=`` text (a config file's tiers JSON)

An ε typed into the table becomes a ``TierConfig`` here, once per rerun; the URL is written for a copied link
to reproduce the tiers, and read only when the table starts, never between two edits.

(Helper modules of app_pages/ start with "_": app.py's navigation names the pages, these never are.)
"""
from __future__ import annotations

import hashlib
import json
import math

import pandas as pd
import streamlit as st

from app_pages._look import field_label, user_message
from app_pages._widgets import UrlParams
from engine.config.run import RunConfig, TierConfig, TiersConfig, parse_tiers_param
from engine.config.schema import ConfigError

OWNER_COLUMNS = {"tier": st.column_config.NumberColumn(
    "tier", step=1, help="the tier this owner belongs to (1, 2, …); a new number makes a new tier")}
# ε is typed as text and read here: a number cell drops the letters of "1e9" (it became 19)
EPS_COLUMN = st.column_config.TextColumn("ε", help="the tier's privacy budget: a number > 0 (1, 0.5, 1e-1, …)")
TIER_COLUMNS = {"tier": st.column_config.NumberColumn("tier", help="tier number"),
                "ε": EPS_COLUMN, "ratio": st.column_config.NumberColumn("ratio", format="%.3f")}


class TierTableError(ConfigError):
    """A :class:`ConfigError` about the tier table: ``field`` is the config path (the page routes the message to
    the table's slot with it), the text says it in the table's words ("tier 2 ε: must be a number, got 'abc'";
    ``labels``: the table's number of each tier, in config order)."""

    in_user_terms = True

    def __init__(self, field: str, message: str, labels=None):
        super().__init__(field, message)
        self.labels = labels
        self.args = (f"{field_label(field, labels)}: {message}",)


def tier_editor(start: TiersConfig, dataset, *, key: str, resume: bool = False) -> TiersConfig:
    """The tier tables → TiersConfig, validated; raises :class:`TierTableError` naming the tier (or owner) in
    the tables' words. Explicit per-sample assignments have no table: ``start`` is returned as is.

    Class / attribute tiers: one row per tier listing its owners with its one ε (editable), above the owners'
    table where an owner's tier number moves it (a new number makes a new tier, with the ε of the tier the
    owner came from until it is edited). A random split: one row per tier (ε, ratio). The ε typed per tier is
    kept in the session while the owners' table lives (``key``), so that moving an owner never drops it.

    ``resume``: after runs that did not draw the tables (a preset shown in their place), they come back as the
    user left them, not from ``start`` (:func:`_start_rows`)."""
    if start.assign == "explicit":
        st.info("Explicit per-sample tier assignments are set in a JSON config (python -m engine run).")
        return start
    if start.assign == "random":
        return _random_editor(start, key=key, resume=resume)
    owner_col = "class" if start.assign == "class" else "value"
    eps_key = f"{key}:ε"
    owners, afresh = _start_rows(key, tiers_to_rows(start, dataset).drop(columns=["ε"]), resume=resume,
                                 kept=(eps_key,))
    if afresh:  # the table starts from ``start``: so does its ε
        st.session_state[eps_key] = {k + 1: eps_text(t.epsilon) for k, t in enumerate(start.tiers)}
    eps = st.session_state[eps_key]  # the table's tier number → the ε text typed for it
    came_from = dict(zip(owners[owner_col], owners["tier"]))  # owner → its tier when the table started
    tier_box = st.container()  # the per-tier table, drawn above the owners' table once its tiers are known
    edited = st.data_editor(owners, key=key, hide_index=True, column_config=OWNER_COLUMNS, height="auto",
                            disabled=[c for c in ("class", "name", "value") if c in owners.columns])
    _left_as(key, edited, resume=resume)
    st.caption(f"Move a {owner_col} to another tier by changing its tier number; a new number makes a new tier.")
    groups, problem = _owner_groups(edited, owner_col, len(owners))
    labels = sorted(groups)
    st.session_state[f"{key}:labels"] = labels
    for tier in labels:  # a new tier starts with the ε of the tier its first owner came from
        if tier not in eps:
            origin = came_from.get(groups[tier][0])
            eps[tier] = eps.get(origin, eps_text(start.tiers[0].epsilon)) if origin is not None else ""
    names = dict(zip(owners[owner_col], owners["name"])) if "name" in owners.columns else {}
    table = pd.DataFrame({"tier": labels,
                          "classes" if owner_col == "class" else "values":
                              [", ".join(_owner_name(o, names) for o in groups[t]) for t in labels],
                          "ε": [eps[t] for t in labels]})
    signature = hashlib.sha1(repr([(t, groups[t]) for t in labels]).encode()).hexdigest()[:10]
    with tier_box:
        typed = st.data_editor(table, key=f"{key}-eps-{signature}", hide_index=True, height="auto",
                               column_config={"tier": TIER_COLUMNS["tier"], "ε": EPS_COLUMN},
                               disabled=["tier", table.columns[1]])
    for tier, text in zip(labels, typed["ε"]):
        eps[tier] = "" if text is None or (isinstance(text, float) and math.isnan(text)) else str(text)
    if problem is not None:
        raise TierTableError("tiers", problem, labels)
    values = {}
    for k, tier in enumerate(labels):
        values[tier] = parse_epsilon(eps[tier], f"tiers.tiers[{k}].epsilon", labels)
    rows = edited.assign(ε=[values.get(int(t)) if _num(t) is not None else None for t in edited["tier"]])
    try:
        tiers = rows_to_tiers(rows, start)
        tiers.validate()
    except TierTableError:
        raise
    except ConfigError as e:
        raise TierTableError(e.field, user_message(e.message, labels=labels), labels) from None
    return tiers


def _owner_name(owner, names: dict) -> str:
    name = str(names.get(owner, owner))
    return name if name == str(owner) else f"{owner} {name}"


def _owner_groups(edited: pd.DataFrame, owner_col: str, n_owners: int) -> tuple[dict[int, list], str | None]:
    """The table's tier number → its owners (in table order), and the first problem with a tier number (its
    owner is left out): a whole number from 1 to the number of owners (each owner its own tier at most)."""
    groups: dict[int, list] = {}
    problem = None
    for _, row in edited.iterrows():
        owner = int(row[owner_col]) if owner_col == "class" else str(row[owner_col])
        tier = _num(row["tier"])
        if tier is None:
            continue  # unassigned: the engine reports which owner has no tier
        if tier < 1 or tier > n_owners or tier != int(tier):
            problem = problem or (f"{owner_col} {owner}: the tier must be a whole number from 1 to {n_owners}, "
                                  f"got {row['tier']:g}")
            continue
        groups.setdefault(int(tier), []).append(owner)
    return groups, problem


def eps_text(epsilon: float) -> str:
    """ε as the table shows it: the shortest text that reads back as the same number ("1", "0.5", "1e-05")."""
    text = repr(float(epsilon))
    return text[:-2] if text.endswith(".0") else text


def parse_epsilon(text, field: str, labels=None) -> float:
    """A typed ε (any float syntax: "2", "0.5", "1e9"); TierTableError if it is missing or not a number (the
    range is the engine's check)."""
    raw = "" if text is None else str(text).strip()
    if not raw:
        raise TierTableError(field, "is missing: type a number > 0", labels)
    try:
        value = float(raw.replace("−", "-"))
    except ValueError:
        raise TierTableError(field, f"must be a number, got {raw[:40]!r}", labels) from None
    if not math.isfinite(value):
        raise TierTableError(field, f"must be a finite number, got {raw[:40]!r}", labels)
    return value


def _random_editor(start: TiersConfig, *, key: str, resume: bool) -> TiersConfig:
    table = tiers_to_rows(start, None)
    table["ε"] = [eps_text(e) for e in table["ε"]]
    table, _ = _start_rows(key, table, resume=resume)
    edited = st.data_editor(table, key=key, hide_index=True, column_config=TIER_COLUMNS, height="auto",
                            disabled=["tier"])
    _left_as(key, edited, resume=resume)
    labels = list(edited["tier"])
    st.session_state[f"{key}:labels"] = labels
    rows = edited.assign(ε=[parse_epsilon(t, f"tiers.tiers[{k}].epsilon", labels) for k, t in enumerate(edited["ε"])])
    try:
        tiers = rows_to_tiers(rows, start)
        tiers.validate()
    except ConfigError as e:
        raise TierTableError(e.field, user_message(e.message, labels=labels), labels) from None
    return tiers


def _start_rows(key: str, fresh: pd.DataFrame, *, resume: bool,
                kept: tuple[str, ...] = ()) -> tuple[pd.DataFrame, bool]:
    """The rows the data editor ``key`` is drawn from, and whether the table starts anew from ``fresh``.

    A run that does not draw the editor drops its widget state, and the table starts again. Without ``resume``
    it is drawn from ``fresh`` (the caller keeps that the same while the table lives: :func:`url_tier_editor`).
    With ``resume`` it starts again from the rows as the user left them (``{key}:left``, :func:`_left_as`), and
    those rows stay the rows it is drawn from while it lives (``{key}:start``): Streamlit keeps a data editor's
    edits as changes to the rows it was drawn from, and a table redrawn from its last edited rows at every rerun
    dropped edits. ``kept``: the other session keys the table's state lives in (the ε typed per tier); the table
    starts anew from ``fresh`` without them."""
    state_kept = all(k in st.session_state for k in kept)
    lives = key in st.session_state and state_kept
    if not resume:
        return fresh, not lives
    start_key = f"{key}:start"
    if lives and start_key in st.session_state:
        return st.session_state[start_key], False
    left = st.session_state.get(f"{key}:left") if state_kept else None
    st.session_state[start_key] = fresh if left is None else left
    return st.session_state[start_key], left is None


def _left_as(key: str, edited: pd.DataFrame, *, resume: bool) -> None:
    """Remember the table ``key`` as this run's edits left it, for :func:`_start_rows` to resume from."""
    if resume:
        st.session_state[f"{key}:left"] = edited.copy()


def tier_labels(key: str):
    """The tier table's number of each tier (config order) the last time the editor ``key`` ran, else None."""
    return st.session_state.get(f"{key}:labels")


def url_tier_editor(url: UrlParams, base: TiersConfig, dataset, *, key: str) -> TiersConfig:
    """:func:`tier_editor` bound to ``?tiers=``: the table starts from the URL's tiers (else ``base``, the
    preset), and each run writes the edited tiers back (removes them when they equal the preset).

    The start is read from the URL only when the table starts (its widget state ``key`` does not exist yet: the
    first run, another dataset or preset, a return from another page) and kept in the session while it lives:
    the edits are deltas on that start, and a table restarted from the URL written after one edit dropped the
    next edit (tests/test_browser.py::test_successive_tier_edits_all_count). (Streamlit 1.67 shows a rerun's
    query parameters in the address bar only after the next rerun.) Raises ConfigError like
    :func:`tier_editor`; the URL then keeps the last valid tiers."""
    kept = st.session_state.get("tier-editor-start")
    if kept is None or kept[0] != key or key not in st.session_state:
        kept = st.session_state["tier-editor-start"] = (key, tiers_from_url(url, base))
    tiers = tier_editor(kept[1], dataset, key=key)
    if tiers == base:
        st.query_params.pop("tiers", None)
    elif st.query_params.get("tiers") != (encoded := tiers_to_param(tiers)):
        st.query_params["tiers"] = encoded
    return tiers


# --- TiersConfig ↔ table rows --------------------------------------------------------------------------------

def tiers_to_rows(tiers: TiersConfig, dataset) -> pd.DataFrame:
    """The editable table: one row per owner group (class / attribute value), or per tier (random)."""
    if tiers.assign == "class":
        where = {c: k for k, t in enumerate(tiers.tiers) for c in t.classes}
        return pd.DataFrame({
            "class": list(range(dataset.num_classes)),
            "name": list(dataset.class_names),
            "tier": [where[c] + 1 if c in where else None for c in range(dataset.num_classes)],
            "ε": [tiers.tiers[where[c]].epsilon if c in where else None for c in range(dataset.num_classes)],
        })
    if tiers.assign == "attribute":
        attr = tiers.attribute or dataset.default_sensitive
        values = sorted(set(map(str, dataset.sensitive_train.get(attr, [])))) if attr else []
        where = {v: k for k, t in enumerate(tiers.tiers) for v in t.values}
        return pd.DataFrame({
            "value": values,
            "tier": [where[v] + 1 if v in where else None for v in values],
            "ε": [tiers.tiers[where[v]].epsilon if v in where else None for v in values],
        })
    return pd.DataFrame({
        "tier": list(range(1, len(tiers.tiers) + 1)),
        "ε": [t.epsilon for t in tiers.tiers],
        "ratio": [t.ratio for t in tiers.tiers],
    })


def _num(x):
    if x is None:
        return None
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def rows_to_tiers(df: pd.DataFrame, base: TiersConfig) -> TiersConfig:
    """Inverse of tiers_to_rows; raises ConfigError naming the bad cell (the engine validates the rest)."""
    old_names = {k + 1: t.name for k, t in enumerate(base.tiers)}
    old_eps = {k + 1: t.epsilon for k, t in enumerate(base.tiers)}
    if base.assign in ("class", "attribute"):
        owner_col = "class" if base.assign == "class" else "value"
        groups: dict[int, list] = {}
        eps: dict[int, float] = {}
        for _, row in df.iterrows():
            tier = _num(row["tier"])
            if tier is None:
                continue  # unassigned: the engine reports which owner has no tier
            if tier < 1 or tier != int(tier):
                raise ConfigError("tiers", f"{owner_col} {row[owner_col]}: tier must be a whole number ≥ 1, got {row['tier']}")
            tier = int(tier)
            e = _num(row["ε"])
            if e is None:
                raise ConfigError("tiers", f"{owner_col} {row[owner_col]}: ε is missing")
            if tier in eps and abs(eps[tier] - e) > 1e-12:
                raise ConfigError("tiers", f"tier {tier} has two different ε values ({eps[tier]:g} and {e:g}); "
                                           f"one ε per tier")
            eps[tier] = e
            owner = int(row["class"]) if owner_col == "class" else str(row["value"])
            groups.setdefault(tier, []).append(owner)
        if not groups:
            raise ConfigError("tiers.tiers", "at least one tier is needed")
        tiers = []
        for tier in sorted(groups):
            name = old_names.get(tier, "") if old_eps.get(tier) == eps[tier] else ""
            if base.assign == "class":
                tiers.append(TierConfig(epsilon=eps[tier], classes=tuple(sorted(groups[tier])), name=name))
            else:
                tiers.append(TierConfig(epsilon=eps[tier], values=tuple(groups[tier]), name=name))
        return TiersConfig(assign=base.assign, tiers=tuple(tiers), attribute=base.attribute)
    if base.assign == "random":
        tiers = []
        for i, (_, row) in enumerate(df.iterrows()):
            e, r = _num(row["ε"]), _num(row["ratio"])
            if e is None:
                raise ConfigError(f"tiers.tiers[{i}].epsilon", "ε is missing")
            name = old_names.get(i + 1, "") if old_eps.get(i + 1) == e else ""
            tiers.append(TierConfig(epsilon=e, ratio=r, name=name))
        return TiersConfig(assign="random", tiers=tuple(tiers))
    return base


# --- TiersConfig ↔ the URL's ?tiers= ---------------------------------------------------------------------------

def tiers_to_param(tiers: TiersConfig) -> str:
    """The ``?tiers=`` text: the tiers as a config file writes them (compact JSON)."""
    return json.dumps(RunConfig(tiers=tiers).to_dict()["tiers"], separators=(",", ":"), ensure_ascii=False)


def tiers_from_url(url: UrlParams, base: TiersConfig) -> TiersConfig:
    """The ``?tiers=`` setting (``engine.config.run.parse_tiers_param``: the config file's own checks) or
    ``base``; an invalid value is warned about and removed from the URL."""
    custom = st.query_params.get("tiers")
    if not custom:
        return base
    try:
        return parse_tiers_param(custom)
    except ConfigError as e:
        url.warn("tiers", f"{e}; using the preset instead")
        st.query_params.pop("tiers", None)
        return base
