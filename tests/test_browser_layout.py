"""Charts that hold many series (issue 38 point 4), measured in a real browser: for 1, 2 and 4 INO/IDP pairs the
gain-over-training chart, and for 6 audited algorithms the GPR and ε-bound charts, keep every title, note and
legend out of every plot area and out of each other, inside the figure, and every plot area at least
MIN_PLOT_PX tall — the gain chart at the width of a
half-width column of the page (its title and notes wrapped as the page wraps them) and at full width, the audit
charts (full width on the Audit page) at full width.

Issue 58 point 7, at 1400 × 900: the ε-spent chart of 3 and 4 runs (as a page of its own, half and full width, and
on the Train page of the shared app), the one-run audit figure's note (its subtitle) at the Audit page's width, the
status badges of runs that ended each way (each whole: the state in a word), and the Runs table (every column within
its width: no horizontal scroll).

Each figure is the engine's own (engine.figures), written as a Plotly HTML page (plotly.js from the plotly package,
beside it in a temporary folder: nothing from the internet) and opened in Debian's Chromium; the boxes are read
from what Plotly drew (the SVG), so what is checked is what a researcher sees.
"""
from __future__ import annotations

import os

import pytest

from engine.config.run import RunConfig
from engine.figures import frames, scaffold, training
from engine.figures.audit import MAX_GROUPED_ALGORITHMS, fig_epsilon_bounds, fig_gpr_bars
from engine.figures.one_run import claimed_vs_empirical
from tests.test_browser import CHROMIUM, UI, UI_MS, server, wait_until  # noqa: F401 (server: a fixture)
from tests.test_layout_fit import three_runs
from tests.test_one_run_figures import make_report
from tests.test_plots import make_run

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"the browser tests need Debian's chromium at {CHROMIUM} (apt-get install chromium)")

NARROW_PX, WIDE_PX = 640, 1400  # a half-width column of the wide page on a laptop; a full-width chart
PAGE_PX = 938  # a full-width chart of a page at 1400 × 900, the sidebar beside it (measured: the Runs table's box)
MIN_PLOT_PX = 180  # a plot area squeezed below this by notes and legends (the tour saw a thin strip) is a problem

# Every box Plotly drew that must stay clear: the title, each annotation (notes, panel titles), the legend; and the
# plot areas (each subplot's drag rectangle). Viewport pixels.
BOXES = """() => {
  const svg = document.querySelector('svg.main-svg');
  const box = e => { const r = e.getBoundingClientRect(); return {x0: r.left, y0: r.top, x1: r.right, y1: r.bottom}; };
  const named = (sel, kind) => [...document.querySelectorAll(sel)].filter(e => e.getBoundingClientRect().width > 0)
      .map(e => ({kind, text: (e.textContent || '').slice(0, 60), ...box(e)}));
  return {figure: box(svg),
          texts: [...named('.gtitle', 'title'), ...named('.gtitle-subtitle', 'subtitle'),
                  ...named('.annotation-text-g', 'note'), ...named('.legend .bg', 'legend')],
          plots: named('.nsewdrag', 'plot')};
}"""

BOXES_IN = "root => (" + BOXES.replace("document.", "root.") + ")()"  # the same, in one chart of a page


def overlap(a: dict, b: dict, slack: float = 2.0) -> bool:
    return min(a["x1"], b["x1"]) - max(a["x0"], b["x0"]) > slack and min(a["y1"], b["y1"]) - max(a["y0"], b["y0"]) > slack


def problems(page, fig, width: int, tmp_path, name: str) -> list[str]:
    """What overlaps what (or leaves the figure) in ``fig`` drawn ``width`` px wide."""
    path = tmp_path / f"{name}-{width}.html"
    fig.write_html(path, include_plotlyjs="directory", full_html=True, default_width=f"{width}px",
                   config={"responsive": False})
    page.set_viewport_size({"width": width + 40, "height": 1000})
    page.goto(path.as_uri())
    page.wait_for_selector("svg.main-svg .legend, svg.main-svg .gtitle", timeout=UI_MS)
    got = page.evaluate(BOXES)
    assert got["plots"], f"{name}: no plot area drawn"
    return boxes_problems(got)


