"""The Train page's live charts keep the user's view while they refresh (issue 16), in a real browser (reuses
tests/test_browser.py's Streamlit server and Chromium).

While a digits comparison runs, the user zooms the live MID chart (a box drag, as with the mouse) and hides a
curve (a click on its legend entry); the chart then gets new data refresh after refresh, and the zoom and the
hidden curve stay, on the same plot element, through the live refreshes and once the runs are stopped. A
double-click on the plot resets the view to the whole curve (Plotly's default).

The chart is app_pages/_plotly_live.py's (one plot div across reruns, new figures through Plotly.react); the
page loads plotly.js from the lab's own server, never from the internet. Every wait polls the page or the
store with generous limits (never a fixed sleep).
"""
from __future__ import annotations

import os
from urllib.parse import urlparse

import pytest

from tests.test_browser import CHROMIUM, RUN, UI, cancel_all, rerun_of, wait_until, watched_page
from tests.test_browser import server  # noqa: F401 - a pytest fixture
from tests.test_browser_preset import choose

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"the browser tests need Debian's chromium at {CHROMIUM} (apt-get install chromium)")

PLOT = ".st-key-chart-live-mid .js-plotly-plot"
REFRESHES = 5  # live redraws with new data that the view must survive

# What the live MID chart shows: its draws so far (the component counts them on the div), the first x axis'
# range, the largest x drawn on it, each trace's visibility, and whether the div is still the one the test marked.
READ = f"""() => {{
  const gd = document.querySelector({PLOT!r});
  if (!gd || !gd._fullLayout || !gd._fullData) return null;
  const ax = gd._fullLayout.xaxis;
  let last = -1;
  for (const t of gd._fullData)
    if (t.visible === true && (t.xaxis || 'x') === 'x' && t.x)
      for (const x of t.x) if (typeof x === 'number' && x > last) last = x;
  return {{updates: Number(gd.dataset.updates || 0), range: ax.range.slice(), autorange: ax.autorange === true,
           last, marked: gd.__zoomTest === true,
           traces: gd._fullData.map(t => ({{uid: String(t.uid), name: String(t.name || ''), visible: t.visible,
                                            legend: t.showlegend !== false}}))}};
}}"""


def read(page) -> dict | None:
    try:
        return page.evaluate(READ)
    except Exception:  # the page is navigating or the fragment is replacing the element: read again
        return None


def subplot_box(page) -> dict | None:
    """The first subplot's drag area (x axis 'x'), in the viewport's pixels, the plot scrolled into view first
    (the mouse only reaches what is on screen); None while a redraw has none. Read in one step in the page:
    each redraw replaces Plotly's drag rectangles, so a locator on one would keep going stale."""
    page.locator(PLOT).scroll_into_view_if_needed()
    box = page.evaluate(f"""() => {{
      const area = document.querySelector({PLOT!r} + " .nsewdrag[data-subplot='xy']");
      if (!area) return null;
      const r = area.getBoundingClientRect();
      return r.width > 0 ? {{x: r.x, y: r.y, width: r.width, height: r.height}} : null;
    }}""")
    return box


def legend_entry(page) -> dict | None:
    """The middle of the first legend entry's toggle area (viewport pixels) and its text; None while a redraw
    has none."""
    page.locator(PLOT).scroll_into_view_if_needed()
    entry = page.evaluate(f"""() => {{
      const item = document.querySelector({PLOT!r} + " .legend .traces");
      const toggle = item && item.querySelector(".legendtoggle");
      if (!toggle) return null;
      const r = toggle.getBoundingClientRect();
      return r.width > 0 ? {{x: r.x + r.width / 2, y: r.y + r.height / 2, name: item.textContent}} : null;
    }}""")
    return entry


def drag_zoom(page) -> None:
    """A horizontal box drag over the middle of the first subplot: Plotly zooms its x axis to it."""
    box = subplot_box(page)
    if box is None:
        return
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + 0.3 * box["width"], y)
    page.mouse.down()
    for f in (0.35, 0.45, 0.55, 0.6):  # in steps, as a hand drags (Plotly draws the zoom box on move events)
        page.mouse.move(box["x"] + f * box["width"], y + 2)
    page.mouse.up()


