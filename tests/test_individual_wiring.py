"""Individual ε in the engine (issue 62): a training run measures its panel (engine.train.individual) and stores per
group (class, tier) the quartiles of individual ε at every evaluation and in its summary; ``show --json`` has an
``individual_epsilon`` section; ``individual_epsilon: false`` and runs without a formal guarantee store none; summaries
stored before it still load; the engine's figure of it builds and escapes user text."""
from __future__ import annotations

import json
import math

import pytest

from engine.audit.pa_alooa import individual as gvi
from engine.config.run import RunConfig
from engine.config.schema import ConfigError
from engine.dp.individual import DATA_DEPENDENT_NOTE, GroupIndividualEpsilon, IndividualEpsilonSummary
from engine.figures import export, talk, training
from engine.figures.individual import individual_frame
from engine.jobs.kinds import execute
from engine.store.db import RunStore
from engine.train.records import EvalRecord, PlanRecord, RunSummary, individual_table
from tests.in_process import cli_here

# digits DP-SGD, a few steps; a clip above most gradient norms so that samples spend less than their tier's ε
DIGITS = RunConfig().replace(**{"algorithm.name": "dpsgd", "epochs": 8.0, "eval_every": 30, "clip_norm": 5.0})


def run_into(store: RunStore, config: RunConfig) -> dict:
    rid = store.create_run(config.validate())
    execute(store, rid, config, kind="train")
    return store.get_run(rid)


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        path = tmp_path_factory.mktemp("individual") / "runs.sqlite"
        store = RunStore(path)
        yield path, run_into(store, DIGITS), store
    finally:
        torch.set_num_threads(threads)


def test_a_digits_dpsgd_run_stores_individual_epsilon_per_class_and_tier_within_each_promise(digits_run):
    _, run, store = digits_run
    summary, plan = RunSummary.from_dict(run["summary"]), PlanRecord.from_dict(run["plan"])
    by = summary.individual_epsilon
    assert set(by) == {"class", "tier"}
    assert [g.group for g in by["class"].groups] == [str(c) for c in range(10)]
    assert [g.group for g in by["tier"].groups] == list(plan.tier_names)
    for s in by.values():
        assert s.accountant == "rdp" and s.run_accountant == "rdp" and s.step == summary.steps
        assert s.note == DATA_DEPENDENT_NOTE and s.checkpoints[0] == 0 and len(s.checkpoints) > 1
        assert s.tier_epsilons == pytest.approx(plan.epsilons, rel=1e-6)  # the promise, under the same accountant
    for k, g in enumerate(by["tier"].groups):  # every group within its tier's planned ε
        assert 0 < g.epsilon_q1 <= g.epsilon_median <= g.epsilon_q3 <= plan.epsilons[k] * (1 + 1e-9)
        assert g.share_median == pytest.approx(g.epsilon_median / plan.epsilons[k], rel=1e-6)
    # with C above most norms, some group spends clearly less than its promise (not the worst case everywhere)
    assert min(g.share_median for g in by["tier"].groups) < 0.95
    # each evaluation stores its own, growing with the steps; the last is the summary's
    evals = [EvalRecord.from_dict(e) for e in store.eval_metrics(run["id"])]
    medians = [e.individual_epsilon["tier"].groups[0].epsilon_median for e in evals]
    assert all(e.individual_epsilon is not None for e in evals) and medians == sorted(medians)
    assert evals[-1].individual_epsilon == by


def test_show_json_has_the_individual_epsilon_section_and_show_prints_its_table(digits_run):
    path, run, _ = digits_run
    out = cli_here("show", "--json", run["id"], store=path)
    assert out.returncode == 0, out.stderr
    section = json.loads(out.stdout)["individual_epsilon"]
    assert section == run["summary"]["individual_epsilon"]
    for grouping in ("class", "tier"):
        assert section[grouping]["accountant"] == "rdp"
        for g in section[grouping]["groups"]:
            assert g["epsilon_q1"] <= g["epsilon_median"] <= g["epsilon_q3"] and g["n_samples"] > 0
    text = cli_here("show", run["id"], store=path).stdout
    assert "individual ε after" in text and "under RDP" in text and "Individual ε is computed" in text
    assert max(len(line) for line in text.splitlines()) < 120


