"""Train's "Your data" (issue 61): the shipped example table picked on the Train page shows the engine's preview
(rows, encoding, classes, groups, tiers from the owners' budgets), plans one tier per distinct budget and lets Launch
go; a bad table or column is said on the page, never a traceback, and Launch waits. Through Streamlit's AppTest, as
tests/test_input_train_hints.py drives the page."""
from __future__ import annotations

import pytest

from app_pages import _your_data as your_data
from engine.data.example_table import EXAMPLE_SCHEMA

# the Train page in AppTest on a fresh store (a fixture), and the shown texts of its elements
from tests.test_input_train_hints import lab, texts as _texts  # noqa: F401


def test_the_example_table_is_previewed_and_planned_with_one_tier_per_budget(lab):
    at = lab
    at.query_params.update({"dataset": your_data.CHOICE, "batch": "64", "epochs": "1", "algos": "idp_sample"})
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    preview = "\n".join(_texts(at.code))
    assert "4,000 rows" in preview and "tiers from budgets: ε=1" in preview, preview
    assert "groups by sex" in preview and "groups by race" in preview
    assert not at.error, _texts(at.error)
    assert any("Tiers from the owners' budgets in `eps`" in c for c in _texts(at.caption))
    assert not at.button(key="launch").disabled


def test_a_missing_column_is_said_on_the_page_and_launch_waits(lab):
    at = lab
    at.query_params.update({"dataset": your_data.CHOICE, "table_label": "no_such_column", "batch": "64"})
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    errors = _texts(at.error)
    assert any("no_such_column" in e and "income" in e for e in errors), errors  # it names the columns there are
    assert at.button(key="launch").disabled


def test_the_bins_field_refuses_words():
    assert your_data._bins("1, 4") == (1.0, 4.0) and your_data._bins(" ") is None
    with pytest.raises(Exception, match="tiers.bins"):
        your_data._bins("1, many")
    assert EXAMPLE_SCHEMA["budget"] == "eps"
