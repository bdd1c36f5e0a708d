"""Train's "Your data": a researcher's own table (CSV, .csv.gz, Parquet) as the dataset, its label and sensitive
attributes, and each owner's chosen ε from a column (issue 61). The engine reads, encodes, checks and previews the
table (``engine.data.user_table``); this view only asks for the file and the columns, stores an upload
(``engine.data.uploads``), shows the engine's preview and puts each message by its field."""
from __future__ import annotations

import streamlit as st

from app_pages._look import md
from engine.config.run import MAX_TIERS, TABLE_DATASET, DataConfig, TiersConfig
from engine.config.schema import ConfigError
from engine.data import DataError
from engine.data.example_table import EXAMPLE_SCHEMA
from engine.data.uploads import MAX_UPLOAD_BYTES, store_upload
from engine.data.user_table import load_user_table

# the Dataset picker's entry (a selectbox bound to the URL keeps its shown text there: ?dataset=your+data)
CHOICE = "your data"


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in str(text or "").split(",") if n.strip())


def _bins(text: str) -> tuple[float, ...] | None:
    """Comma-separated upper edges, or None; a word that is not a number is a ConfigError on tiers.bins."""
    parts = _names(text)
    if not parts:
        return None
    try:
        return tuple(float(p) for p in parts)
    except ValueError:
        raise ConfigError("tiers.bins", f"must be numbers separated by commas, got {text!r}") from None


@st.cache_resource(show_spinner="Reading the table…", max_entries=4)
def _table(schema: tuple):
    """The loaded table (shared by the sessions of this server; the engine keeps its encoded arrays on disk too)."""
    return load_user_table(dict(schema), max_tiers=MAX_TIERS)


def table_inputs(errors: list[str]):
    """The table's fields as the user gave them, its preview and its dataset: ``(DataConfig fields, TiersConfig from
    its budget column or None, Dataset or None)``. A bad table or field is said by its field and goes to
    ``errors`` (Launch waits)."""
    st.caption(md(f"A CSV (`.csv`, `.csv.gz`) or Parquet file in the data folder, or an upload (at most "
                  f"{MAX_UPLOAD_BYTES / 2**30:g} GiB, stored once under its checksum in the data folder). The shipped "
                  f"example: `{EXAMPLE_SCHEMA['file']}`."))
    upload = st.file_uploader("Upload a table", type=["csv", "gz", "parquet"], key="table_upload")
    if upload is not None and st.session_state.get("table_uploaded") != upload.file_id:
        try:
            st.session_state["table_file"] = store_upload(upload.getvalue(), upload.name)
            st.session_state["table_uploaded"] = upload.file_id
        except DataError as e:
            errors.append(str(e))
            st.error(md(e), icon="🚫")
    c1, c2 = st.columns(2)
    file = c1.text_input("File (in the data folder)", value=EXAMPLE_SCHEMA["file"], key="table_file",
                         bind="query-params")
    label = c2.text_input("Label column", value=EXAMPLE_SCHEMA["label"], key="table_label", bind="query-params")
    c1, c2, c3 = st.columns(3)
    attributes = c1.text_input("Sensitive attributes (comma-separated)",
                               value=", ".join(EXAMPLE_SCHEMA.get("attributes", ())), key="table_attributes",
                               bind="query-params", help="groups for audits and fairness metrics")
    budget = c2.text_input("Owners' ε column (optional)", value=EXAMPLE_SCHEMA.get("budget") or "",
                           key="table_budget", bind="query-params",
                           help="each distinct value is a tier with that ε; empty: tiers from the editor below")
    bins = c3.text_input("Bins of ε (optional upper edges)", value="", key="table_bins", bind="query-params",
                         help="e.g. 1, 4: owners up to 1, up to 4, above; a bin's ε is its smallest budget")
    fields = {"name": TABLE_DATASET, "file": file.strip() or None, "label": label.strip() or None,
              "attributes": _names(attributes)}
    tiers = None
    try:
        if budget.strip():
            tiers = TiersConfig(assign="column", tiers=(), column=budget.strip(), bins=_bins(bins))
        schema = DataConfig(**fields).schema_fields(tiers.column if tiers is not None else None)
        table = _table(tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in schema.items())))
    except (ConfigError, DataError) as e:
        errors.append(str(e))
        st.error(md(e), icon="🚫")
        return fields, tiers, None
    with st.container(key="table-preview"):
        st.caption("**Preview** (what the engine reads, encodes and plans)")
        st.code("\n".join(table.preview.lines()), language=None, wrap_lines=True)
    return fields, tiers, table.dataset
