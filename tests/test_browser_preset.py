"""The Audit page's custom settings survive a look at a preset and at the other section, in a real browser (reuses tests/test_browser.py's
Streamlit server and Chromium).

A preset is shown in place of the custom form, so none of the form's widgets is drawn while it is chosen; Streamlit
drops the value of a widget a run does not draw, and the form came back with its defaults: the user's settings
were lost. Here a user sets the form up (selectboxes, a number input, a slider, a toggle and both tier tables),
looks at a preset, returns to custom and finds every field as they left it. (Streamlit's AppTest keeps an undrawn
widget's value, so only a browser shows the loss.)

Every wait polls the page (its script state, its DOM); none sleeps for a fixed time.
"""
from __future__ import annotations

import os

import pytest
# this module's own app on a fresh store (its first case needs one without an audit), and the browser (fixtures of
# test_browser.py)
from test_browser import (CHROMIUM, UI, app_idle, click_until, edit_grid_cell, own_server,  # noqa: F401
                          rerun_of, wait_until, watched_page)
from test_browser_forms import type_into

from app_pages._one_run import ONE_RUN, PA_ALOOA

TRAINS = False  # nothing here launches a run (the server starts no standby workers)
pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"the browser tests need Debian's chromium at {CHROMIUM} (apt-get install chromium)")

CUSTOM = "custom (the settings below)"  # the preset picker's first option (app_pages/audit_view.py)
TIERS = "a-tier-editor-adult-two_tier_attribute"  # adult's default tiers: Female (ε = 1) and Male (ε = 3)
OWNERS = f".st-key-{TIERS}"  # the owners' table (value, tier)
PER_TIER = f'[class*="st-key-{TIERS}-eps-"]'  # the per-tier table (tier, values, ε), keyed by its tiers


def choose(page, key: str, option: str) -> None:
    """Pick ``option`` in the selectbox ``key``; a click that lands while the page reruns opens no list (under
    load, CI), so the list is opened again until the option shows."""
    opt = page.get_by_role("option", name=option, exact=True)
    click_until(page.locator(f".st-key-{key} input"), lambda: opt.count() > 0, f"{key}'s list to open")
    with rerun_of(page):
        opt.click()
    wait_until(lambda: shown(page, key) == option, UI, f"{key} to show {option}")


def shown(page, key: str):
    """What the widget ``key`` shows: a selectbox's option, a number's text, a slider's value, a toggle's state."""
    field = page.locator(f".st-key-{key} input")
    if field.count() != 1:
        return None  # not drawn
    kind = field.get_attribute("type")
    if kind == "checkbox":
        return field.is_checked()
    return field.input_value()


def edit_cell(page, selector: str, row: int, column: int, value: str) -> None:
    """Type ``value`` into cell (row, column) of the data editor ``selector`` and wait for its rerun."""
    edit_grid_cell(page, page.locator(f'{selector} [data-testid="data-grid-canvas"]'), row, column, value)


def pick_section(page, label: str, key: str) -> None:
    """Choose the Audit page's section ``label`` and wait until its widget ``key`` is drawn."""
    with rerun_of(page):
        page.locator(".st-key-a_section").get_by_text(label, exact=True).click()
    wait_until(lambda: shown(page, key) is not None and app_idle(page), UI, f"the section {label}")


def table_rows(page, selector: str) -> list[list[str]]:
    """A data editor's rows as the grid's accessible table gives them (header row left out)."""
    rows = page.locator(f"{selector} table tr")
    wait_until(lambda: rows.count() >= 2, UI, f"the rows of {selector}")
    return [[c.inner_text().strip() for c in r.locator("td, th").all()] for r in rows.all()[1:]]


def fields(page) -> dict:
    return {**{k: shown(page, k) for k in ("a_group_by", "a_attr", "a_tiers", "a_boot", "a_score", "a_tail",
                                           "a_R", "a_controls")},
            "owners": table_rows(page, OWNERS), "per tier": table_rows(page, PER_TIER)}


def an_audit(store) -> None:
    """A cancelled audit in the store (nothing trains): the page then lists audits below the form."""
    from engine.audit.pa_alooa.config import DEFAULT_RUN, AuditConfig

    store.create_run(AuditConfig(run=DEFAULT_RUN.replace(**{"data.name": "digits"}), R=2).to_dict(), kind="audit",
                     status="cancelled", name="listed")


