"""DP-SGD-S's controls (noise-matched and accuracy-matched DP-SGD), the paired bootstrap and the verdict in words.

Truth first (synthetic advantages with a known difference), then one small audit with the controls on."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from in_process import cli_here

from engine.audit.pa_alooa.controls import compare
from engine.audit.pa_alooa.controls import plan as controls
from engine.audit.pa_alooa.config import DEFAULT_RUN, AuditConfig
from engine.audit.pa_alooa.report import AlgorithmReport, AuditReport
from engine.audit.pa_alooa.setup import prepare_audit
from engine.audit.pa_alooa.runner import run_audit
from engine.audit.pa_alooa.summary import compact_summary, summary_table
from engine.audit.pa_alooa.verdict import delta_verdict, dpsgd_s_verdict, verdict_lines
from engine.config.run import AlgorithmConfig
from engine.config.schema import ConfigError
from engine.dp import accounting
from engine.dp.mechanisms import GroupAdaptive

SMALL = AuditConfig(run=DEFAULT_RUN.replace(**{"data.name": "digits", "epochs": 2.0, "batch_size": 64, "threads": 1}),
                    group_by="class", R=4, epsilon=2.0, n_boot=100, null_perms=2, looa_k=0, controls=True,
                    algorithms=(AlgorithmConfig(name="dpsgd"), AlgorithmConfig(name="dpsgd_s", group_by="class")))


# --------------------------------------------------------------------------------------------
# the paired bootstrap on synthetic advantages (known truth)
# --------------------------------------------------------------------------------------------

def _synthetic(rng, n_per_group=400, shift=(0.0, 0.0), shared=0.08, own=0.01):
    """Two algorithms' per-sample advantages over two groups. Sample i has a large effect u_i shared by both
    (the pairing: same sample, same splits) and a small one of its own; algorithm a's group means are b's plus
    ``shift`` (fractions). Population: GPR_b = (0.02, 0.05), Δ_b = 3 pp; Δ_a − Δ_b is known."""
    groups = np.repeat(np.array(["g0", "g1"]), n_per_group)
    base = np.where(groups == "g0", 0.02, 0.05)
    u = shared * rng.standard_normal(groups.size)
    b = base + u + own * rng.standard_normal(groups.size)
    a = base + np.where(groups == "g0", shift[0], shift[1]) + u + own * rng.standard_normal(groups.size)
    return a, b, groups


def _true_delta_diff(shift):
    ga, gb = np.array([0.02 + shift[0], 0.05 + shift[1]]), np.array([0.02, 0.05])
    return (np.ptp(ga) - np.ptp(gb)) * 100.0


def test_paired_bootstrap_covers_the_known_difference_at_the_nominal_rate():
    shift = (0.0, -0.01)  # a lowers the high-risk group by 1 pp: Δ_a − Δ_b = −1 pp
    truth = _true_delta_diff(shift)
    covered, paired_width, unpaired_width = 0, [], []
    for seed in range(100):
        rng = np.random.default_rng(seed)
        a, b, g = _synthetic(rng, shift=shift)
        p = compare.paired_bootstrap(a, b, g, n_boot=400, ci=0.95, seed=seed)
        u = compare.paired_bootstrap(a, b, g, n_boot=400, ci=0.95, seed=seed, paired=False)
        covered += p["delta"]["low"] <= truth <= p["delta"]["high"]
        paired_width.append(p["delta"]["high"] - p["delta"]["low"])
        unpaired_width.append(u["delta"]["high"] - u["delta"]["low"])
        assert p["delta"]["plug_in"] == pytest.approx(u["delta"]["plug_in"])  # the same plug-in
        assert p["delta"]["low"] <= p["delta"]["value"] <= p["delta"]["high"]  # each bias-corrected with its draws
    assert covered >= 90, f"the paired 95 % CI covered the true difference in {covered} of 100 seeds"
    # shared sample effects: the paired CI is several times narrower than two independent resamples imply
    assert np.median(paired_width) < 0.5 * np.median(unpaired_width)


def test_paired_bootstrap_group_differences_and_nan_samples():
    rng = np.random.default_rng(7)
    a, b, g = _synthetic(rng, shift=(0.0, -0.02))
    a[:5] = np.nan  # a sample without a defined advantage under either algorithm is left out of both
    p = compare.paired_bootstrap(a, b, g, n_boot=300, seed=1)
    ok = np.isfinite(a)
    want = {k: (a[ok & (g == k)].mean() - b[ok & (g == k)].mean()) * 100 for k in ("g0", "g1")}
    for k, v in want.items():
        assert p["groups"][k]["value"] == pytest.approx(v, abs=1e-12)
    assert p["groups"]["g1"]["high"] < 0 < p["groups"]["g0"]["high"] and p["groups"]["g0"]["low"] < 0
    with pytest.raises(ValueError):
        compare.paired_bootstrap(a, b[:-1], g)


def test_accuracy_difference_is_paired_over_complementary_pairs():
    rng = np.random.default_rng(3)
    model_effect = 0.02 * rng.standard_normal(40)  # shared by both algorithms' model j
    acc_b = 0.80 + model_effect
    acc_a = acc_b - 0.01 + 0.001 * rng.standard_normal(40)
    d = compare.accuracy_difference(acc_a, acc_b)
    assert d.low < -1.0 < d.high and d.high < 0  # −1 point, resolved
    units = (acc_a - acc_b).reshape(-1, 2).mean(1) * 100
    assert d.value == pytest.approx(units.mean())
    single = compare.accuracy_interval(acc_a)
    assert single.high - single.low > 5 * (d.high - d.low)  # the model effect cancels in the paired difference


# --------------------------------------------------------------------------------------------
# the verdict in words (from synthetic comparisons through the real compare / report path)
# --------------------------------------------------------------------------------------------

def _algo(key, name, label, gpr):
    return AlgorithmReport.from_dict({"key": key, "name": name, "label": label, "formal_dp": True,
                                      "gpr": {"groups": {g: {"mean": v, "low": v, "high": v} for g, v in gpr.items()}},
                                      "accuracy": {"mean": 0.8}})


def _report(shift, seed=0):
    rng = np.random.default_rng(seed)
    a, b, g = _synthetic(rng, shift=shift)
    ra = _algo("dpsgd_s", "dpsgd_s", "DP-SGD-S", {k: float(a[g == k].mean()) for k in ("g0", "g1")})
    rb = _algo("dpsgd", "dpsgd", "DP-SGD", {k: float(b[g == k].mean()) for k in ("g0", "g1")})
    acc = 0.8 + 0.01 * rng.standard_normal(20)
    c = compare.compare(ra, rb, a, b, acc - 0.02, acc, g, n_boot=300, ci=0.95, seed=seed)
    return AuditReport(dataset="synthetic", n_train=a.size, R=10, n_models=20, threshold="held_out",
                       group_by="attribute", group_names=("g0", "g1"), group_sizes={"g0": 400, "g1": 400},
                       tier_names=("all",), tier_sizes=(800,), algorithms=(ra, rb), comparisons=(c,))


def test_verdict_flips_with_the_sign_of_the_difference_and_says_not_resolved_when_the_ci_covers_zero():
    lower_lines = dpsgd_s_verdict(_report((0.0, -0.02)), "dpsgd_s")
    higher_lines = dpsgd_s_verdict(_report((0.0, +0.02)), "dpsgd_s")
    none_lines = dpsgd_s_verdict(_report((0.0, 0.0)), "dpsgd_s")
    lower, higher = " ".join(lower_lines), " ".join(higher_lines)
    assert lower_lines[0].startswith("DP-SGD-S lowers Δ by") and "raises" not in lower_lines[0]
    assert higher_lines[0].startswith("DP-SGD-S raises Δ by") and "lowers" not in higher_lines[0]
    assert "(not resolved)" in none_lines[0] and "lowers" not in none_lines[0] and "raises" not in none_lines[0]
    # the accuracy against DP-SGD's, the direction in words, with its paired CI (a "cost" of +0.07 read both ways)
    assert "DP-SGD-S's accuracy is 2.00 points below DP-SGD's [" in lower
    assert "DP-SGD-S's accuracy is 2.00 points below DP-SGD's [" in higher  # (the same accuracies in both)
    # levelling up: the high-risk group g1 lowered, g0 unchanged → holds; g1 raised → does not hold
    assert "Levelling up vs DP-SGD holds" in lower
    assert "Levelling up vs DP-SGD does not hold: risk raised for g1" in higher


def test_comparisons_and_controls_round_trip_through_the_report_dict():
    r = _report((0.0, -0.02))
    assert AuditReport.from_dict(r.to_dict()) == r
    assert r.comparison("dpsgd_s", "dpsgd") is r.comparisons[0]
    frame = r.comparison_frame()
    assert set(frame["quantity"]) == {"Δ", "GPR", "accuracy"} and len(frame) == 4


# --------------------------------------------------------------------------------------------
# the accuracy-matched search (a known monotone accuracy curve)
# --------------------------------------------------------------------------------------------

def test_accuracy_matched_search_finds_the_crossing_and_says_when_there_is_none():
    def curve(e):
        return 0.9 - 0.3 * math.exp(-e)  # increasing in ε

    target = curve(0.7)
    eps, trace, matched = controls.search_accuracy_match(curve, target, 4.0)
    assert matched and eps == pytest.approx(0.7, rel=0.02)
    assert trace[0] == (4.0, curve(4.0)) and len(trace) == controls.max_pilot_runs()
    # DP-SGD less accurate than the target even at 64 ε: no crossing, the nearer end, said so
    eps, trace, matched = controls.search_accuracy_match(curve, 0.95, 1.0)
    assert not matched and eps == 64.0 and len(trace) == 2
    # the bracket never goes below the floor
    eps, trace, matched = controls.search_accuracy_match(curve, 0.0, 1.0, floor=0.5)
    assert not matched and min(e for e, _ in trace) == 0.5


# --------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------

def test_controls_need_dpsgd_s_and_dpsgd():
    with pytest.raises(ConfigError) as e:
        SMALL.replace(algorithms=(AlgorithmConfig(name="dpsgd_s", group_by="class"),)).validate()
    assert e.value.field == "controls" and "'dpsgd'" in str(e.value)
    cfg = SMALL.validate()
    assert AuditConfig.from_json(cfg.to_json()) == cfg and json.loads(cfg.to_json())["controls"] is True
    setup = prepare_audit(cfg)
    keys = [a.key for a in setup.algos]
    assert keys == ["dpsgd", "dpsgd_s", "dpsgd_noise_matched", "dpsgd_accuracy_matched"]
    assert [a.resolved for a in setup.algos] == [True, True, False, False]


# --------------------------------------------------------------------------------------------
# one audit with the controls
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def audited():
    """SMALL, run once, with every noise std DP-SGD-S's mechanism gave the step recorded (its own method,
    called by engine.dp.step.dp_step once per step)."""
    recorded = []
    original = GroupAdaptive.noise_std

    def spy(self):
        out = original(self)
        recorded.append(out.detach().cpu().numpy().copy())
        return out

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    GroupAdaptive.noise_std = spy
    try:
        report = run_audit(SMALL)
    finally:
        GroupAdaptive.noise_std = original
        torch.set_num_threads(old)
    return report, recorded


@pytest.mark.slow
def test_noise_matched_control_uses_the_realised_multiplier_and_the_accountants_epsilon(audited):
    report, recorded = audited
    s = report.algorithm("dpsgd_s")
    control = report.algorithm("dpsgd_noise_matched")
    assert control.control.kind == "noise_matched" and control.control.of == "dpsgd_s"
    # every model's noise std at every step, as the step used it: mean / C is the realised multiplier
    realised = float(np.mean(np.concatenate(recorded))) / SMALL.run.clip_norm
    assert len(recorded) == report.steps_per_model * math.ceil(report.n_models / report.chunk_models)
    assert abs(control.control.noise_multiplier - realised) <= 1e-9
    assert abs(s.realised_noise_multiplier - realised) <= 1e-9
    q = control.plan[0]["sample_rate"]
    assert q == report.algorithm("dpsgd").plan[0]["sample_rate"]  # same batches' rate as DP-SGD
    eps = accounting.epsilon(sample_rate=q, noise_multiplier=realised, steps=report.steps_per_model,
                             delta=SMALL.run.delta)
    assert control.control.epsilon == pytest.approx(eps, rel=1e-12)
    assert control.epsilon[0].claimed == pytest.approx(eps, rel=1e-12)
    assert eps < SMALL.epsilon  # more noise than DP-SGD at the target: a lower ε, and the table says so
    assert s.noise_ratio == pytest.approx(realised / s.dpsgd_noise_multiplier)
    assert s.dpsgd_noise_multiplier == pytest.approx(report.algorithm("dpsgd").plan[0]["noise_multiplier"])
    assert f"ε {control.control.epsilon:.4g} (target {SMALL.epsilon:g})" in summary_table(report)


def test_accuracy_matched_control_trains_at_the_searched_epsilon(audited):
    report, _ = audited
    control = report.algorithm("dpsgd_accuracy_matched").control
    assert control.kind == "accuracy_matched" and control.pilot_models == min(16, report.n_models)
    assert 2 <= len(control.search) <= controls.max_pilot_runs()
    tried = [e for e, _ in control.search]
    assert tried[0] == SMALL.epsilon
    plan = report.algorithm("dpsgd_accuracy_matched").plan[0]
    eps = accounting.epsilon(sample_rate=plan["sample_rate"], noise_multiplier=plan["noise_multiplier"],
                             steps=report.steps_per_model, delta=SMALL.run.delta)
    assert control.epsilon == pytest.approx(eps, rel=1e-12)
    if control.matched:  # the found ε's pilot accuracy is the one nearest DP-SGD-S's in the final bracket
        accs = dict(control.search)
        assert any(abs(e - plan["target_epsilon"]) <= 1e-9 * e for e in accs)


def test_audit_comparisons_are_paired_and_the_verdict_reads_them(audited):
    report, _ = audited
    pairs = [(c.a, c.b) for c in report.comparisons]
    assert pairs == [("dpsgd_s", "dpsgd"), ("dpsgd_s", "dpsgd_noise_matched"), ("dpsgd_s", "dpsgd_accuracy_matched")]
    for c in report.comparisons:
        a, b = report.algorithm(c.a), report.algorithm(c.b)
        assert c.delta.value == pytest.approx(a.delta.value - b.delta.value, abs=1e-9)
        assert c.accuracy.value == pytest.approx((a.accuracy.mean - b.accuracy.mean) * 100, abs=1e-9)
        assert c.delta.low <= c.delta.value <= c.delta.high
    lines = verdict_lines(report)
    first = len(delta_verdict(report))  # every audit's Δ verdict first, then DP-SGD-S's sentences
    assert lines[:first] == delta_verdict(report) and lines[0].startswith("Δ ")
    assert lines[first].startswith("DP-SGD-S ") and "vs noise-matched DP-SGD" in lines[first]
    assert any(w in lines[first] for w in ("beyond what its extra noise explains", "not beyond what its extra noise",
                                       "less than its extra noise alone"))
    assert any(line.startswith("DP-SGD-S's accuracy is ") and " DP-SGD's" in line for line in lines)
    assert compact_summary(report)["verdict"] == lines
    assert AuditReport.from_dict(report.to_dict()) == report
    frame = report.delta_frame()
    assert "accuracy − DP-SGD (points)" in frame.columns
    row = frame[frame["algorithm"] == "DP-SGD-S"].iloc[0]
    assert row["accuracy − DP-SGD (points)"] == pytest.approx(round(report.comparisons[0].accuracy.value, 2))


@pytest.mark.slow
def test_a_resumed_audit_with_controls_gives_the_uninterrupted_results(tmp_path, audited):
    from engine.jobs.kinds import execute
    from engine.store.db import RunStore
    from engine.store.lifecycle import Cancelled

    store = RunStore(tmp_path / "s.sqlite")
    run_id = store.create_run(SMALL.to_dict(), kind="audit", group_id="g")
    # stop once the accuracy-matched control's search is kept, before its models train
    stop = lambda: "control/accuracy_matched/search" in store.artifact_keys(run_id)  # noqa: E731
    with pytest.raises(Cancelled):
        execute(store, run_id, SMALL, kind="audit", should_stop=stop)
    keys = store.artifact_keys(run_id)
    assert "chunk/dpsgd_noise_matched/aloo/0" in keys and "chunk/dpsgd_accuracy_matched/aloo/0" not in keys
    search = store.get_artifact(run_id, "control/accuracy_matched/search")
    resumed = execute(store, run_id, SMALL, kind="audit")
    assert store.get_artifact(run_id, "control/accuracy_matched/search") == search  # not searched again
    fresh, _ = audited
    for a, b in zip(resumed.algorithms, fresh.algorithms):
        assert a.key == b.key and a.gpr == b.gpr and a.delta == b.delta and a.control == b.control
        assert a.realised_noise_multiplier == b.realised_noise_multiplier
    assert resumed.comparisons == fresh.comparisons


def test_cli_controls_flag(tmp_path):
    cfg = SMALL.replace(controls=False, R=2)
    path = tmp_path / "audit.json"
    path.write_text(cfg.to_json())
    out = cli_here("audit", str(path), "--controls", "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert [a["key"] for a in summary["algorithms"]][-2:] == ["dpsgd_noise_matched", "dpsgd_accuracy_matched"]
    assert summary["verdict"] and summary["comparisons"][0]["a"] == "dpsgd_s"
    bad = tmp_path / "bad.json"
    bad.write_text(cfg.replace(algorithms=(AlgorithmConfig(name="dpsgd"),)).to_json())
    out = cli_here("audit", str(bad), "--controls")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "controls" in out.stderr


@pytest.mark.slow
def test_the_accuracy_search_trains_its_pilot_within_the_audit_chunks():
    """A pilot larger than a chunk trains chunk by chunk (the memory budget), and its first chunk is the one
    a single-chunk pilot trains (so a small chunk size changes only the later chunks' batches)."""
    import engine.audit.pa_alooa.controls.runs as runs_module

    cfg = SMALL.replace(R=4, chunk_models=3, algorithms=SMALL.algorithms)
    sizes = []
    original = runs_module.train_chunk

    def spy(setup, a, members, *args, **kw):
        if a.control is None and a.algo.name == "dpsgd" and args[2] is None:  # a pilot chunk (no progress)
            sizes.append(len(members))
        return original(setup, a, members, *args, **kw)

    runs_module.train_chunk = spy
    try:
        report = run_audit(cfg.replace(R=4))
    finally:
        runs_module.train_chunk = original
    pilot = report.algorithm("dpsgd_accuracy_matched").control.pilot_models
    runs = len(report.algorithm("dpsgd_accuracy_matched").control.search)
    assert pilot == 8 and max(sizes) <= 3 and sum(sizes) == pilot * runs