def test_the_opt_out_and_a_nonprivate_run_store_none(tmp_path, one_thread):
    store = RunStore(tmp_path / "runs.sqlite")
    short = DIGITS.replace(epochs=0.5, eval_every=0)
    for config in (short.replace(individual_epsilon=False), short.replace(**{"algorithm.name": "nonprivate"})):
        run = run_into(store, config)
        assert "individual_epsilon" not in run["summary"]
        assert all("individual_epsilon" not in e for e in store.eval_metrics(run["id"]))
        assert individual_table(run["summary"]) == ""
        shown = json.loads(cli_here("show", "--json", run["id"], store=tmp_path / "runs.sqlite").stdout)
        assert shown["individual_epsilon"] is None


def test_the_opt_out_is_validated_like_its_neighbours():
    with pytest.raises(ConfigError, match="individual_epsilon: must be true or false"):
        RunConfig(individual_epsilon="no").validate()


def summary_with(groups) -> IndividualEpsilonSummary:
    return IndividualEpsilonSummary(step=10, accountant="rdp", run_accountant="pld", delta=1e-5, panel_per_group=256,
                                    checkpoints=(0, 5), tier_epsilons=(1.0, 3.0), groups=tuple(groups))


def test_summaries_round_trip_and_old_ones_load_without_it():
    g = GroupIndividualEpsilon(group="ε=1", n_samples=7, epsilon_q1=0.2, epsilon_median=0.5, epsilon_q3=0.9,
                               share_q1=0.2, share_median=0.5, share_q3=0.9)
    record = RunSummary(algorithm="dpsgd", steps=10, individual_epsilon={"tier": summary_with([g])})
    assert RunSummary.from_dict(record.to_dict()) == record
    assert EvalRecord.from_dict(EvalRecord(step=3, individual_epsilon={"class": summary_with([g])}).to_dict()) \
        == EvalRecord(step=3, individual_epsilon={"class": summary_with([g])})
    old = {k: v for k, v in record.to_dict().items() if k != "individual_epsilon"}
    assert RunSummary.from_dict(old).individual_epsilon is None and RunSummary.from_dict(old).to_dict() == old
    text = individual_table(record)  # a PLD run's individual ε is under RDP, labelled so
    assert "under RDP; the run's accountant is PLD" in text and not math.isnan(g.share_median)


# --- the figure ---------------------------------------------------------------------------------------------------


def test_the_figure_draws_each_groups_median_with_quartiles_beside_its_tiers_promise(digits_run):
    _, run, store = digits_run
    run = {**run, "evals": store.eval_metrics(run["id"])}
    assert "individual_epsilon" in talk.TALK_FIGURES and "individual_epsilon" in training.EXTRA_FIGURES
    assert "individual_epsilon" in export.figure_titles()  # privacy-lab export and the presentation pack
    frame = individual_frame([run])
    tiers = frame[frame["grouping"] == "tier"]
    assert list(tiers["group"]) == ["ε=1", "ε=2", "ε=3"] and len(frame[frame["grouping"] == "class"]) == 10
    promise = PlanRecord.from_dict(run["plan"]).epsilons  # DP-SGD: every tier at the strictest ε
    assert tiers["planned_epsilon"].to_numpy() == pytest.approx(promise, rel=1e-6)
    assert (tiers["epsilon_median"] <= tiers["planned_epsilon"] * (1 + 1e-9)).all()
    assert frame[frame["grouping"] == "class"]["planned_epsilon"].isna().all()  # a class spans tiers
    for build in (lambda: talk.build_talk_figures([run], names=["individual_epsilon"])[0],
                  lambda: training.build_figures([run], names=["individual_epsilon"])[0]):
        spec = build()
        fig = spec.figure
        medians = [t for t in fig.data if t.meta == f"tier|{spec.data['series'].iloc[0]}"]
        assert len(medians) == 1 and list(medians[0].y) == pytest.approx(list(tiers["epsilon_median"]))
        assert list(medians[0].error_y.array) == pytest.approx(list(tiers["epsilon_q3"] - tiers["epsilon_median"]))
        planned = [t for t in fig.data if t.meta == "tier|planned"]
        assert list(planned[0].y) == pytest.approx(promise, rel=1e-6)
        captions = " ".join(a.text for a in fig.layout.annotations)
        assert "Individual ε is computed from this run's own gradients" in captions


