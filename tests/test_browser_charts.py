"""Readable live charts in a real browser (Playwright + Debian's Chromium against ``streamlit run app.py`` on
the temporary store the browser modules share): in one comparison, a run that diverges (a learning rate far
too large) gets its MID facet clipped and badged "diverged" while every other facet keeps its own, readable y
scale, and a k-seed series (two seeds trained together on the model axis) is drawn as its mean with a ± s.e. band.

The runs are real: trained in this process into the app's store (the same ``engine.train.loop.train`` a worker
runs) before the page opens. The test reads the chart's plotted traces, annotations and axis ranges out of
the page (Plotly's ``_fullData`` / ``_fullLayout`` on the chart's div). Waits poll; none sleeps a fixed time.
"""
from __future__ import annotations

import math
import os

import pytest
import torch
# the app the browser modules share, and the browser (fixtures of test_browser.py)
from test_browser import CHROMIUM, UI, UI_MS, server, wait_until  # noqa: F401

from engine.config.run import RunConfig
from engine.jobs.kinds import execute

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"the browser tests need Debian's chromium at {CHROMIUM} (apt-get install chromium)")

GROUP = "cmp-charts"
BASE = RunConfig().replace(**{"data.name": "digits", "data.max_train": 400, "model.name": "lr", "epochs": 2.0,
                              "batch_size": 64, "eval_every": 3, "threads": 1, "device": "cpu"})

READ = """el => {
  const gd = el.querySelector('.js-plotly-plot');
  if (!gd || !gd._fullLayout || !gd._fullData) return null;
  const L = gd._fullLayout, axes = {};
  for (const k of Object.keys(L))
    if (/^yaxis\\d*$/.test(k) && L[k] && L[k].range) axes[k] = L[k].range.slice();
  const arr = v => (v && typeof v.length === 'number' && typeof v !== 'string') ? Array.from(v) : [];
  return {traces: gd._fullData.map(t => ({name: String(t.name || ''), meta: String(t.meta || ''),
                                          yaxis: t.yaxis || 'y', y: arr(t.y), visible: t.visible})),
          notes: (L.annotations || []).map(a => ({text: String(a.text || ''), name: String(a.name || ''),
                                                  yref: String(a.yref || '')})),
          axes};
}"""


def _axis(ref: str) -> str:
    """'y3 domain' / 'y3' / 'y' → the layout key 'yaxis3' / 'yaxis'."""
    ref = ref.split()[0]
    return "yaxis" + ref[1:]


@pytest.fixture(scope="module")
def comparison(server):  # noqa: F811 - a fixture
    """Two groups' worth of real runs in one comparison: an INO-SGD series of two seeds (one job, two rows)
    and a DP-SGD run with lr 10⁴, which diverges."""
    _, store, _ = server
    torch.set_num_threads(1)
    series = BASE.replace(**{"algorithm.name": "ino", "seeds": 2})
    ids = store.create_job(series.seed_configs(), group_id=GROUP)
    execute(store, ids[0], series, kind="train")
    hot = BASE.replace(**{"algorithm.name": "dpsgd", "optimizer.lr": 1e4})
    hot_id = store.create_run(hot, group_id=GROUP, name="lr 1e4")
    execute(store, hot_id, hot, kind="train")
    runs = {r["id"]: r for r in store.list_runs(group_id=GROUP)}
    # the hot run ends as what it is (issue 38: divergence is a run state), the series as finished
    assert {i: r["status"] for i, r in runs.items()} == {**{i: "finished" for i in ids}, hot_id: "diverged"}, runs
    hot_losses = [t["loss"] for e in store.eval_metrics(hot_id) for t in e["tiers"]]
    # the premise: the hot run really diverges (a non-finite loss, or one far above its start)
    assert any(not math.isfinite(v) or v > 10 * hot_losses[0] for v in hot_losses[3:])
    return ids, hot_id


def test_a_diverged_run_is_badged_and_seed_bands_are_drawn(server, browser, comparison):  # noqa: F811
    url, _, _ = server
    page = browser.new_page(viewport={"width": 1400, "height": 1300})
    page.set_default_timeout(UI_MS)
    page.goto(url + f"train?dataset=digits&group={GROUP}")
    chart = page.locator(".st-key-chart-live-mid")

    def read():
        try:
            data = chart.evaluate(READ, timeout=5000)
        except Exception:  # not drawn yet, or being redrawn: read again
            return None
        return data if data and data["traces"] and data["axes"] else None

    data = wait_until(read, UI, "the live MID chart of the comparison")
    # its status row says it in words, with the lab's one sentence
    status = page.locator(".st-key-live-status")
    # the badge is the state in one word (its icon's name is in its text too), the detail the caption beside it
    wait_until(lambda: status.locator(".stMarkdownBadge", has_text="diverged").count() == 1, UI, "the diverged badge")
    assert "diverged at step" in status.text_content()
    badges = [n for n in data["notes"] if n["name"] == "diverged" or n["text"].startswith("diverged")]
    assert len(badges) == 1, data["notes"]
    hot_axis = _axis(badges[0]["yref"])
    drawn = {_axis(t["yaxis"]) for t in data["traces"] if t["y"]}
    others = drawn - {hot_axis}
    assert hot_axis in data["axes"] and others, (hot_axis, drawn)
    # every other facet keeps its own scale: its range fits its own curves (test losses of a few nats),
    # not the diverged run's
    for ax in others:
        lo, hi = data["axes"][ax]
        ys = [y for t in data["traces"] if _axis(t["yaxis"]) == ax for y in t["y"]
              if isinstance(y, (int, float)) and math.isfinite(y)]
        assert ys and hi < 10 * max(ys) and hi < 50, (ax, lo, hi, max(ys))
    # the diverged facet is clipped to its curve before divergence
    lo, hi = data["axes"][hot_axis]
    assert math.isfinite(hi) and hi < 50, (lo, hi)
    # the two-seed INO-SGD series: a mean line with its upper and lower band edges in its facet
    metas = [t["meta"] for t in data["traces"] if _axis(t["yaxis"]) in others]
    assert any(m.startswith("hi|") for m in metas) and any(m.startswith("lo|") for m in metas), metas
    assert any(m.startswith("line|") for m in metas), metas
    page.close()
