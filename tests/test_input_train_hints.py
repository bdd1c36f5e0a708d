"""The Train form's hints (issue 58, points 3 and 8): a batch that is a large fraction of the training set (a batch
size carried over from a larger dataset) is said by the batch field, by the engine's rule
(``RunConfig.batch_advisories``); the plan preview says what σ* and z_Δ are; a value every chosen algorithm ignores
is said by its field. Through Streamlit's AppTest, as tests/test_forms.py drives the page."""
from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.config.run import LARGE_BATCH_FRACTION, RunConfig, total_steps

APP = str(Path(__file__).resolve().parent.parent / "app.py")
DIGITS_TRAIN = 1437  # digits' training set (sklearn's 1797 images less the lab's test split)


def test_the_batch_advisory_rule():
    """Over LARGE_BATCH_FRACTION of the training set (and no more than it: more is refused once the data load):
    one advisory naming batch_size with the fraction, the steps and the largest batch under the rule."""
    config = RunConfig(batch_size=512, epochs=20.0).validate()
    [advice] = config.batch_advisories(DIGITS_TRAIN)
    assert advice.field == "batch_size"
    assert "36% of the 1,437 training samples" in advice.message
    assert f"{total_steps(20.0, DIGITS_TRAIN, 512):,} steps" in advice.message
    assert f"at most {int(LARGE_BATCH_FRACTION * DIGITS_TRAIN):,}" in advice.message
    assert config.advisories(DIGITS_TRAIN)[-1] is not None and config.advisories() == []  # known once N is
    assert RunConfig(batch_size=512).batch_advisories(60_000) == []  # MNIST: under 1 %
    assert RunConfig(batch_size=128).batch_advisories(DIGITS_TRAIN) == []  # the default config on digits: 9 %
    assert RunConfig(batch_size=int(LARGE_BATCH_FRACTION * 1000)).batch_advisories(1000) == []
    assert len(RunConfig(batch_size=int(LARGE_BATCH_FRACTION * 1000) + 1).batch_advisories(1000)) == 1
    assert RunConfig(batch_size=2000).batch_advisories(1000) == []  # over the data: an error, not a hint


@pytest.fixture()
def lab(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIVACY_LAB_STORE", str(tmp_path / "runs.sqlite"))
    monkeypatch.setenv("PRIVACY_LAB_PREWARM", "0")
    at = AppTest.from_file(APP, default_timeout=120)
    yield at
    from app_pages import _handles

    _handles._manager.clear()


def texts(elements) -> list[str]:
    return [e.value.replace("\\", "") for e in elements]


def test_a_batch_carried_over_to_digits_is_hinted_by_the_batch_field(lab):
    at = lab
    at.query_params.update({"dataset": "digits", "batch": "512"})
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    hints = [w for w in texts(at.warning) if "Batch size" in w and "training samples" in w]
    assert len(hints) == 1 and "36% of the 1,437 training samples" in hints[0], texts(at.warning)
    assert not at.button(key="launch").disabled  # a hint, not a refusal
    at.number_input(key="batch").set_value(64).run()
    assert not [w for w in texts(at.warning) if "training samples" in w], texts(at.warning)


def test_the_plan_preview_says_what_sigma_star_and_z_delta_are(lab):
    at = lab
    at.query_params.update({"dataset": "digits", "batch": "64"})
    at.run()
    captions = texts(at.caption)
    assert any(c.startswith("σ* is the noise multiplier the accountant planned") and "σ*·C" in c
               for c in captions), captions
    at.multiselect(key="algos").set_value(["dpsgd_s"]).run()
    assert not at.exception, [e.value for e in at.exception]
    captions = texts(at.caption)
    assert any(c.startswith("z_Δ is the gradient noise multiplier") and "z_Δ · max_k C_k" in c
               for c in captions), captions


def test_a_value_every_chosen_algorithm_ignores_is_said_by_its_field(lab):
    at = lab
    at.query_params.update({"dataset": "digits", "batch": "64", "quantile": "0.9"})
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    notes = [w for w in texts(at.warning) if w.startswith("**Quantile**")]
    assert len(notes) == 1 and "0.9 is ignored by IDP-SGD (SAMPLE) and INO-SGD" in notes[0], texts(at.warning)
    assert not at.button(key="launch").disabled
    at.multiselect(key="algos").set_value(["idp_sample", "dpsgd_global_adapt"]).run()  # Global-Adapt reads it
    assert not [w for w in texts(at.warning) if w.startswith("**Quantile**")], texts(at.warning)