def boxes_problems(got: dict) -> list[str]:
    """What overlaps what (or leaves the figure) among the boxes :data:`BOXES` read."""
    out, f = [], got["figure"]
    for t in got["texts"]:
        if t["x0"] < f["x0"] - 1 or t["x1"] > f["x1"] + 1 or t["y0"] < f["y0"] - 1 or t["y1"] > f["y1"] + 1:
            out.append(f"{t['kind']} {t['text']!r} leaves the figure")
        out += [f"{t['kind']} {t['text']!r} over a plot area" for p in got["plots"] if overlap(t, p)]
    for i, a in enumerate(got["texts"]):
        out += [f"{a['kind']} {a['text']!r} over {b['kind']} {b['text']!r}" for b in got["texts"][i + 1:]
                if overlap(a, b)]
    out += [f"a plot area only {p['y1'] - p['y0']:.0f} px tall" for p in got["plots"] if p["y1"] - p["y0"] < MIN_PLOT_PX]
    return out


def pairs(n: int) -> list[dict]:
    """``n`` INO-SGD/IDP-SGD pairs, each its own comparison (group) on its own seed (the same config and seed would
    be reruns of one pair, counted once)."""
    runs = []
    for k in range(n):
        pair = [make_run(2 * k + 1, "idp_sample", group=f"g{k}"),
                make_run(2 * k + 2, "ino", group=f"g{k}", gain=0.02 * (k + 1))]
        for run in pair:
            run["config"]["seed"] = k
        runs += pair
    return runs


def six_algorithms() -> dict:
    """An audit's results (the store's summary shape) of six algorithms on two groups and three tiers."""
    groups, tiers = ["Female", "Male"], ["ε=1", "ε=2", "ε=3"]
    algos = []
    for k, name in enumerate(("nonprivate", "dpsgd", "idp_sample", "idp_scale", "ino", "dpsgd_s")):
        algos.append({
            "key": name, "name": name, "label": {"dpsgd_s": "DP-SGD-S", "ino": "INO-SGD"}.get(name, name.upper()),
            "formal_dp": name != "nonprivate", "null_floor": 0.05, "resolved": k % 2 == 0,
            "gpr": {"groups": {g: {"mean": 0.1 + 0.02 * k + 0.1 * j, "low": 0.05, "high": 0.3}
                               for j, g in enumerate(groups)},
                    "delta": {"value": 10.0, "low": 2.0, "high": 18.0}},
            "accuracy": {"mean": 0.8, "std": 0.01, "min": 0.78, "max": 0.82, "groups": {g: 0.8 for g in groups}},
            "epsilon": {"tiers": [{"name": t, "claimed": 1.0 + j, "target": 1.0 + j, "lower_bound": 0.2 * (j + 1),
                                   "tpr": 0.2, "fpr": 0.1} for j, t in enumerate(tiers)], "confidence": 0.95},
        })
    return {"algorithms": algos, "group_names": groups, "group_sizes": {g: 100 for g in groups},
            "threshold": "in_sample", "n_models": 400, "n_train": 2000, "group_by": "attribute",
            "config": {"group_attribute": "sex"}}


@pytest.mark.parametrize("n", [1, 2, 4])
def test_the_gain_chart_holds_its_pairs(browser, tmp_path, n):
    fig = training.fig_recall_gain_over_time(frames.recall_gain_over_time(pairs(n)))
    panels = [a for a in fig.layout.annotations if a.name != "gain_spread"]
    assert len(panels) == (n if n > 1 else 0)  # small multiples: a titled panel per pair beyond one
    page = browser.new_page()
    narrow = scaffold.wrap_title(fig, 52, note_width=62)  # as the page draws it in a half-width column
    found = problems(page, narrow, NARROW_PX, tmp_path, f"gain{n}") + problems(page, fig, WIDE_PX, tmp_path, f"gain{n}")
    page.close()
    assert not found, found


