"""Results and the TIF sweep in a real browser (Playwright drives Debian's Chromium against ``streamlit run
app.py`` on a temporary run store: the module's own fresh one where a page must find no run of the user's, or
whose layout is checked with known content; else the one the browser modules share).

* On a fresh store Results shows the lab's example runs (``engine.tools.demo.example_runs``), labelled
  "example", and its first chart, the recall gain INO − IDP over training, plots the example's positive
  gain for the most private tier: the test reads the plotted data out of the page and checks it against
  the engine's frames.
* The Results page's "For a talk" table shows its data rows in the app (the Plotly table showed its header; issue
  16, point 5).
* The TIF explorer launches a tiny sweep (small digits runs: one IDP-SGD reference and a 2 × 1 grid of
  INO-SGD runs) whose heatmap appears on the page with the gains the engine computes from the store.

Every wait polls the page or the store with generous limits (a loaded 2-core machine); none sleeps a
fixed time.
"""
from __future__ import annotations

import math
import os

import pytest
# the shared app, this module's own app on a fresh store, and the browser (fixtures of test_browser.py)
from test_browser import (CHROMIUM, RUN, UI, UI_MS, app_idle, outside_figure, own_server,  # noqa: F401
                          server, shot_path)
from test_browser import wait_until as poll

TRAINS = False  # its own app (own_server) launches no run: no standby workers there

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"the browser tests need Debian's chromium at {CHROMIUM} (apt-get install chromium)")

# what a Plotly chart of the page plots: the div's decoded traces (typed arrays as plain lists); none while
# Plotly is still (re)drawing the div after a refresh (no _fullData yet), so the polls simply ask again
TRACES_JS = """el => (el._fullData || []).map(t => ({
    name: t.name, type: t.type,
    y: t.y ? Array.from(t.y) : null,
    z: t.z ? Array.from(t.z, r => (r === null || typeof r !== 'object') ? r : Array.from(r)) : null,
    x: t.x ? Array.from(t.x) : null}))"""