def test_the_figure_escapes_user_text_and_says_why_it_is_empty():
    from test_plots import HOSTILE, assert_escaped, hostile_run

    run = hostile_run(1, "idp_sample")
    g = GroupIndividualEpsilon(group=f"{HOSTILE} class 0", n_samples=7, epsilon_q1=0.2, epsilon_median=0.5,
                               epsilon_q3=0.9, share_q1=0.2, share_median=0.5, share_q3=0.9)
    run["evals"][-1]["individual_epsilon"] = {"class": summary_with([g]).to_dict(),
                                              f"{HOSTILE} attribute": summary_with([g]).to_dict()}
    spec = talk.build_talk_figures([run], names=["individual_epsilon"])[0]
    assert_escaped(spec.figure, spec.name)
    assert f"{HOSTILE} class 0" in set(spec.data["group"])  # the CSV keeps what the user wrote
    empty = talk.build_talk_figures([hostile_run(2, "ino")], names=["individual_epsilon"])[0]
    assert empty.data.empty and "individual_epsilon: false" in empty.figure.layout.annotations[0].text


# --- the audit: who pays in ε beside who leaks -------------------------------------------------------------------


def test_spearman_and_its_permutation_p_agree_with_scipy():
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from scipy import stats

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), min_size=3, max_size=7))
    def check(pairs):
        a, b = zip(*pairs)
        rho = gvi.spearman(a, b)
        if len(set(a)) < 2 or len(set(b)) < 2:
            assert rho is None
            return
        assert rho == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-12)
        if len(set(a)) < len(a) or len(set(b)) < len(b):
            return  # with ties the null is not symmetric: scipy doubles one tail, ours counts |ρ| (both valid)
        exact = stats.permutation_test((a,), lambda x: stats.spearmanr(x, b).statistic, permutation_type="pairings",
                                       n_resamples=math.inf, alternative="two-sided").pvalue
        assert gvi.permutation_p(a, b, rho) == pytest.approx(exact, abs=1e-9)

    check()


def test_the_sentence_says_whether_the_groups_that_pay_most_in_epsilon_leak_most():
    from engine.audit.pa_alooa.records import Estimate

    def individual(medians):
        return summary_with([GroupIndividualEpsilon(group=g, n_samples=9, epsilon_q1=m / 2, epsilon_median=m,
                                                    epsilon_q3=m, share_q1=0.1, share_median=0.2, share_q3=0.3)
                             for g, m in medians.items()])

    eps = {"a": 0.5, "b": 0.9, "c": 1.3, "d": 2.0, "e": 2.2}
    same = gvi.individual_vs_gpr({g: Estimate(0.01 * k, 0.0, 0.1) for k, g in enumerate(eps)}, individual(eps))
    assert same.spearman == pytest.approx(1.0) and same.p_value == pytest.approx(2 / 120)
    assert same.sentence.startswith("The groups that pay most in ε are the ones that leak most (Spearman ρ = +1.00 "
                                    "over 5 groups") and "e pays most in ε" in same.sentence
    assert list(same.frame()["gpr"]) == pytest.approx([0.0, 0.01, 0.02, 0.03, 0.04])
    opposite = gvi.individual_vs_gpr({g: 0.05 - 0.01 * k for k, g in enumerate(eps)}, individual(eps).to_dict())
    assert opposite.spearman == pytest.approx(-1.0) and "leak least" in opposite.sentence
    four = dict(list(eps.items())[:4])  # a perfect order of 4 groups still arises by chance with p = 1/12
    weak = gvi.individual_vs_gpr({g: 0.01 * k for k, g in enumerate(four)}, individual(four))
    assert "not clearly" in weak.sentence and weak.p_value == pytest.approx(2 / 24)
    two = gvi.individual_vs_gpr({"Female": 0.02, "Male": 0.01, "Other": None}, individual({"Female": 1.0, "Male": 2}))
    assert two.groups == ("Female", "Male") and two.spearman is None
    assert two.sentence.startswith("With two groups, the one that pays most in ε is not the same group")
    assert gvi.individual_vs_gpr({"x": 0.1}, individual({"y": 1.0})).sentence.startswith("Too few groups")


def test_a_real_runs_individual_epsilon_by_tier_meets_a_gpr_by_tier(digits_run):
    _, run, _ = digits_run
    by_tier = RunSummary.from_dict(run["summary"]).individual_epsilon["tier"]
    names = [g.group for g in by_tier.groups]
    result = gvi.individual_vs_gpr({n: 0.01 * (k + 1) for k, n in enumerate(names)}, by_tier)
    assert result.groups == tuple(names) and result.accountant == "rdp"
    assert result.epsilon_median == tuple(g.epsilon_median for g in by_tier.groups)
    assert "over 3 groups" in result.sentence or "does not vary" in result.sentence


