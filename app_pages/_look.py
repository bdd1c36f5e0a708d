"""Look and feel shared by the pages: the plot theme that follows the app's, the first-visit intro box,
markdown escaping of user strings, and engine errors as one line.

(Helper modules of app_pages/ start with "_": app.py's navigation names the pages, these never are.)
"""
from __future__ import annotations

import re

import streamlit as st


def plot_theme() -> str:
    """Plot template following the app's light/dark theme."""
    try:
        kind = st.context.theme.type
    except Exception:  # noqa: BLE001 - older clients / AppTest
        kind = None
    return "dark" if kind == "dark" else "light"


INTRO_COOKIE = "privacy_lab_intro"  # "dismissed": this browser has dismissed the intro box (kept a year)


def intro() -> None:
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


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#+!|~$:])")


def md(text) -> str:
    """Escape a user-supplied string (run name, error text, path) for Streamlit markdown:
    no links, images, HTML or formatting can come from it."""
    return _MD_SPECIAL.sub(r"\\\1", str(text))


def show_error(e: Exception) -> None:
    """Engine errors as one clear line (never a traceback)."""
    st.error(md(e), icon="🚫")
