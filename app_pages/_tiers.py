"""The tier editor: the one adapter between the privacy tiers a user edits and ``TiersConfig``.

    tier_editor(start, dataset, key)            the editable table (owners fixed; tier number and ε editable)
                                                → TiersConfig, validated (ConfigError names the bad cell)
    url_tier_editor(url, base, dataset, key)    the same table bound to the URL's ``?tiers=`` (the Train page)
    tiers_to_rows / rows_to_tiers               TiersConfig ↔ the table's rows
    tiers_to_param / tiers_from_url             TiersConfig ↔ the URL's ``?tiers=`` text (a config file's tiers JSON)

An ε typed into the table becomes a ``TierConfig`` here, once per rerun; the URL is written for a copied link
to reproduce the tiers, and read only when the table starts, never between two edits.

(Helper modules of app_pages/ start with "_": app.py's navigation names the pages, these never are.)
"""
from __future__ import annotations

import json
import math

import pandas as pd
import streamlit as st

from app_pages._widgets import UrlParams
from engine.config.run import RunConfig, TierConfig, TiersConfig, parse_tiers_param
from engine.config.schema import ConfigError

TIER_COLUMNS = {"tier": st.column_config.NumberColumn("tier", step=1, help="tier number (1, 2, …)"),
                "ε": st.column_config.NumberColumn("ε", format="%.4g", help="privacy budget of the tier"),
                "ratio": st.column_config.NumberColumn("ratio", format="%.3f")}


def tier_editor(start: TiersConfig, dataset, *, key: str) -> TiersConfig:
    """The editable tier table (owners fixed, tier number and ε editable); raises ConfigError naming the
    bad cell or field. Explicit per-sample assignments have no table: ``start`` is returned as is."""
    if start.assign == "explicit":
        st.info("Explicit per-sample tier assignments are set in a JSON config (python -m engine run).")
        return start
    table = tiers_to_rows(start, dataset)
    edited = st.data_editor(table, key=key, hide_index=True, column_config=TIER_COLUMNS, height="auto",
                            disabled=[c for c in ("class", "name", "value") if c in table.columns])
    tiers = rows_to_tiers(edited, start)
    tiers.validate()
    return tiers


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