# --- IDP-SGD against INO-SGD, and a table with a sensitive attribute ----------------------------------------------


def test_ino_sgd_spends_at_least_what_idp_sgd_spends_at_the_same_norms(tmp_path, one_thread):
    """Both from the same seed: at step 0 their models are the same, so are the panel's norms; a run shorter than the
    cadence keeps those norms (one checkpoint). INO-SGD's sound sensitivity ρ_min·a + (1 − ρ_min)·C is never below
    a, so no group of it spends less than the same group under IDP-SGD, and its owners spend nearly their promise."""
    store = RunStore(tmp_path / "runs.sqlite")
    short = DIGITS.replace(epochs=2.0, eval_every=0)
    idp, ino = (run_into(store, short.replace(**{"algorithm.name": a})) for a in ("idp_sample", "ino"))
    assert PlanRecord.from_dict(idp["plan"]).noise_multipliers == PlanRecord.from_dict(ino["plan"]).noise_multipliers
    a, b = (RunSummary.from_dict(r["summary"]).individual_epsilon for r in (idp, ino))
    assert a["tier"].checkpoints == b["tier"].checkpoints == (0,)
    for grouping in ("class", "tier"):
        for g_idp, g_ino in zip(a[grouping].groups, b[grouping].groups):
            assert g_ino.group == g_idp.group
            assert g_ino.epsilon_median >= g_idp.epsilon_median * (1 - 1e-9)
            assert g_ino.epsilon_q1 >= g_idp.epsilon_q1 * (1 - 1e-9)
    assert min(g.share_median for g in a["tier"].groups) < min(g.share_median for g in b["tier"].groups)


@pytest.mark.slow
def test_a_table_with_a_sensitive_attribute_reports_it_with_a_panel_per_class_and_attribute_cell(one_thread):
    from engine.data import load_dataset
    from engine.dp.tiers import preset
    from engine.train.loop import train

    ds = load_dataset("adult")
    cfg = RunConfig().replace(**{"data.name": "adult", "model.name": "lr", "epochs": 0.1, "batch_size": 512,
                                 "optimizer.lr": 0.5, "algorithm.name": "idp_sample"},
                              tiers=preset("two_tier_attribute", ds))
    by = train(cfg).run_summary.individual_epsilon
    assert set(by) == {"class", "tier", "sex"}
    # every class × sex cell has its 256 panel samples: the minority cell (>50K women) too
    assert [g.n_samples for g in by["sex"].groups] == [512, 512]
    assert [g.n_samples for g in by["class"].groups] == [512, 512]
    for k, g in enumerate(by["tier"].groups):
        assert g.epsilon_median <= by["tier"].tier_epsilons[k] * (1 + 1e-9)


@pytest.mark.slow
def test_the_figure_holds_its_panels_in_a_browser(digits_run, browser, tmp_path):
    """Three groupings (10 classes, 3 tiers, an attribute's values), two series and the caption below: at the Results
    page's width and full width, no title, panel title, legend or caption over a plot area or another."""
    import os

    from tests.test_browser_layout import PAGE_PX, WIDE_PX, problems
    from tests.test_browser import CHROMIUM

    if not os.path.exists(CHROMIUM):
        pytest.skip(f"needs Debian's chromium at {CHROMIUM}")
    _, run, store = digits_run
    evals = store.eval_metrics(run["id"])
    runs = []
    for rid, algorithm in ((1, "idp_sample"), (2, "ino")):
        e = dict(evals[-1])
        e["individual_epsilon"] = {**e["individual_epsilon"], "sex": {**e["individual_epsilon"]["tier"], "groups": [
            {**g, "group": name} for g, name in zip(e["individual_epsilon"]["tier"]["groups"], ("Female", "Male"))]}}
        runs.append({**run, "id": rid, "algorithm": algorithm, "name": "", "evals": [e]})
    (spec,) = talk.build_talk_figures(runs, names=["individual_epsilon"])
    page = browser.new_page()
    found = problems(page, spec.figure, PAGE_PX, tmp_path, "individual") + \
        problems(page, spec.figure, WIDE_PX, tmp_path, "individual")
    page.close()
    assert not found, found
