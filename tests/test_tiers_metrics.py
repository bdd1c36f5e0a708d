"""Tier assignment rules and presets; MID markers, group metrics and recall AUC on hand-made inputs."""
import math

import numpy as np
import pandas as pd
import pytest

from engine.config.run import TierConfig, TiersConfig
from engine.config.schema import ConfigError
from engine.data import load_dataset
from engine.dp.tiers import assign_tiers, preset, preset_names
from engine.models.metrics import fairness_metrics, group_metrics, mid_markers, recall_auc


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def test_paper_preset_by_class(digits):
    a = assign_tiers(preset("paper", digits), digits)
    y = digits.y_train.numpy()
    assert set(y[a.train == 0]) == {2, 5, 9} and set(y[a.train == 1]) == {3, 7, 8}
    assert set(y[a.train == 2]) == {0, 1, 4, 6}
    assert a.epsilons == (1.0, 2.0, 3.0) and a.test is not None and len(a.test) == len(digits.y_test)


def test_presets_that_need_no_dataset(digits):
    """paper and random_54_37_9 are fixed splits (the demo's defaults build configs without loading data);
    the presets that read the data say so."""
    assert preset("paper") == preset("paper", digits) == TiersConfig()
    assert preset("random_54_37_9") == preset("random_54_37_9", digits)
    for name in ("two_tier_attribute", "single"):
        with pytest.raises(ConfigError, match="needs the dataset"):
            preset(name)
    with pytest.raises(ConfigError, match="unknown preset 'nope'; allowed: paper, two_tier_attribute"):
        preset("nope")


def test_random_ratios(digits):
    a = assign_tiers(preset("random_54_37_9", digits), digits, seed=3)
    n = len(digits.y_train)
    assert sum(a.sizes) == n
    np.testing.assert_allclose(np.array(a.sizes) / n, [0.54, 0.37, 0.09], atol=2 / n)
    b = assign_tiers(preset("random_54_37_9", digits), digits, seed=4)
    assert not np.array_equal(a.train, b.train) and a.test is None


def test_explicit(digits):
    n = len(digits.y_train)
    assignment = tuple(i % 2 for i in range(n))
    a = assign_tiers(TiersConfig(assign="explicit", tiers=(TierConfig(1.0), TierConfig(5.0)), assignment=assignment),
                     digits)
    assert a.train.tolist() == list(assignment)
    with pytest.raises(ConfigError, match="training samples"):
        assign_tiers(TiersConfig(assign="explicit", tiers=(TierConfig(1.0),), assignment=(0, 0)), digits)


def test_attribute_two_tier_preset(shared_data):
    adult = load_dataset("adult")
    assert "two_tier_attribute" in preset_names(adult) and "paper" not in preset_names(adult)
    cfg = preset("two_tier_attribute", adult)
    a = assign_tiers(cfg, adult)
    sex = np.asarray(adult.sensitive_train["sex"]).astype(str)
    assert cfg.tiers[0].values == ("Female",)  # the smaller group gets the stricter budget
    assert np.all((a.train == 0) == (sex == "Female")) and a.sizes[0] < a.sizes[1]
    bad = TiersConfig(assign="attribute", attribute="sex", tiers=(TierConfig(1.0, values=("Female",)),))
    with pytest.raises(ConfigError, match="Male"):
        assign_tiers(bad, adult)


def test_class_out_of_range(digits):
    cfg = TiersConfig(tiers=(TierConfig(1.0, classes=tuple(range(11))),))
    with pytest.raises(ConfigError) as e:
        assign_tiers(cfg, digits)
    assert e.value.field == "tiers.tiers[0].classes[10]"  # the out-of-range entry itself


def test_mid_markers_hand_computed():
    steps = [0, 10, 20, 30, 40, 50]
    losses = [[1.0, 2.0, 0.5],   # initial
              [1.2, 1.9, 0.6],   # tier 0 rises (onset 10); tier 2 rises (onset 10)
              [1.5, 1.8, 0.4],   # tier 0 peak +0.5 at 20; tier 2 back (end 20)
              [1.1, 1.7, 0.45],
              [0.9, 1.6, 0.3],   # tier 0 back at/below 1.0 (end 40)
              [0.8, 1.5, 0.2]]
    m = mid_markers(losses, steps)
    assert m[0] == {"onset_step": 10, "end_step": 40, "peak_step": 20, "peak_increase": pytest.approx(0.5)}
    assert m[1] == {"onset_step": None, "end_step": None, "peak_step": None, "peak_increase": 0.0}
    assert m[2]["onset_step"] == 10 and m[2]["end_step"] == 20
    assert mid_markers([[1.0], [1.1], [1.2]], [0, 1, 2])[0]["end_step"] is None  # never recovers


