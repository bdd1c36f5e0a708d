"""The live view of a run on Ray updates as a local run's does (issue 20), in a real browser.

A lab server started with PRIVACY_LAB_BACKEND=ray (each worker the driver of its run's Ray task, on an instance
bound to 127.0.0.1): the sidebar names the backend, a digits comparison launched from the Train page gains live
points on the MID chart refresh after refresh while its runs train as Ray tasks (their workers hold a raylet),
and Cancel stops them. Every wait polls the page or the store (never a fixed sleep).
"""
from __future__ import annotations

import os

import psutil
import pytest

from engine.store.db import RunStore
from tests.test_browser import (CHROMIUM, RUN, UI, UI_MS, cancel_all, last_plotted_x, points, reporting_runs,
                                start_lab, stop_lab, wait_until)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                 reason=f"the browser tests need Debian's chromium at {CHROMIUM} "
                                        "(apt-get install chromium)")]


def ray_processes(pid: int) -> list[str]:
    """Names of the Ray servers a worker process started (its instance's raylet and GCS)."""
    try:
        return [p.name() for p in psutil.Process(pid).children(recursive=True)
                if p.name() in ("raylet", "gcs_server")]
    except psutil.Error:
        return []


def test_the_live_chart_of_a_run_on_ray_gains_points_like_a_local_one(tmp_path, browser):
    proc, url = start_lab(tmp_path, PRIVACY_LAB_BACKEND="ray", HOME=str(tmp_path))  # Ray's token under tmp
    store = RunStore(tmp_path / "runs.sqlite")
    try:
        with reporting_runs(store):  # a timed-out wait also says the runs' states and steps
            page = browser.new_page(viewport={"width": 1440, "height": 1300})
            page.set_default_timeout(UI_MS)
            page.goto(url + "train?dataset=digits&batch=64&epochs=1000&eval_every=10")
            page.get_by_role("button", name="Got it").click()
            wait_until(lambda: page.get_by_text("Backend: Ray (an instance on this machine, 127.0.0.1)").count(),
                       UI, "the sidebar naming the Ray backend")
            launch = page.get_by_role("button", name="Launch comparison")
            wait_until(lambda: launch.is_enabled(), UI, "the launch button")
            launch.click()
            runs = wait_until(lambda: len(store.list_runs()) == 2 and sorted(store.list_runs(), key=lambda r: r["id"]),
                              UI, "two runs in the store")
            first = runs[0]
            running = wait_until(lambda: (r := store.get_run(first["id"]))["status"] == "running" and r["pid"] and r,
                                 RUN, "the first run to start")
            wait_until(lambda: ray_processes(running["pid"]), RUN, "the first run's worker to start a Ray instance")
            chart = page.locator(".st-key-chart-live-mid")
            wait_until(lambda: chart.get_by_text(f"#{first['id']}").count() and points(chart) > 0, RUN,
                       "a first live point of the run on Ray")
            seen = last_plotted_x(chart)
            for _ in range(3):  # refresh after refresh, the chart gains what the Ray task streams (at its end)
                seen = wait_until(lambda x=seen: (now := last_plotted_x(chart)) > x and now, RUN,
                                  f"live points from Ray past step {seen}")
            assert store.get_run(first["id"])["status"] == "running" and ray_processes(running["pid"])
            cancel_all(page, store)
            wait_until(lambda: page.locator(".st-key-live-status").get_by_text("cancelled").count(), UI,
                       "the runs marked cancelled")
            assert store.get_run(first["id"])["status"] == "cancelled" and store.eval_metrics(first["id"])
            wait_until(lambda: not ray_processes(running["pid"]) and not psutil.pid_exists(running["pid"]), UI,
                       "the cancelled worker and its Ray instance to end")
            page.close()
    finally:
        stop_lab(proc, store)