# Both ends of the page: with no audit yet its run ended at the "No audits yet" note with st.stop() (a stopped run
# keeps the state of the widgets it did not draw while the browser draws them anew: a tier table showed its start
# rows, the page read the old edits); with an audit it lists it and runs to its end (undrawn widgets are dropped)
@pytest.mark.parametrize("audits", ["none yet", "one listed"])
def test_custom_settings_survive_a_look_at_a_preset(own_server, browser, audits):  # noqa: F811 - pytest fixtures
    url, store, _ = own_server
    if audits == "one listed" and not store.list_runs(kind="audit"):
        an_audit(store)
    assert bool(store.list_runs(kind="audit")) == (audits == "one listed")
    page = watched_page(browser, viewport={"width": 1440, "height": 1400})
    page.goto(url + "audit")
    page.get_by_role("heading", name="Privacy audit").wait_for()
    got_it = page.get_by_role("button", name="Got it")
    got_it.wait_for()
    got_it.click()
    page.locator(".st-key-intro-box").wait_for(state="detached")
    wait_until(lambda: app_idle(page) and shown(page, "a_group_by") == "attribute", UI, "the custom form")
    assert table_rows(page, OWNERS) == [["Female", "1"], ["Male", "2"]]

    # the user's settings, one widget of each kind
    choose(page, "a_attr", "race")
    type_into(page, "a_R", "10")
    with rerun_of(page):
        page.locator(".st-key-a_controls label").click()  # the toggle (bound to the URL)
    wait_until(lambda: shown(page, "a_controls") is True, UI, "the controls toggle on")
    page.locator('[data-testid="stExpander"] summary').filter(has_text="Training").click()  # open the expander
    page.locator(".st-key-a_boot input").wait_for(state="visible")
    type_into(page, "a_boot", "250")
    choose(page, "a_score", "loss")
    slider = page.locator(".st-key-a_tail input")
    slider.focus()
    with rerun_of(page):  # (the slider sends its value once the keys stop)
        for _ in range(5):
            slider.press("ArrowLeft")
    wait_until(lambda: shown(page, "a_tail") == "45" and app_idle(page), UI, "the tail slider at 45")
    slider.blur()  # else the grid edits' arrow keys move it when their click lands during a redraw (CI read 46)
    # the tiers: Female joins Male's tier 2 (ε 3), then tier 2 gets ε = 5
    edit_cell(page, OWNERS, 0, column=1, value="2")
    wait_until(lambda: table_rows(page, PER_TIER) == [["2", "Female, Male", "3"]], UI, "Female in tier 2")
    edit_cell(page, PER_TIER, 0, column=2, value="5")
    wait_until(lambda: table_rows(page, PER_TIER) == [["2", "Female, Male", "5"]], UI, "tier 2 at ε = 5")
    # the group-by last: "class" hides the attribute, which must come back too
    choose(page, "a_group_by", "class")
    set_up = fields(page)
    assert set_up == {"a_group_by": "class", "a_attr": None, "a_tiers": "two_tier_attribute", "a_boot": "250",
                      "a_score": "loss", "a_tail": "45", "a_R": "10", "a_controls": True,
                      "owners": [["Female", "2"], ["Male", "2"]], "per tier": [["2", "Female, Male", "5"]]}, set_up

    # a look at a preset: its settings in place of the form
    choose(page, "a_preset", "quick")
    wait_until(lambda: page.locator(".st-key-a-preset-settings").get_by_text("Preset quick runs").count() == 1
               and page.locator(".st-key-a_group_by").count() == 0, UI, "the preset's settings instead of the form")

    # back to custom: every field as the user left it
    choose(page, "a_preset", CUSTOM)
    wait_until(lambda: shown(page, "a_group_by") is not None and page.locator(PER_TIER).count() == 1, UI,
               "the custom form again")
    back = fields(page)
    lost = {k: (set_up[k], back[k]) for k in set_up if back[k] != set_up[k]}
    assert not lost, f"settings lost after a look at a preset (set → shown): {lost}"
    choose(page, "a_group_by", "attribute")  # the attribute hidden behind "class" all along
    assert shown(page, "a_attr") == "race"
    # the tables live on from there: the next edit counts, on top of the ones before
    edit_cell(page, PER_TIER, 0, column=2, value="4")
    wait_until(lambda: table_rows(page, PER_TIER) == [["2", "Female, Male", "4"]], UI, "tier 2 at ε = 4")
    assert table_rows(page, OWNERS) == [["Female", "2"], ["Male", "2"]]

    # the other section hides the whole form, and the PA-ALOOA one hides the one-run form: both come back
    pick_section(page, ONE_RUN, "o_canaries")
    type_into(page, "o_canaries", "300")
    type_into(page, "o_inputs", "200")
    pick_section(page, PA_ALOOA, "a_group_by")
    wait_until(lambda: page.locator(PER_TIER).count() == 1, UI, "the per-tier table")
    now = {**set_up, "a_group_by": "attribute", "a_attr": "race", "per tier": [["2", "Female, Male", "4"]]}
    back = fields(page)
    lost = {k: (now[k], back[k]) for k in now if back[k] != now[k]}
    assert not lost, f"settings lost after a look at the one-run section (set → shown): {lost}"
    pick_section(page, ONE_RUN, "o_canaries")
    assert (shown(page, "o_canaries"), shown(page, "o_inputs")) == ("300", "200"), "the one-run form was reset"
    assert [r["status"] for r in store.list_runs()] == (["cancelled"] if audits == "one listed" else [])  # no launch
    page.close()
