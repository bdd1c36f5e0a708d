"""The Audit page in a real browser (reuses tests/test_browser.py's Streamlit server and Chromium):
open it from the app's navigation, set up a tiny digits audit with the page's controls, launch it, and
see the GPR chart drawn from the finished run."""
from __future__ import annotations

import os

import pytest

from engine.audit.config import AuditConfig
from tests.test_browser import CHROMIUM, RUN, UI, UI_MS, browser, server, shot, wait_until  # noqa: F401 - fixtures

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"the browser tests need Debian's chromium at {CHROMIUM} (apt-get install chromium)")


def _set_number(page, key: str, value) -> None:
    box = page.locator(f".st-key-{key} input")
    box.fill(str(value))
    box.press("Enter")


def test_audit_page_launches_and_shows_gpr(server, browser):  # noqa: F811 - pytest fixtures
    url, store, _ = server
    page = browser.new_page(viewport={"width": 1440, "height": 1400})
    page.set_default_timeout(UI_MS)
    page.goto(url)
    page.get_by_role("link", name="Audit").click()
    page.get_by_role("heading", name="Privacy audit").wait_for()
    got_it = page.get_by_role("button", name="Got it")
    if got_it.count():
        got_it.click()
    page.locator(".st-key-a_dataset input").click()  # opens the dataset list
    page.get_by_role("option", name="digits", exact=True).click()
    wait_until(lambda: page.get_by_text("Plan: 4 × 100 models").count(), UI, "the digits plan (R = 50)")
    _set_number(page, "a_R", 2)
    wait_until(lambda: page.get_by_text("Plan: 4 × 4 models").count(), UI, "the plan for R = 2")
    _set_number(page, "a_looa", 0)
    wait_until(lambda: page.get_by_text("PA-LOOA models each").count() == 0, UI, "the plan without PA-LOOA")
    launch = page.get_by_role("button", name="Launch audit")
    wait_until(lambda: launch.is_enabled(), UI, "the launch button")
    before = {r["id"] for r in store.list_runs(kind="audit")}
    launch.click()
    run = wait_until(lambda: [r for r in store.list_runs(kind="audit") if r["id"] not in before], UI,
                     "the audit in the store")[0]
    cfg = AuditConfig.from_dict(run["config"])
    assert cfg.run.data.name == "digits" and cfg.R == 2 and cfg.looa_k == 0
    wait_until(lambda: store.get_run(run["id"])["status"] in ("finished", "failed", "interrupted"), RUN,
               "the audit to end")
    assert store.get_run(run["id"])["status"] == "finished", store.get_run(run["id"])["error"]
    gpr = page.locator(".st-key-chart-audit-gpr")
    wait_until(lambda: gpr.count() and gpr.locator(".barlayer .point").count() >= 40, UI,
               "the GPR bars (10 digit classes × 4 algorithms)")
    status = page.locator(".st-key-audit-status")
    try:
        wait_until(lambda: status.get_by_text("finished").count() >= 1, 60, "the run shown finished")
    except AssertionError:  # seen once in CI under load: the page still showed the last live refresh
        print(f"audit status not refreshed after the end: {status.inner_text() if status.count() else None!r}; reloading")
        page.reload()
        wait_until(lambda: status.get_by_text("finished").count() >= 1, UI, "the run shown finished after a reload")
    assert page.get_by_text("Workers:").count() == 1  # the app's sidebar: the page runs inside the navigation
    assert page.locator(".st-key-chart-audit-lira").count() == 1
    shot(page, "audit_gpr.png", gpr)
    page.close()
