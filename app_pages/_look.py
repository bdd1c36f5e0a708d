"""Look and feel shared by the pages: the plot theme that follows the app's, the first-visit intro box,
markdown escaping of user strings, and engine errors as one line.

(Helper modules of app_pages/ start with "_": app.py's navigation names the pages, these never are.)
"""
from __future__ import annotations

import re
from pathlib import Path

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


def home_relative(path) -> str:
    """A path as a user reads it: under the home folder it starts with ``~`` (the sidebar's store line; the
    README's screenshots show ``~/runs.sqlite``, not a test's temporary folder)."""
    path, home = Path(path), Path.home()
    return "~/" + path.relative_to(home).as_posix() if path.is_relative_to(home) else str(path)


def show_error(e: Exception, *, user_terms: bool = False) -> None:
    """Engine errors as one clear line (never a traceback); ``user_terms``: the field and the engine's words
    translated (:func:`user_error`)."""
    if user_terms and not getattr(e, "in_user_terms", False):
        what, message = user_error(e)
        st.error(md(f"{what}: {message}" if what else message), icon="🚫")
        return
    st.error(md(e), icon="🚫")


# --- engine errors in the user's terms -----------------------------------------------------------------------
# The engine names a bad value by its config path (``tiers.tiers[0].epsilon``, ``optimizer.lr``) and writes
# config keys in its messages (``noise_multiplier=0.001``); a page shows the field's label instead, tiers by
# the number the tier table shows ("tier 1"), and the words of the form. One place translates them:
# :func:`user_error` (``_widgets.FieldSlots`` uses it for every message it shows).

_TIER_PATH = re.compile(r"^tiers\.tiers\[(\d+)\](?:\.(\w+))?(?:\[(\d+)\])?$")
_TIER_PARTS = {"epsilon": "ε", "ratio": "ratio", "classes": "classes", "values": "values", "name": "name"}
_KEY_WORDS = ((re.compile(r"\bepsilon\s*=\s*"), "ε = "),
              (re.compile(r"\bnoise_multiplier\s*=\s*"), "noise multiplier σ = "),
              (re.compile(r"\bsample_rate\s*=\s*"), "sample rate q = "), (re.compile(r"\bdelta\s*=\s*"), "δ = "),
              (re.compile(r"\bsteps\s*=\s*(\d+)"), r"\1 steps"), (re.compile(r"\bbatch_size\s*=\s*"), "batch size "),
              (re.compile(r"\bbatch_size\b"), "the batch size"), (re.compile(r"\bepsilons\b"), "ε values"),
              (re.compile(r"\bepsilon\b"), "ε"))
_ALLOW_LARGE = re.compile(r"; lower it, or set \"allow_large\": true in the run config to run it anyway")
_ENGINE_TIER = re.compile(r"\b(assigned to tier |^tier )(\d+)\b")  # the engine counts tiers from 0 in these


def tier_label(index: int, labels=None) -> str:
    """The tier at ``index`` (0-based, the config's order) as the tier table numbers it: "tier 1"."""
    if labels is not None and 0 <= index < len(labels):
        return f"tier {labels[index]}"
    return f"tier {index + 1}"


def field_label(field: str, labels=None) -> str:
    """A config path in the user's terms: ``tiers.tiers[0].epsilon`` → "tier 1 ε", ``tiers`` → "Privacy tiers"
    (other paths: their last part, underscores as spaces)."""
    field = field or ""
    m = _TIER_PATH.match(field)
    if m:
        part = _TIER_PARTS.get(m.group(2) or "", m.group(2) or "")
        return f"{tier_label(int(m.group(1)), labels)} {part}".strip()
    if field in ("tiers", "tiers.tiers", "tiers.assign", "tiers.attribute", "tiers.assignment"):
        return "Privacy tiers"
    return field.split(".")[-1].replace("_", " ") if field else "Settings"


def user_message(message: str, *, labels=None, tiers=None) -> str:
    """An engine message in the form's words: config keys as symbols, 0-based tier numbers as the table's; a
    plan message about one tier's ``epsilon=X`` names that tier (``tiers``: the TiersConfig it was planned
    for)."""
    text = str(message)
    text = _ENGINE_TIER.sub(lambda m: m.group(1) + tier_label(int(m.group(2)), labels)[len("tier "):], text)
    text = _ALLOW_LARGE.sub("; lower it (only a run config file can lift the cap: \"allow_large\": true)", text)
    named = re.search(r"\bepsilon=([0-9.eE+-]+)", text)
    if named and tiers is not None:
        hits = [k for k, t in enumerate(tiers.tiers) if f"{t.epsilon:g}" == named.group(1)]
        if len(hits) == 1:
            text = f"{tier_label(hits[0], labels)}: {text}"
    for pattern, words in _KEY_WORDS:
        text = pattern.sub(words, text)
    return text


def user_error(e: Exception, *, labels=None, tiers=None) -> tuple[str, str]:
    """(what, message) of an engine error in the user's terms: what names the field ("Epochs" is for the page to
    say: here "epochs"; "tier 1 ε"), message is the engine's message translated by :func:`user_message`."""
    field = getattr(e, "field", None)
    message = getattr(e, "message", None)
    if field is None or message is None:
        return "", user_message(str(e), labels=labels, tiers=tiers)
    return field_label(field, labels), user_message(message, labels=labels, tiers=tiers)


def format_pp(value, *, signed: bool = True, digits: int = 1) -> str:
    """Percentage points for display: "+2.1 pp"; a value that rounds to zero is "0.0 pp" (never "−0.0" or
    "+0.0"); not a number: "—"."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "—"
    if v != v or v in (float("inf"), float("-inf")):
        return "—"
    if round(v, digits) == 0:
        return f"{0:.{digits}f} pp"
    return f"{v:+.{digits}f} pp" if signed else f"{v:.{digits}f} pp"


_NEG_ZERO = re.compile(r"(?<![\d.])[-−+]((?:0\.)?0+)(?![\d.]*[1-9])(?=\b|\s|$)")


def no_negative_zero(text):
    """A formatted number that rounds to zero without its sign ("-0.0 ± 0.3" → "0.0 ± 0.3"); other values and
    non-strings unchanged."""
    if not isinstance(text, str):
        return text
    return _NEG_ZERO.sub(r"\1", text)