def test_the_audit_charts_hold_six_algorithms(browser, tmp_path):
    report = six_algorithms()
    page = browser.new_page()
    found = []
    for name, fig in (("gpr", fig_gpr_bars(report)), ("epsilon", fig_epsilon_bounds(report))):
        assert len(fig.layout.annotations) >= 6 > MAX_GROUPED_ALGORITHMS  # one titled panel per algorithm
        assert "Δ not resolved" not in (fig.layout.title.text or "")  # said below the plot, not in the title
        found += [f"{name}: {p}" for p in problems(page, fig, WIDE_PX, tmp_path, name)]
    page.close()
    assert not found, found


@pytest.mark.parametrize("n", [3, 4])
def test_the_epsilon_chart_holds_three_and_more_runs(browser, tmp_path, n):
    """Issue 58 point 7: with 3 runs the ε-spent chart's panel titles ran into each other, the last cut at the edge
    (three panels in a row of a half-width column). Drawn as the Train page draws it (half width, wrapped) and
    full width: no title, note or legend over another or out of the figure."""
    (spec,) = training.build_figures(three_runs(n), names=["epsilon_spent"])
    page = browser.new_page()
    narrow = scaffold.wrap_title(spec.figure, 52, note_width=62)
    found = problems(page, narrow, NARROW_PX, tmp_path, f"eps{n}") + \
        problems(page, spec.figure, WIDE_PX, tmp_path, f"eps{n}")
    page.close()
    assert not found, found


@pytest.mark.parametrize("width", [PAGE_PX, WIDE_PX])
def test_the_one_run_note_is_whole_inside_the_figure(browser, tmp_path, width):
    """Issue 58 point 7: the one-run audit figure's note (its subtitle) ended mid-word at the figure's edge
    ("… · lin"). Both canary kinds, a broken claim, a partial report: every line inside the figure."""
    fig = claimed_vs_empirical(make_report(broken=True, partial=True), kind="both")
    page = browser.new_page()
    found = problems(page, fig, width, tmp_path, "one-run")
    page.close()
    # the broken bar's own annotation points at the bar: inside its plot area by design
    found = [p for p in found if not (p.startswith("note 'exceeds claim") and p.endswith("over a plot area"))]
    assert not found, found


# --- the pages at 1400 × 900 (issue 58 point 7): the status badges and the Runs table --------------------------

LAPTOP = {"width": 1400, "height": 900}
BADGES = "cmp-layout-badges"
# a text cut by its box: an element (or its text) wider than it shows, whose overflow is hidden (an ellipsis)
CUT = """root => [...root.querySelectorAll('*')].filter(e => {
    const s = getComputedStyle(e);
    return e.scrollWidth > e.clientWidth + 1 && e.clientWidth > 0 && (s.overflowX === 'hidden' || s.overflowX === 'clip'
        || s.textOverflow === 'ellipsis');
  }).map(e => (e.textContent || '').trim().slice(0, 60))"""

# each status badge's words (its icon, a ligature, left out)
BADGE_WORDS = """root => [...root.querySelectorAll('.stMarkdownBadge')].map(b => [...b.childNodes]
    .filter(n => !(n.nodeType === 1 && n.getAttribute('role') === 'img')).map(n => n.textContent).join('').trim())"""


@pytest.fixture(scope="module")
def ended_runs(server):  # noqa: F811 - a fixture
    """One comparison of four runs that ended each way a badge says (none trains: rows of the shared store)."""
    _, store, _ = server
    config = RunConfig().replace(**{"data.name": "digits", "model.name": "lr"})
    ids = {s: store.create_run(config, group_id=BADGES, name=f"ended {s}") for s in
           ("diverged", "failed", "cancelled", "interrupted")}
    store.finish_runs({ids["diverged"]: {"diverged_step": 13}}, {ids["diverged"]: "diverged"})
    store.set_status(ids["failed"], "failed", "ValueError: the learning rate schedule ended before the first step")
    store.set_status(ids["cancelled"], "cancelled", "cancelled by the user at step 40")
    store.set_status(ids["interrupted"], "interrupted", "worker process 7 ended")
    return ids