def open_page(browser, url: str, name: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.set_default_timeout(UI_MS)
    page.goto(url)
    page.locator('[data-testid="stSidebarNav"]').get_by_role("link", name=name).click()
    page.get_by_role("heading", name=name).first.wait_for()
    return page


def traces(page, key: str) -> list[dict]:
    chart = page.locator(f".st-key-chart-{key} .js-plotly-plot").first
    chart.wait_for()
    return chart.evaluate(TRACES_JS)


def test_results_on_a_fresh_store_shows_the_example_ino_gain(own_server, browser):  # noqa: F811 - fixtures
    demo = pytest.importorskip("engine.tools.demo", reason="engine.tools.demo (the shipped example runs) is not in this build")
    from engine.figures import frames
    from engine.figures import talk_frames as tf

    url, store, _ = own_server
    assert not store.list_runs()  # a fresh store: nothing of the user's own
    try:
        runs = demo.example_runs()
    except OSError as e:
        pytest.skip(f"the example runs are not written yet ({e})")
    tier, _ = tf.most_private_tier(runs)
    gain = frames.recall_gain_over_time(runs)
    curve = gain[gain.tier == tier].groupby("step")["gain"].mean()  # mean over the example's paired seeds
    assert curve.max() > 0

    page = open_page(browser, url, "Results")
    page.locator(".st-key-example-note").get_by_text("Example runs").wait_for()
    page.locator(".st-key-headline").get_by_text(f"INO gain, {tier} recall AUC").wait_for()
    plotted = poll(lambda: [t for t in traces(page, "res-gain-time") if t["y"] and (t["name"] or "").startswith(tier)],
                   120, "the gain chart's traces of the most private tier")
    ys = [y for t in plotted for y in t["y"] if y is not None and math.isfinite(y)]
    assert max(ys) > 0
    # the example's peak gain, in recall points (the chart's unit, as its sentence's)
    assert any(abs(y - 100 * curve.max()) < 1e-6 for y in ys), (100 * curve.max(), max(ys))
    mid = page.locator(".st-key-chart-res-mid")
    assert mid.locator(".js-plotly-plot").count() == 1  # the MID chart next to it: IDP and INO, most private tier
    mid.scroll_into_view_if_needed()
    mid.screenshot(path=str(shot_path("mid_overlay.png")))  # the overlay a talk wants (README, docs/screenshots)
    page.close()


def _fill(page, key: str, value: str) -> None:
    box = page.locator(f".st-key-{key} input")
    box.fill(value)
    box.press("Enter")


def test_the_talk_table_shows_its_rows_in_the_app(own_server, browser):  # noqa: F811 - fixtures
    pytest.importorskip("engine.tools.demo", reason="the shipped example runs are not in this build")
    url, _, _ = own_server  # a fresh store: the table shows the example comparison
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.set_default_timeout(UI_MS)
    page.goto(url + "results")
    table = page.locator(".st-key-talk-table [data-testid='stDataFrame']")
    table.wait_for()
    table.scroll_into_view_if_needed()
    # the grid's accessible table: its header row and one row per algorithm of the example comparison
    rows = table.locator("table tr")
    poll(lambda: rows.count() >= 3, UI, "the talk table's data rows")
    text = table.locator("table").inner_text()
    assert "INO-SGD" in text and "IDP-SGD" in text and "±" in text, text
    assert "-0.0" not in text and "−0.0" not in text, text
    box = table.bounding_box()
    assert box["height"] >= 3 * 30, box  # header + rows drawn, not the header alone
    page.close()


def test_tif_explorer_launches_a_sweep_whose_heatmap_appears(server, browser):  # noqa: F811 - fixtures
    from engine.jobs.runs import run_record
    from engine.tools import sweep

    url, store, _ = server
    page = open_page(browser, url, "TIF explorer")
    page.get_by_role("button", name="Launch sweep").wait_for()
    _fill(page, "sw_xv", "0.5, 4")
    _fill(page, "sw_yv", "0.5")
    _fill(page, "sw_epochs", "1")
    _fill(page, "sw_max", "300")
    launch = page.get_by_role("button", name="Launch sweep")
    poll(lambda: launch.is_enabled() and page.get_by_text("3 runs ×").count() > 0, 120, "the sweep's plan (3 runs)")
    launch.click()

    rows = poll(lambda: [r for r in store.list_runs() if sweep.is_sweep_group(r["group_id"])], 120, "the sweep's runs")
    assert len(rows) == 3 and len({r["group_id"] for r in rows}) == 1
    finished = poll(lambda: (lambda rs: rs if all(r["status"] == "finished" for r in rs) else None)(
        store.list_runs(group_id=rows[0]["group_id"])), RUN, "the sweep's runs to finish")
    records = [run_record(store, r["id"]) for r in finished]
    assert sorted(r["config"]["algorithm"]["alpha"] for r in records if r["algorithm"] == "ino") == [0.5, 4.0]
    expect = sweep.sweep_frame(records).sort_values("x")
    assert len(expect) == 2 and list(expect["x"]) == [0.5, 4.0]

    page.get_by_text("3/3 runs finished").wait_for()  # the page's live view has seen every run end
    seen = []

    def heatmap():  # the heatmap, once its refresh shows the finished runs' gains in every cell
        hm = [t for t in traces(page, "x-sweep") if t["type"] == "heatmap"]
        seen[:] = hm[:1]
        if hm and hm[0]["z"] and all(v is not None for row in hm[0]["z"] for v in row) and \
                hm[0]["z"][0] == pytest.approx(list(expect["gain"]), abs=1e-6):
            return hm[0]
        return None

    try:
        hm = poll(heatmap, 120, "the sweep heatmap with the finished runs' gains")
    except AssertionError:
        raise AssertionError(f"heatmap plotted {seen}, the engine computes {list(expect['gain'])}") from None
    assert hm["x"] == ["0.5", "4"] and hm["y"] == ["0.5"]
    page.close()


def test_a_cancelled_and_a_finished_run_are_compared_over_the_steps_both_reached(server, browser):  # noqa: F811 - fixtures
    """The tour's case: IDP-SGD cancelled at step 901 of 1406 beside a finished INO-SGD run whose recall is the same
    over those steps. Results (with "Include unfinished") says the span above the headline, and the headline's INO
    gain is the one over the steps both reached (0.0 pp), not each run's own-length AUC's (+10.8 pp)."""
    from test_common_span import case_one, own_length_gain, stored

    url, store, _ = server
    runs = case_one()
    assert own_length_gain(runs) > 10  # what the page said before
    ids = stored(store.path, runs)
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.set_default_timeout(UI_MS)
    page.goto(url + f"results?all=true&runs=IDP-SGD+%28SAMPLE%29+%23{ids[0]}&runs=INO-SGD+%23{ids[1]}")
    note = page.locator(".st-key-span-note")
    poll(lambda: "Compared over steps 0–901, which both runs reached" in (note.text_content() or ""), RUN,
         "the span above the headline")
    assert f"IDP-SGD (SAMPLE) #{ids[0]} was cancelled at 64 %" in note.text_content()
    gain = page.locator(".st-key-headline [data-testid='stMetricValue']").first
    poll(lambda: gain.text_content() == "0.0 pp", RUN, "the headline's gain over the common steps")
    page.close()


CLIPPED_JS = """keys => keys.map(key => {
  const root = document.querySelector('.st-key-' + key);
  if (!root) return [key, null];
  const cut = [...root.querySelectorAll('*')].filter(e => {
    if (!e.clientWidth || e.scrollWidth <= e.clientWidth + 2) return false;
    const st = getComputedStyle(e);
    if (st.overflowX === 'auto' || st.overflowX === 'scroll') return true;  // a table that scrolls sideways
    return (e.tagName === 'INPUT' || (e.textContent || '').trim()) &&  // text cut off
           (st.overflowX !== 'visible' || st.textOverflow === 'ellipsis');
  }).map(e => (e.value || e.textContent || e.className || '').slice(0, 60));
  return [key, cut];
})"""


@pytest.mark.parametrize("path, keys", [
    ("train", ["group_pick"]),  # the comparison picker: its run numbers
    ("tif", ["x_shape"]),  # the TIF shape buttons
    ("audit", ["a_algos"]),  # the audit's algorithm chips
    ("results?all=true", ["talk-table"]),  # the talk table's last column
])
def test_nothing_is_cut_off(own_server, browser, path, keys):  # noqa: F811 - fixtures
    """The widgets the tour found clipped show all of their text at 1400 × 900 (a laptop's browser window)."""
    from test_common_span import stored
    from test_plots import make_run

    url, store, _ = own_server
    if not store.list_runs(group_id="cmp-cut-off"):  # content for the pickers and tables: two INO/IDP pairs
        stored(store.path, [make_run(k, "idp_sample" if k % 2 else "ino", group="cmp-cut-off") for k in range(1, 5)])
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(UI_MS)
    page.goto(url + path)
    poll(lambda: app_idle(page) and all(page.locator(f".st-key-{k}").count() for k in keys), RUN,
         f"the widgets {keys} drawn")
    if path.startswith("results"):
        page.locator(".st-key-talk-table canvas").first.wait_for()  # the table's grid drawn
    got = page.evaluate(CLIPPED_JS, keys)
    assert all(not cut for _, cut in got), got
    if path.startswith("results"):  # and the full-width charts' titles stay inside their figure (wrapped)
        page.locator(".st-key-chart-res-ino svg.main-svg").first.wait_for()
        assert outside_figure(page, "res-ino") == [], outside_figure(page, "res-ino")
    page.close()
