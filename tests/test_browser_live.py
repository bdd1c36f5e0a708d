"""The Train page's live view and form feedback in a real browser (reuses tests/test_browser.py's Streamlit
server and Chromium).

- an out-of-range setting disables Launch and says why next to its field; an invalid URL parameter is
  warned about by name; the intro box, once dismissed, stays dismissed across pages, reloads and tabs;
- live append: while a short digits comparison runs, the live MID chart gains points through patches of
  the kept figures (the page's "figures built N× · patched M×" counters), not rebuilds.

(Streamlit 1.67 gives every st.plotly_chart an element id hashed from its figure, key or not, so the
browser mounts the plot div afresh whenever its data change — streamlit/streamlit#8782, fixed upstream by
the open PR #16052 — which is why no test here asserts that the DOM node survives a refresh.)

Every wait polls the page or the store with generous limits (never a fixed sleep).
"""
from __future__ import annotations

import os
import re

import pytest

from app_pages._look import INTRO_COOKIE
from tests.test_browser import (CHROMIUM, RUN, UI, UI_MS, app_idle, cancel_all, last_plotted_x, new_runs, run_ids,
                                wait_until)
from tests.test_browser import server  # noqa: F401 - a pytest fixture

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"the browser tests need Debian's chromium at {CHROMIUM} (apt-get install chromium)")

PLOT = ".st-key-chart-live-mid .js-plotly-plot"


def live_stats(page) -> tuple[int, int] | None:
    """(builds, patches) from the live view's counters caption."""
    box = page.locator(".st-key-live-stats")
    if not box.count():
        return None
    m = re.search(r"built (\d+)× · patched (\d+)×", box.inner_text())
    return (int(m.group(1)), int(m.group(2))) if m else None


def plotted_points(page) -> int:
    """Points in the live MID chart's plotted data (Plotly's calcdata on the plot div: what it draws)."""
    return page.evaluate(f"""() => {{
        const gd = document.querySelector({PLOT!r});
        return gd && gd.calcdata ? gd.calcdata.reduce((n, cd) => n + cd.filter(p => p.x !== undefined).length, 0) : 0;
    }}""")


def plotted_last_step(page) -> float:
    """The largest x (step) the live MID chart draws."""
    return last_plotted_x(page.locator(".st-key-chart-live-mid"))


def column_of(page, key: str):
    """The innermost column holding the widget ``key`` (where its message belongs)."""
    return page.locator('[data-testid="stColumn"]').filter(has=page.locator(f".st-key-{key}")).last


def test_form_feedback(server, browser):  # noqa: F811 - pytest fixtures
    url, store, _ = server
    before = run_ids(store)  # (the store is shared with the other browser modules)
    page = browser.new_page(viewport={"width": 1440, "height": 1300})
    page.set_default_timeout(UI_MS)
    # an out-of-range batch: Launch disabled, the reason under the Batch size field and beside Launch
    page.goto(url + "train?dataset=digits&max_train=100&batch=500")
    launch = page.get_by_role("button", name="Launch comparison")
    launch.wait_for()
    field = column_of(page, "batch")
    # (the page draws as the script runs: the checks below wait for the run that drew the message to end, else the
    # note beside Launch could still be on its way; CI once looked a moment too early)
    wait_until(lambda: field.get_by_text("at most the training set size 100, got 500").count() and app_idle(page), UI,
               "the message next to Batch size, the script run ended")
    assert launch.is_disabled()
    assert page.locator(".st-key-launch-note").get_by_text("Launch is disabled until this is fixed").count() == 1
    assert column_of(page, "epochs").locator('[data-testid="stAlert"]').count() == 0  # only the bad field
    # invalid URL parameters: a visible warning naming each
    page.goto(url + "train?model=gpt&epochs=abc")
    for name in ("model", "epochs"):
        wait_until(lambda: page.locator('[data-testid="stAlert"]').get_by_text(f"URL parameter {name}").count(), UI,
                   f"the warning about {name}")
    wait_until(lambda: launch.is_enabled(), UI, "Launch with the defaults")
    # the intro box stays dismissed: across reruns and pages of the session
    page.get_by_role("button", name="Got it").click()
    page.locator(".st-key-intro-box").wait_for(state="detached")
    # the rerun after the click writes the cookie with a script of the page: a click on a link before that script
    # ran left no cookie, and the reload below showed the intro again (seen once under load)
    wait_until(lambda: any(c["name"] == INTRO_COOKIE for c in page.context.cookies()), UI, "the intro's cookie")
    page.get_by_role("link", name="TIF explorer").click()
    page.get_by_role("heading", name="TIF explorer").wait_for()
    page.get_by_role("link", name="Train / compare").click()
    page.get_by_role("heading", name="Train / compare").wait_for()
    launch.wait_for()
    assert page.locator(".st-key-intro-box").count() == 0
    # … and across reloads and new tabs of this browser (a cookie), but not in another browser profile
    page.reload()
    launch.wait_for()
    assert page.locator(".st-key-intro-box").count() == 0
    cookies = page.context.cookies()
    page.close()
    profile = browser.new_context()  # this browser, later (its cookies): a new tab on another page
    profile.add_cookies(cookies)
    tab = profile.new_page()
    tab.goto(url + "tif")
    tab.get_by_role("heading", name="TIF explorer").wait_for()
    assert tab.locator(".st-key-intro-box").count() == 0
    profile.close()
    other = browser.new_page()  # another browser profile (no cookie): the intro again
    other.goto(url + "train")
    other.locator(".st-key-intro-box").wait_for()
    other.close()
    assert run_ids(store) == before  # nothing was launched


def test_live_chart_appends_without_rebuilding(server, browser):  # noqa: F811 - pytest fixtures
    url, store, _ = server
    page = browser.new_page(viewport={"width": 1440, "height": 1300})
    page.set_default_timeout(UI_MS)
    # ~125 000 steps, an evaluation every 5: far longer than the refreshes the test needs on any machine (then
    # cancelled); past MAX_DRAWN_POINTS evaluations a curve is drawn thinned, so the browser's work stays flat
    page.goto(url + "train?dataset=digits&max_train=400&batch=64&epochs=20000&eval_every=5&momentum=0.0")
    page.get_by_role("button", name="Got it").click()
    launch = page.get_by_role("button", name="Launch comparison")
    wait_until(lambda: launch.is_enabled(), UI, "the launch button")
    before = run_ids(store)
    launch.click()
    wait_until(lambda: plotted_points(page) > 0, UI, "a first live point")
    builds0, patches0 = wait_until(lambda: live_stats(page), UI, "the live counters")
    n0 = plotted_last_step(page)
    seen = []

    def grown():
        stats, n = live_stats(page), plotted_last_step(page)
        seen.append((stats, n))
        return stats and stats[1] >= patches0 + 20 and n > n0 and stats

    builds, patches = wait_until(grown, RUN, f"twenty figure patches that add points (from {(builds0, patches0, n0)})")
    # the refreshes that added points patched the kept figures (counters are per figure: a rebuild of all
    # live figures on every refresh would add a build per figure and no patch); rebuilds only when a run changes
    # state (or for a figure that is not a curve)
    assert 2 * (builds - builds0) <= patches - patches0, (builds0, patches0, builds, patches, seen[-5:])
    assert new_runs(store, before)  # (the comparison really runs in the store)
    cancel_all(page, store)  # stop them (in words: "cancelled by you")
    status = page.locator(".st-key-live-status")
    wait_until(lambda: status.get_by_text("cancelled by you").count() >= 1, UI, "cancelled in words")
    page.close()
