"""The Train page's form in a real browser (Playwright drives Debian's Chromium against ``streamlit run app.py``
on the temporary run store the browser modules share; issue 16, point 4).

* Epochs typed as 0, −3 or 1e9 is refused with one message and Launch is disabled (a bounded number input
  showed a red outline, no message, and Launch ran the last valid 12 epochs); the long too-many-steps message
  sits under the whole row, not in a column a word wide.
* "1e9" typed in a tier's ε cell is 1e9, refused with one message naming "tier 1" (a number cell made it 19).

Every wait polls the page (its script state, its DOM) with generous limits; none sleeps for a fixed time.
"""
from __future__ import annotations

import os

import pytest
# the app the browser modules share, and the browser (fixtures of test_browser.py)
from test_browser import (CHROMIUM, UI, UI_MS, app_idle, edit_grid_cell, rerun_of, run_ids,  # noqa: F401
                          server, wait_until, watched_page)

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"the browser tests need Debian's chromium at {CHROMIUM} (apt-get install chromium)")

ERRORS = '[data-testid="stAlertContentError"]'


def errors(page) -> list[str]:
    return [e.inner_text().strip() for e in page.locator(ERRORS).all() if e.is_visible()]


def type_into(page, key: str, value: str) -> None:
    field = page.locator(f".st-key-{key} input")
    field.fill(value)
    with rerun_of(page):
        field.press("Enter")


def test_epochs_and_a_tier_epsilon_are_refused_with_one_message_and_launch_disabled(server, browser):  # noqa: F811
    url, store, _ = server
    before = run_ids(store)  # (the store is shared with the other browser modules)
    page = watched_page(browser, viewport={"width": 1440, "height": 1300})
    page.goto(url + "train?dataset=digits&preset=single")
    page.get_by_role("button", name="Got it").click()
    page.locator(".st-key-intro-box").wait_for(state="detached")
    launch = page.locator(".st-key-launch button")
    wait_until(lambda: launch.count() == 1 and launch.is_enabled() and app_idle(page), UI, "Launch enabled")
    epochs_column = page.locator('[data-testid="stColumn"]').filter(has=page.locator(".st-key-epochs")).last
    for typed, says in (("0", "must be a number > 0, got 0.0"), ("-3", "must be a number > 0, got -3.0"),
                        ("1e9", "over the limit of 1,000,000")):
        type_into(page, "epochs", typed)
        wait_until(lambda: any(says in e for e in errors(page)), UI, f"the message for epochs {typed}")
        shown = errors(page)
        assert len(shown) == 1, (typed, shown)  # once
        assert launch.is_disabled(), typed
        note = page.locator(".st-key-launch-note").inner_text()
        assert "Epochs" in note and says not in note, (typed, note)  # the note names the field; the message is said once
        box = page.locator(ERRORS).first.bounding_box()
        assert box["width"] >= 100 and box["height"] <= 120, (typed, box)  # a few lines, never a word per line
        if typed != "1e9":
            assert epochs_column.locator(ERRORS).count() == 1, typed  # next to the field
    type_into(page, "epochs", "2")
    wait_until(lambda: not errors(page) and launch.is_enabled(), UI, "Launch enabled again")
    # the single tier's ε, typed as 1e9 in its row of the tier table: 1e9 (too loose to plan noise for), not 19
    grid = page.locator('[class*="st-key-tier-editor-digits-single-eps-"] [data-testid="data-grid-canvas"]')
    grid.wait_for()
    edit_grid_cell(page, grid, 0, 2, "1e9")  # row 1, column ε
    wait_until(lambda: any("too loose" in e for e in errors(page)), UI, "the huge-ε message")
    shown = errors(page)
    assert len(shown) == 1, shown
    assert "tier 1: no privacy plan: ε = 1e+09" in shown[0] and "tiers.tiers" not in shown[0], shown
    assert launch.is_disabled()
    assert run_ids(store) == before  # nothing was launched
    page.close()