def test_group_metrics_hand_computed():
    y = np.array([0, 0, 1, 1, 2, 2])
    pred = np.array([0, 1, 1, 1, 2, 0])
    logp = np.log(np.full((6, 3), 1e-3))
    logp[np.arange(6), pred] = np.log(0.998)
    groups = np.array([0, 0, 0, 0, 1, 1])  # tier 0 = classes {0,1}, tier 1 = class {2}
    overall, tiers, classes, _ = group_metrics(y, logp, groups, 2, 3)
    assert overall["accuracy"] == pytest.approx(4 / 6)
    assert overall["balanced_accuracy"] == pytest.approx((0.5 + 1 + 0.5) / 3)
    assert [c["recall"] for c in classes] == [0.5, 1.0, 0.5]
    assert classes[0]["accuracy"] == pytest.approx(4 / 6)  # one-vs-rest for class 0
    assert tiers[0]["recall"] == pytest.approx(0.75) and tiers[0]["accuracy"] == pytest.approx(0.75)
    assert tiers[1]["recall"] == pytest.approx(0.5) and tiers[1]["n"] == 2


def test_fairness_metrics_are_fairlearns():
    """The evaluation's outcome-fairness numbers equal Fairlearn's own functions on random binary labels, 1-4
    groups, groups without positives or without negatives (TPR / FPR 0 there, as Fairlearn normalises)."""
    from fairlearn.metrics import demographic_parity_difference, equalized_odds_difference

    rng = np.random.default_rng(0)
    for case in range(60):
        n = int(rng.integers(2, 80))
        y, p = rng.integers(0, 2, n), rng.integers(0, 2, n)
        s = rng.choice(np.array(["a", "b", "c", "d"])[: rng.integers(1, 5)], n)
        if case % 3 == 0:
            y[s == s[0]] = 0
        if case % 5 == 0:
            y[s == s[-1]] = 1
        want = {"demographic_parity_difference": float(demographic_parity_difference(y, p, sensitive_features=s)),
                "equalized_odds_difference": float(equalized_odds_difference(y, p, sensitive_features=s))}
        assert fairness_metrics(y, p, s) == want, case


def test_recall_auc_hand_computed_and_its_edge_cases():
    # trapezoids over progress step / T: (0.2 + 0.6)/2 · 0.25 + (0.6 + 1.0)/2 · 0.75 = 0.7
    assert recall_auc([0, 25, 100], [0.2, 0.6, 1.0]) == pytest.approx(0.7, rel=1e-15)
    assert recall_auc([0, 5, 10], [0.5, 0.5, 0.5]) == pytest.approx(0.5, rel=1e-15)  # a flat curve: its value
    # what a live run or a partial selection has: no evaluation, only the initial one, one at step T > 0
    assert math.isnan(recall_auc([], []))
    assert recall_auc([0], [0.3]) == 0.3
    assert recall_auc([7], [0.4]) == 0.4
    assert recall_auc([0, 0], [0.1, 0.9]) == 0.9  # last step 0: no progress to integrate over
    assert math.isnan(recall_auc([0, 5, 10], [0.5, float("nan"), 0.5]))  # a tier without samples
    # the figures pass pandas Series: read by position, whatever their index
    steps, recalls = pd.Series([0, 25, 100], index=[7, 3, 9]), pd.Series([0.2, 0.6, 1.0], index=[7, 3, 9])
    assert recall_auc(steps, recalls) == pytest.approx(0.7, rel=1e-15)


def test_the_figures_recall_auc_is_the_summarys():
    """One owner: the recall-AUC table of the figures gives the run summary's value, edge cases included."""
    from engine.figures import frames

    def run(run_id, steps, recalls):
        evals = [{"step": s, "epoch": s / 10, "elapsed": float(s), "tier_split": "test",
                  "overall": {"loss": 1.0, "accuracy": 0.5, "balanced_accuracy": 0.5}, "classes": [],
                  "tiers": [{"loss": 1.0, "recall": r, "accuracy": r, "n": 10, "name": "ε=1", "epsilon": 1.0,
                             "epsilon_spent": None}]} for s, r in zip(steps, recalls)]
        return {"id": run_id, "algorithm": "idp_sample", "status": "running", "config": {}, "evals": evals}

    cases = {1: ([0, 25, 100], [0.2, 0.6, 1.0]), 2: ([0], [0.3]), 3: ([0, 10], [0.1, 0.5])}
    table = frames.recall_auc_table([run(i, *c) for i, c in cases.items()]).set_index("run_id")["recall_auc"]
    assert {i: table[i] for i in cases} == {i: recall_auc(*c) for i, c in cases.items()}
    assert table[2] == 0.3  # only the initial evaluation so far: that recall, not nan