def test_the_status_badges_are_whole(server, browser, ended_runs):  # noqa: F811
    """The badge of a diverged run read "diverged (see th…": each badge is the state in a word, whole, its detail in
    the caption beside it."""
    url, _, _ = server
    page = browser.new_page(viewport=LAPTOP)
    page.goto(url + f"train?dataset=digits&group={BADGES}")
    rows = page.locator(".st-key-live-status")
    wait_until(lambda: all(f"ended {s} #{i}" in (rows.text_content() if rows.count() else "")
                           for s, i in ended_runs.items()), UI, "the four runs' status rows")
    badges = rows.evaluate(BADGE_WORDS)
    cut = rows.evaluate(CUT)
    text = rows.text_content()
    page.close()
    assert sorted(badges) == sorted(ended_runs), badges
    assert not cut, cut
    assert "diverged at step 13" in text and "cancelled by you" in text and "worker stopped" in text


EPSILON_GROUP = "cmp-layout-epsilon"


@pytest.fixture(scope="module")
def epsilon_runs(server):  # noqa: F811 - a fixture
    """Four finished runs of one comparison with their evaluations (test_layout_fit's: a DP-SGD-S run without a
    formal guarantee, a long name), written into the shared store as a worker writes them."""
    _, store, _ = server
    ids = []
    for run in three_runs(4):
        rid = store.create_run(run["config"], group_id=EPSILON_GROUP, name=run["name"] or None)
        store.start_run(rid, pid=os.getpid(), total_steps=run["total_steps"], plan=run["plan"])
        for e in run["evals"]:
            store.log_eval(rid, e["step"], e)
        store.update_progress(rid, run["total_steps"])
        store.finish_run(rid, {})
        ids.append(rid)
    return ids


def test_the_epsilon_chart_on_the_train_page_holds_four_runs(server, browser, epsilon_runs):  # noqa: F811
    """The ε-spent chart as the Train page draws it at 1400 × 900 (its half-width column): no panel title, note or
    legend over another, over a plot or out of the figure."""
    url, _, _ = server
    page = browser.new_page(viewport=LAPTOP)
    page.goto(url + f"train?dataset=digits&group={EPSILON_GROUP}")
    chart = page.locator(".st-key-chart-live-epsilon")

    def drawn():
        try:
            got = chart.evaluate(BOXES_IN, timeout=5000)
        except Exception:  # not drawn yet, or being redrawn: read again
            return None
        return got if got and len([t for t in got["texts"] if t["kind"] == "note"]) >= 5 else None

    got = wait_until(drawn, UI, "the ε-spent chart of four runs")
    page.close()
    found = boxes_problems(got)
    assert not found, found


def test_the_runs_table_shows_its_last_column(server, browser, ended_runs):  # noqa: F811
    """The Runs table's last column was cut at the right edge: at 1400 × 900 every column fits the table's width
    (no horizontal scrolling)."""
    url, _, _ = server
    page = browser.new_page(viewport=LAPTOP)
    page.goto(url + "runs")
    table = page.locator(".st-key-runs-table")
    wait_until(lambda: table.locator(".dvn-scroller").count() == 1, UI, "the Runs table")
    sizes = table.locator(".dvn-scroller").evaluate("e => [e.scrollWidth, e.clientWidth]")
    page.close()
    assert sizes[0] <= sizes[1] + 1, f"the table is {sizes[0]} px wide in a box of {sizes[1]} px"


def test_the_global_adapt_figure_holds_its_panels(browser, tmp_path):
    """DPSGD-Global-Adapt's own figure (issue 58 point 8a) at the Results page's width at 1400 × 900 and full width:
    its three panel titles, its title and legend clear of each other."""
    from tests.test_global_adapt_figure import hostile_global_adapt

    (spec,) = training.build_figures([hostile_global_adapt(1), hostile_global_adapt(2)], names=["global_scale"])
    page = browser.new_page()
    found = problems(page, spec.figure, PAGE_PX, tmp_path, "global") + \
        problems(page, spec.figure, WIDE_PX, tmp_path, "global")
    page.close()
    assert not found, found