def test_zoom_and_legend_clicks_survive_live_refreshes(server, browser):  # noqa: F811 - pytest fixtures
    url, store, _ = server
    page = watched_page(browser, viewport={"width": 1440, "height": 1300})
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    # ~125 000 steps, an evaluation every 5: the runs outlast the refreshes the test watches (then cancelled)
    page.goto(url + "train?dataset=digits&max_train=400&batch=64&epochs=20000&eval_every=5&momentum=0.0")
    page.get_by_role("button", name="Got it").click()
    launch = page.get_by_role("button", name="Launch comparison")
    wait_until(lambda: launch.is_enabled(), UI, "the launch button")
    launch.click()
    first = wait_until(lambda: (r := read(page)) and r["last"] > 0 and r["updates"] >= 2 and r, UI,
                       "the live MID chart with its first points")
    page.evaluate(f"() => {{ document.querySelector({PLOT!r}).__zoomTest = true; }}")  # this div, not a new one

    # zoom: a box drag (again if a redraw landed mid-drag); the curves keep growing to the right of it
    def zoomed():
        r = read(page)
        if r and not r["autorange"]:
            return r
        drag_zoom(page)
        return None

    view = wait_until(zoomed, UI, f"the x axis zoomed by a box drag (from {first})", interval=1.0)
    zoom = view["range"]
    # hide a curve: a click on its legend entry (Plotly waits out a possible double-click before hiding it);
    # clicked again only if the first click was lost (a second one that landed would show the curve again)
    def hidden_curve():
        return (r := read(page)) and any(t["visible"] == "legendonly" for t in r["traces"]) and r

    for _ in range(5):
        entry = wait_until(lambda: legend_entry(page), UI, "the live MID chart's legend")
        page.mouse.click(entry["x"], entry["y"])
        try:
            view = wait_until(hidden_curve, 30, f"the curve {entry['name']!r} hidden by its legend entry")
            break
        except AssertionError:
            continue
    else:
        raise AssertionError("five clicks on the first legend entry hid no curve")
    hidden = [t["uid"] for t in view["traces"] if t["visible"] == "legendonly"]

    def kept(r):
        """The zoom and the hidden curve on the marked div (else the AssertionError says what was lost)."""
        assert r["marked"], "the live MID chart's plot element was replaced"
        assert not r["autorange"] and r["range"] == pytest.approx(zoom), (r["range"], zoom)
        state = {t["uid"]: t["visible"] for t in r["traces"]}
        assert all(state.get(uid) == "legendonly" for uid in hidden), (hidden, state)

    # refreshes with new data: more draws, a longer curve; after each, the view is the user's
    seen = [view]

    def refreshed():
        r = read(page)
        if r is None:
            return None
        kept(r)
        if r["last"] > seen[-1]["last"]:
            seen.append(r)
        return len(seen) > REFRESHES and r

    after = wait_until(refreshed, RUN, f"{REFRESHES} live refreshes with new data (from {view['last']})")
    assert after["updates"] >= view["updates"] + REFRESHES, (view["updates"], after["updates"])

    # stop the runs (the page reruns once more and the polling ends): the view is still the user's
    cancel_all(page, store)
    status = page.locator(".st-key-live-status")
    wait_until(lambda: status.get_by_text("cancelled by you").count() >= 2, UI, "both runs cancelled in words")
    kept(wait_until(lambda: read(page), UI, "the live MID chart after the runs stopped"))

    # a double-click resets the view: the whole curve again
    def reset():
        r = read(page)
        if r and r["autorange"]:
            return r
        box = subplot_box(page)
        if box is not None:
            page.mouse.dblclick(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        return None

    whole = wait_until(reset, UI, "the view reset by a double-click", interval=1.0)
    assert whole["range"][1] - whole["range"][0] > zoom[1] - zoom[0], (whole["range"], zoom)
    assert whole["range"][1] >= whole["last"], (whole["range"], whole["last"])

    # a kept view belongs to its units: zoomed again, the chart re-ranges to its whole curve when the x unit
    # changes (steps → epochs) and when the layout does (facet → overlay); a zoom on steps would hide every curve
    def overlay():
        with rerun_of(page):
            page.locator(".st-key-mid_layout").get_by_text("overlay", exact=True).click()

    for what, change in (("the x axis to epochs", lambda: choose(page, "xaxis", "epochs")),
                         ("the MID layout to overlay", overlay)):
        again = wait_until(zoomed, UI, f"the x axis zoomed again before {what}", interval=1.0)["range"]
        change()
        fresh = wait_until(lambda: (r := read(page)) and r["autorange"] and r["last"] > 0 and r, UI,
                           f"the chart re-ranged after {what} (zoomed to {again})")
        assert fresh["range"][0] <= 0 < fresh["last"] <= fresh["range"][1], (what, fresh["range"], fresh["last"])

    # plotly.js came from the lab's server (the plotly package's copy), nothing from elsewhere
    host = urlparse(url).netloc
    scripts = [u for u in requests if "plotly" in u.lower()]
    assert any("/component/" in u and u.split("?")[0].endswith("/plotly.min.js") for u in scripts), scripts
    assert all(urlparse(u).netloc == host for u in requests if urlparse(u).scheme in ("http", "https")), \
        sorted({urlparse(u).netloc for u in requests})
    page.close()
