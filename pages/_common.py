"""UI helpers shared by the pages: store + job manager, theme, intro box, charts with export buttons,
tier-table <-> TiersConfig conversion. All computing is in ``engine``; nothing here runs training."""
from __future__ import annotations

import functools
import json
import math
import os
import re
import time

import pandas as pd
import streamlit as st

from engine import export
from engine.figures.scaffold import FigureSpec, apply_theme
from engine.runs import algorithm_label, dataset_name, run_label
from engine.config import ALGORITHM_LABELS, ConfigError, RunConfig, TierConfig, TiersConfig
from engine.jobs import JobManager
from engine.store import ACTIVE, RunStore, default_store_path

LIVE_INTERVAL = 0.5  # seconds between live refreshes while runs are active (≥ 1 update/s)
# The live view's secondary charts (accuracy, ε spent, per-class recall) redraw at most this often, one per
# refresh (and all at once when the options change or the last run ends): each redraw of a Plotly chart costs
# the browser ~0.2 s of CPU, and on 2 cores five charts twice a second kept the headline MID and tier charts
# ~2 s behind.
DETAIL_INTERVAL = 3.0
STATUS_COLORS = {"queued": "gray", "running": "blue", "finished": "green", "failed": "red",
                 "cancelled": "orange", "interrupted": "violet"}
STATUS_ICONS = {"queued": ":material/schedule:", "running": ":material/play_arrow:", "finished": ":material/check:",
                "failed": ":material/error:", "cancelled": ":material/stop:", "interrupted": ":material/bolt:"}
X_AXES = {"step": "steps", "epoch": "epochs", "elapsed": "wall time", "epsilon": "ε spent"}  # figure x_axis option
PLOT_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}


# --- store and jobs ------------------------------------------------------------------------------

def store_path() -> str:
    """The run store file: $PRIVACY_LAB_STORE (a file or a folder), else ~/.privacy-imbalance-lab."""
    return _resolve_store(os.environ.get("PRIVACY_LAB_STORE") or str(default_store_path()))


@functools.lru_cache(maxsize=16)
def _resolve_store(path: str) -> str:
    return str(RunStore(path).path)  # creates the file and schema once


@st.cache_resource(show_spinner="Loading dataset…", max_entries=4)
def dataset(name: str, max_train: int | None = None):
    """A dataset shared by every page and session of this server (loaded once)."""
    from engine.data import load_dataset

    return load_dataset(name, max_train=max_train)


@st.cache_resource(show_spinner=False, on_release=lambda m: m.shutdown())
def _manager(path: str) -> JobManager:
    workers = os.environ.get("PRIVACY_LAB_WORKERS")
    return JobManager(path, max_workers=int(workers) if workers else None)


def manager() -> JobManager:
    """The process-wide job manager of this store (starts the scheduler; recovers dead runs)."""
    return _manager(store_path())


def store() -> RunStore:
    return RunStore(store_path(), readonly=True)  # read paths: mode=ro, never writes (StoreError → st.error)


def train_defaults() -> dict:
    """The Train page's default widget values: the default comparison, ``engine.demo.DEFAULT_TRAIN``."""
    from dataclasses import asdict

    from engine.demo import DEFAULT_TRAIN

    return dict(asdict(DEFAULT_TRAIN), seeds=1)


# --- look and feel ---------------------------------------------------------------------------------

def plot_theme() -> str:
    """Plot template following the app's light/dark theme."""
    try:
        kind = st.context.theme.type
    except Exception:  # noqa: BLE001 - older clients / AppTest
        kind = None
    return "dark" if kind == "dark" else "light"


INTRO_COOKIE = "privacy_lab_intro"  # "dismissed": this browser has dismissed the intro box (kept a year)


def intro(page: str = "") -> None:
    """A short first-visit explanation. "Got it" dismisses it for the session and, through a cookie, for
    this browser's later visits (a reload, a new tab, the next day)."""
    slot = st.container()  # always emitted: dismissing the box does not shift (and remount) the widgets below
    if st.session_state.pop("intro_remember", False):
        with slot:  # set by the click just before: this run writes the cookie (no Streamlit API sets one)
            st.html(f"<script>document.cookie = '{INTRO_COOKIE}=dismissed; path=/; max-age=31536000; "
                    f"SameSite=Lax';</script>", unsafe_allow_javascript=True)
    if st.session_state.get("intro_dismissed") or st.context.cookies.get(INTRO_COOKIE) == "dismissed":
        return
    with slot, st.container(border=True, key="intro-box"):
        st.markdown(
            "**New here? Three terms the lab uses**\n"
            "- **MID** (minority initial drop): with individualized DP, the most private tiers' test loss first "
            "*rises* above its starting value before it falls. The MID charts shade that span per tier.\n"
            "- **ρ** (importance weight, INO-SGD): each sample's weight in [0, 1]. Within a batch, the "
            "lowest-loss items (a tail of clip mass γ) are down-weighted by the TIF, so the hard, often "
            "minority, items dominate the update at the same privacy cost.\n"
            "- **GPR** (group privacy risk): the mean membership-inference advantage over a group's samples "
            "(the Audit page measures it).")
        st.button("Got it", key="dismiss-intro",
                  on_click=lambda: st.session_state.update(intro_dismissed=True, intro_remember=True))


def status_badge(status: str, words: str | None = None) -> None:
    st.badge(words or status, icon=STATUS_ICONS.get(status), color=STATUS_COLORS.get(status, "gray"))


