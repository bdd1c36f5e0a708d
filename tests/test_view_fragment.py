"""The Train page's live view controls (x unit, smoothing, MID layout) rerun only the live view's fragment, in a
real browser (reuses tests/test_browser.py's Streamlit server and Chromium; issue 59, point 1).

A finished comparison (the lab's shipped example runs, written into the shared store as workers write them) is
opened on the Train page; switching its x axis steps → epochs redraws the live MID chart with epochs while the
page's script does not run again (its "page runs" counter in the live view's caption stays, the fragment's "view
runs" goes up, and the browser asked for a fragment rerun), the figures are redrawn from the frames already read,
and the URL keeps the setting: a reload shows epochs. Every wait polls the page (never a fixed sleep).
"""
from __future__ import annotations

import os
import re
import time

import pytest

from tests.test_browser import CHROMIUM, UI, _RERUNS, click_until, rerun_of, wait_until, watched_page
from tests.test_browser import server  # noqa: F401 - a pytest fixture
from tests.test_browser_preset import shown

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"the browser tests need Debian's chromium at {CHROMIUM} (apt-get install chromium)")

GROUP = "cmp-view-fragment"
PLOT = ".st-key-chart-live-mid .js-plotly-plot"
# the live MID chart's x axis titles (a facet per tier: one x axis each)
X_TITLES = f"""() => {{
  const gd = document.querySelector({PLOT!r});
  if (!gd || !gd._fullLayout) return null;
  return Object.keys(gd._fullLayout).filter(k => /^xaxis\\d*$/.test(k))
    .map(k => String((gd._fullLayout[k].title || {{}}).text || '')).join(' | ');
}}"""


def counters(page) -> dict | None:
    """The live view caption's counters: figures built and patched, page script runs, fragment runs."""
    box = page.locator(".st-key-live-stats")
    if not box.count():
        return None
    text = box.inner_text()
    m = re.search(r"built (\d+)× · patched (\d+)×.*page runs (\d+) · view runs (\d+)", text, re.S)
    return dict(zip(("built", "patched", "page", "view"), map(int, m.groups()))) if m else None


@pytest.fixture(scope="module")
def finished_comparison(server):  # noqa: F811 - a fixture
    """The shipped example runs (three seeds of IDP-SGD and INO-SGD, finished) as one comparison of the store."""
    from engine.tools.demo import example_runs

    _, store, _ = server
    for run in example_runs():
        rid = store.create_run(run["config"], group_id=GROUP)
        store.start_run(rid, pid=os.getpid(), total_steps=run["total_steps"], plan=run["plan"])
        for e in run["evals"]:
            store.log_eval(rid, e["step"], e)
        store.update_progress(rid, run["total_steps"])
        store.finish_run(rid, {})
    return GROUP


def test_the_x_axis_switch_reruns_only_the_live_view(server, browser, finished_comparison):  # noqa: F811
    url, _, _ = server
    page = watched_page(browser, viewport={"width": 1440, "height": 1300})
    page.goto(url + f"train?dataset=digits&group={finished_comparison}")
    wait_until(lambda: "step" in (page.evaluate(X_TITLES) or ""), UI, "the live MID chart on steps")
    before = wait_until(lambda: counters(page), UI, "the live view's counters")

    reruns = _RERUNS[page]
    mark = len(reruns.events)
    option = page.get_by_role("option", name="epochs", exact=True)
    click_until(page.locator(".st-key-xaxis input"), lambda: option.count() > 0, "the x axis list to open")
    start = time.monotonic()
    option.click()
    wait_until(lambda: "epoch" in (page.evaluate(X_TITLES) or ""), UI, "the live MID chart redrawn on epochs",
               interval=0.05)
    took = time.monotonic() - start  # from the click on the option
    after = wait_until(lambda: (c := counters(page)) and c["view"] > before["view"] and c, UI,
                       "the fragment's run counted")
    print(f"x axis steps → epochs: chart redrawn in {took:.2f} s (load {os.getloadavg()[0]:.1f})")
    assert after["page"] == before["page"], (before, after)  # the page's script did not run again
    assert after["built"] > before["built"]  # the figures were drawn for the new unit
    reruns.pump()
    asked = [fid for kind, fid in reruns.events[mark:] if kind == "sent"]
    assert asked and all(asked), asked  # every rerun the browser asked for was the fragment's

    # the MID layout too: the fragment alone; and the URL keeps both settings
    with rerun_of(page):
        page.locator(".st-key-mid_layout").get_by_text("overlay", exact=True).click()
    wait_until(lambda: (c := counters(page)) and c["view"] > after["view"], UI, "the layout's fragment run")
    assert counters(page)["page"] == before["page"]
    wait_until(lambda: "xaxis=epochs" in page.url and "mid_layout=overlay" in page.url, UI, "the URL to keep them")
    page.reload()
    wait_until(lambda: shown(page, "xaxis") == "epochs", UI, "the x axis from the URL after a reload")
    wait_until(lambda: "epoch" in (page.evaluate(X_TITLES) or ""), UI, "the chart on epochs after a reload")
    page.close()