def fmt_seconds(s) -> str:
    if s is None or (isinstance(s, float) and not math.isfinite(s)):
        return "—"
    s = int(round(s))
    return f"{s // 60}m {s % 60:02d}s" if s >= 60 else f"{s}s"


def run_option_label(run: dict) -> str:
    data = dataset_name(run) or "?"
    when = time.strftime("%m-%d %H:%M", time.localtime(run.get("created_at") or 0))
    return md(f"{run_label(run)} · {data} · {run['status']} · {when}")


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#+!|~$:])")


def md(text) -> str:
    """Escape a user-supplied string (run name, error text, path) for Streamlit markdown:
    no links, images, HTML or formatting can come from it."""
    return _MD_SPECIAL.sub(r"\\\1", str(text))


def show_error(e: Exception) -> None:
    """Engine errors as one clear line (never a traceback)."""
    st.error(md(e), icon="🚫")


# --- charts and export -------------------------------------------------------------------------------

def example_runs() -> list[dict] | None:
    """The lab's shipped example comparison (run records), each named "example …"; None if not shipped."""
    try:
        from engine.demo import example_runs as load

        records = load()
    except (ImportError, OSError, ValueError, KeyError):  # not in this build, or its JSON is missing / unreadable
        return None
    out = []
    for r in records:
        r = dict(r)
        name = r.get("name") or algorithm_label(r.get("algorithm", ""))
        r["name"] = name if name.lower().startswith("example") else f"example · {name}"
        out.append(r)
    return out


@st.cache_resource(show_spinner=False)
def example_preview(theme: str) -> FigureSpec | None:
    """The example runs' MID overlay (the most private tier, IDP-SGD vs INO-SGD, mean ± s.e. over seeds): what
    the default comparison shows, for the Train page before any run (it also loads the chart code in the
    server and the browser, so a first launch draws its live charts sooner). None if not shipped."""
    runs = example_runs()
    if not runs:
        return None
    from engine.figures.training import build_figures

    return build_figures(runs, names=["mid_curves"], theme=theme, mid_layout="overlay")[0]


def chart(spec: FigureSpec, *, key: str, export_key: str | None = None, height: int | None = None,
          uirevision: str | None = None) -> None:
    """A Plotly chart (in a keyed container, so tests and the browser can find it) with an export menu.
    ``uirevision``: while it stays the same, a redrawn figure keeps the user's zoom, pan and legend clicks."""
    with st.container(key=f"chart-{key}"):
        fig = spec.figure
        if height:
            fig.update_layout(height=height)
        if uirevision is not None and fig.layout.uirevision != uirevision:
            fig.update_layout(uirevision=uirevision)
        st.plotly_chart(fig, theme=None, key=f"plot-{key}", config=PLOT_CONFIG)
        if export_key is not None:
            export_menu(spec, key=export_key)


def export_menu(spec: FigureSpec, *, key: str, width: int = 1200, height: int = 700, scale: float = 2.0) -> None:
    ok, reason = export.static_export_available()
    with st.popover("Export", icon=":material/download:", key=f"pop-{key}"):
        cols = st.columns(5)
        for col, fmt in zip(cols, ("png", "svg", "pdf")):
            col.download_button(fmt.upper(), data=_deferred(spec.figure, fmt, width, height, scale), disabled=not ok,
                                file_name=f"{spec.name}.{fmt}", mime=export.MIME[fmt], key=f"dl-{key}-{fmt}",
                                on_click="ignore")
        cols[3].download_button("HTML", data=lambda f=spec.figure: export.html_bytes(f), file_name=f"{spec.name}.html",
                                mime=export.MIME["html"], key=f"dl-{key}-html", on_click="ignore")
        cols[4].download_button("CSV", data=lambda d=spec.data: export.csv_bytes(d), file_name=f"{spec.name}.csv",
                                mime=export.MIME["csv"], key=f"dl-{key}-csv", on_click="ignore")
        if not ok:
            st.caption(reason)


def _deferred(fig, fmt, width, height, scale):
    def make() -> bytes:  # exported figures use the light theme (slides), whatever the app theme is
        return export.figure_bytes(apply_theme(fig, "light"), fmt, width=width, height=height, scale=scale)
    return make


# --- tier table <-> TiersConfig --------------------------------------------------------------------------

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
        for i, tier in enumerate(sorted(groups)):
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


def tiers_to_param(tiers: TiersConfig) -> str:
    return json.dumps(RunConfig(tiers=tiers).to_dict()["tiers"], separators=(",", ":"), ensure_ascii=False)


def algorithm_options() -> list[str]:
    return ["idp_sample", "ino", "idp_scale", "dpsgd", "dpsgd_s", "nonprivate"]


def algo_label(a: str) -> str:
    return ALGORITHM_LABELS.get(a, a)


def is_active(run: dict) -> bool:
    return run["status"] in ACTIVE


def legacy_entry() -> None:
    """Run by pages/<url path>.py, which Streamlit only runs as a legacy multipage app (a fresh server
    whose first visitor opened a deep link, before app.py called st.navigation): leave that mode and
    rerun, so app.py's navigation runs the page of the same URL (page hashes come from URL paths)."""
    from streamlit.runtime.pages_manager import PagesManager

    PagesManager.uses_pages_directory = False
    st.rerun()
