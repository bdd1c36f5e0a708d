"""The talk figures (engine.figures.talk) and the sweep (engine.tools.sweep) on fabricated run records: traces
and their data, error bars from the spread of seeds, INO − IDP paired by seed, empty-figure cases, and
user text escaped; the sweep's config grid and heatmap."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from test_plots import HOSTILE, assert_escaped, hostile_run, make_run

from engine.config.run import RunConfig
from engine.config.schema import ConfigError
from engine.figures import talk
from engine.figures import talk_frames as tf
from engine.tools import sweep


def seeded(run_id: int, algorithm: str, j: int, *, gain: float = 0.0, shift: float = 0.0, group: str = "g1",
           k: int = 3) -> dict:
    """make_run as replicate j of a k-seed series (run ids first + j): config seed = j, seeds = k,
    seed_index = j; recalls shifted by ``shift``."""
    run = make_run(run_id, algorithm, gain=gain, group=group)
    run["config"] = {**run["config"], "seed": j, "seeds": k, "seed_index": j}
    for e in run["evals"]:
        for t in e["tiers"]:
            t["recall"] = min(1.0, t["recall"] + shift)
    return run


def _se(v) -> float:
    v = np.asarray(v, float)
    return float(v.std(ddof=1) / math.sqrt(len(v)))


def final_recall(run: dict, tier: str) -> float:
    return next(t["recall"] for t in run["evals"][-1]["tiers"] if t["name"] == tier)


# --- frontier ---------------------------------------------------------------------------------------------------

def test_frontier_error_bars_are_the_standard_error_over_seeds():
    shifts = [0.0, 0.05, 0.11]
    runs = [seeded(1 + j, "idp_sample", j, shift=s) for j, s in enumerate(shifts)]
    runs += [seeded(10 + j, "ino", j, gain=0.2, shift=2 * s) for j, s in enumerate(shifts)]
    spec = talk.build_talk_figures(runs, names=["privacy_frontier"])[0]
    means = [t for t in spec.figure.data if t.error_y is not None and t.error_y.array is not None]
    assert len(means) == 2 and all("(n=3)" in t.name for t in means)
    assert "seeds" in spec.figure.layout.title.text
    for trace, algo in zip(means, ("idp_sample", "ino")):
        reps = [r for r in runs if r["algorithm"] == algo]
        for x, y, e in zip(trace.x, trace.y, trace.error_y.array):
            tier = f"ε={int(x)}"
            vals = [final_recall(r, tier) for r in reps]
            assert y == pytest.approx(np.mean(vals)) and e == pytest.approx(_se(vals))
    assert list(means[0].x) == sorted(means[0].x)  # along ε
    # every run behind the means is drawn too (faint markers)
    faint = [t for t in spec.figure.data if t.name.endswith("each run")]
    assert len(faint) == 2 and all(len(t.x) == 3 * 3 for t in faint)


def test_frontier_without_seeds_uses_the_runs_of_one_algorithm():
    runs = [make_run(1, "idp_sample", group="a"), make_run(2, "idp_sample", group="b", gain=0.3), make_run(3, "ino")]
    runs[1]["config"]["seed"] = 1  # another seed: a run of its own (the same seed would be a rerun, counted once)
    f = tf.frontier_frame(runs)
    m = f[(f.kind == "mean") & (f.tier == "ε=1")].set_index("algorithm")
    assert set(f["error_bars"]) == {"runs"}
    assert m.at["idp_sample", "n"] == 2 and m.at["ino", "n"] == 1
    vals = [final_recall(r, "ε=1") for r in runs[:2]]
    assert m.at["idp_sample", "recall_se"] == pytest.approx(_se(vals))
    assert math.isnan(m.at["ino", "recall_se"])


def test_empty_selection_gives_empty_figures_that_say_why():
    for spec in talk.build_talk_figures([]):
        assert spec.data.empty and spec.figure.layout.annotations, spec.name
    assert talk.build_talk_figures([], skip_empty=True) == []
    with pytest.raises(ValueError, match="unknown talk figure"):
        talk.build_talk_figures([], names=["nope"])


# --- gains paired by seed ---------------------------------------------------------------------------------------

def test_gains_pair_ino_and_idp_by_seed_index():
    gains = [0.10, 0.20, 0.45]
    runs = [seeded(1 + j, "idp_sample", j, shift=0.1 * j) for j in range(3)]
    runs += [seeded(10 + j, "ino", j, gain=g, shift=0.1 * j) for j, g in enumerate(gains)]
    pg = tf.paired_gains(runs)
    t1 = pg[pg.tier == "ε=1"].sort_values("seed_index")
    assert list(t1["idp_run_id"]) == [1, 2, 3] and list(t1["ino_run_id"]) == [10, 11, 12]
    auc = {(r["id"]): _auc(r, "ε=1") for r in runs}
    expect = [100 * (auc[10 + j] - auc[1 + j]) for j in range(3)]
    assert list(t1["gain_auc"]) == pytest.approx(expect)
    s = tf.gain_summary(runs)
    assert s["tier"] == "ε=1" and s["pairs"] == 3
    assert s["auc_gain"] == pytest.approx(np.mean(expect)) and s["auc_se"] == pytest.approx(_se(expect))
    assert not [k for k in s if "peak" in k]  # no peak of the noisy curve: the gain averaged over IDP-SGD's MID
    assert s["mid_gain"] > 0 and s["mid_pairs"] == 3 and s["mid_spread"].endswith("(s.e. over 3 paired seeds)")
    table = tf.results_table(runs).set_index("algorithm")
    assert list(table.index) == ["IDP-SGD (SAMPLE) #1–3", "INO-SGD #10–12"]  # one row per series
    cell = table.at["INO-SGD #10–12", "ε=1 gain vs IDP, AUC (pp)"]
    assert cell == f"{np.mean(expect):+.1f} ± {_se(expect):.1f}"
    assert table.at["INO-SGD #10–12", "runs"] == 3 and "audit Δ (pp)" not in table.columns


def _auc(run, tier):
    steps = np.array([e["step"] for e in run["evals"]], float)
    rec = np.array([next(t["recall"] for t in e["tiers"] if t["name"] == tier) for e in run["evals"]])
    return float(np.trapezoid(rec, steps / steps[-1]))


# --- INO internals and DP-SGD-S clips ------------------------------------------------------------------------------

def test_ino_internals_not_recorded_is_an_empty_figure_naming_the_keys():
    fig = talk.build_talk_figures([make_run(1, "idp_sample"), make_run(2, "ino")], names=["ino_internals"])[0].figure
    text = fig.layout.annotations[0].text
    assert "not recorded by this run" in text and tf.RHO_KEY in text and tf.DOWNWEIGHTED_KEY in text
    fig = talk.build_talk_figures([make_run(1, "idp_sample")], names=["ino_internals"])[0].figure
    assert "select an INO-SGD run" in fig.layout.annotations[0].text


def test_ino_internals_mean_rho_per_tier_and_downweighted_mass():
    runs = []
    for j in range(2):
        run = seeded(1 + j, "ino", j)
        for i, e in enumerate(run["evals"]):
            e[tf.RHO_KEY] = [0.2 + 0.01 * i + 0.1 * j, 0.5, 0.9]
            e[tf.DOWNWEIGHTED_KEY] = 0.3 - 0.01 * i + 0.02 * j
        runs.append(run)
    spec = talk.build_talk_figures(runs, names=["ino_internals"])[0]
    rho = [t for t in spec.figure.data if t.xaxis == "x"]
    down = [t for t in spec.figure.data if t.xaxis == "x2"]
    assert [t.name for t in rho] == ["ε=1", "ε=2", "ε=3"] and len(down) == 1
    assert list(rho[0].y) == pytest.approx([0.25 + 0.01 * i for i in range(11)])  # mean over the two seeds
    assert list(rho[0].error_y.array) == pytest.approx([_se([0.2, 0.3])] * 11)
    assert list(down[0].y) == pytest.approx([0.31 - 0.01 * i for i in range(11)])
    assert set(spec.data["quantity"]) == {"rho", "downweighted"} and len(spec.data) == 2 * 11 * 4


def test_group_clip_over_training():
    run = make_run(1, "dpsgd_s")
    run["plan"]["clip_groups"] = ["ε=1", "ε=2", "ε=3"]
    for i, e in enumerate(run["evals"]):
        e["group_clip_norms"] = [1.0 + 0.1 * i, 1.0, 0.5]
        e["noise_std"] = 2.0 + 0.1 * i
    spec = talk.build_talk_figures([run, make_run(2, "idp_sample")], names=["group_clip"])[0]
    clips = [t for t in spec.figure.data if t.xaxis == "x"]
    noise = [t for t in spec.figure.data if t.xaxis == "x2"]
    assert [t.name for t in clips] == ["ε=1", "ε=2", "ε=3"]
    assert list(clips[0].y) == pytest.approx([1.0 + 0.1 * i for i in range(11)])
    assert list(noise[0].y) == pytest.approx([2.0 + 0.1 * i for i in range(11)])
    empty = talk.build_talk_figures([make_run(2, "idp_sample")], names=["group_clip"])[0]
    assert empty.data.empty and "DP-SGD-S" in empty.figure.layout.annotations[0].text


# --- sweep ----------------------------------------------------------------------------------------------------------

def test_sweep_configs_grid():
    base = RunConfig().replace(**{"data.max_train": 300, "epochs": 1.0, "algorithm.tail_length": 3.0})
    configs, names = sweep.sweep_configs(base, "alpha", (0.5, 2.0, 4.0), "tail_fraction", (0.25, 0.75))
    assert len(configs) == 1 + 3 * 2 and len(names) == len(configs)
    ref, cells = configs[0], configs[1:]
    assert ref.algorithm.name == "idp_sample" and all(c.algorithm.name == "ino" for c in cells)
    assert [(c.algorithm.tail_fraction, c.algorithm.alpha) for c in cells] == \
        [(y, x) for y in (0.25, 0.75) for x in (0.5, 2.0, 4.0)]
    assert all(c.algorithm.tail_length is None and c.algorithm.tif == "beta" for c in cells)  # γ as a fraction
    assert {c.data.max_train for c in configs} == {300} and {c.epochs for c in configs} == {1.0}
    scale, _ = sweep.sweep_configs(base.replace(**{"algorithm.idp_mode": "scale"}), "beta", (1.0,), "alpha", (1.0,))
    assert scale[0].algorithm.name == "idp_scale"
    with pytest.raises(ConfigError, match="two different"):
        sweep.sweep_configs(base, "alpha", (1.0,), "alpha", (2.0,))
    with pytest.raises(ConfigError, match="over the limit"):
        sweep.sweep_configs(base, "alpha", tuple(range(1, 10)), "beta", tuple(range(1, 10)))
    assert sweep.parse_grid("0.5, 1 2;2", "alpha") == (0.5, 1.0, 2.0)
    for bad, match in (("", "at least one"), ("x", "not a number"), ("0", "must be in"), ("nan", "must be in")):
        with pytest.raises(ConfigError, match=match):
            sweep.parse_grid(bad, "beta")


def sweep_runs(gains: dict) -> list[dict]:
    """A fabricated sweep group over (alpha, tail_fraction): the reference, then one INO run per cell."""
    group = sweep.group_prefix("alpha", "tail_fraction") + "-20260101-000000-abcd"
    runs = [make_run(1, "idp_sample", group=group)]
    for k, ((a, g), gain) in enumerate(gains.items()):
        r = make_run(2 + k, "ino", gain=gain, group=group)
        r["config"] = {**r["config"], "algorithm": {**r["config"]["algorithm"], "alpha": a, "tail_fraction": g}}
        runs.append(r)
    return runs


def test_sweep_heatmap_of_the_most_private_tier_gain():
    gains = {(0.5, 0.25): 0.0, (2.0, 0.25): 0.1, (0.5, 0.75): 0.2, (2.0, 0.75): 0.4}
    runs = sweep_runs(gains)
    frame = sweep.sweep_frame(runs)
    assert list(frame[["x_param", "y_param"]].iloc[0]) == ["alpha", "tail_fraction"] and set(frame.tier) == {"ε=1"}
    ref_auc = _auc(runs[0], "ε=1")
    for _, row in frame.iterrows():
        run = next(r for r in runs if r["id"] == row["run_id"])
        assert row["gain"] == pytest.approx(100 * (_auc(run, "ε=1") - ref_auc))
    fig = talk.build_talk_figures(runs, names=["tif_sweep"])[0].figure
    hm = fig.data[0]
    assert hm.type == "heatmap" and list(hm.x) == ["0.5", "2"] and list(hm.y) == ["0.25", "0.75"]
    z = np.asarray(hm.z, float)
    assert z.shape == (2, 2) and z[1, 1] == frame.gain.max() and z[0, 0] == pytest.approx(0.0, abs=1e-9)
    assert hm.zmid == 0
    at_epoch = sweep.sweep_frame(runs, metric="epoch", epoch=0.3)  # make_run: epoch = 3 · progress → step 10
    assert (at_epoch.gain > 0).sum() == 3
    # a one-row grid still knows its axes (from the group id); a plain comparison is no sweep
    one = sweep_runs({(0.5, 0.5): 0.1, (2.0, 0.5): 0.2})
    assert sweep.sweep_axes(one) == ("alpha", "tail_fraction")
    plain = talk.build_talk_figures([make_run(1, "idp_sample"), make_run(2, "ino")], names=["tif_sweep"])[0]
    assert plain.data.empty and "not a sweep" in plain.figure.layout.annotations[0].text


# --- audit -----------------------------------------------------------------------------------------------------------

def test_advantage_ceiling_and_its_inverse():
    assert tf.advantage_ceiling(0.0, 0.0) == 0.0
    assert tf.advantage_ceiling(math.log(3), 0.0) == pytest.approx(0.5)  # (3 − 1) / (3 + 1)
    for eps in (0.1, 1.0, 3.0, 8.0):
        for delta in (0.0, 1e-5):
            assert tf.epsilon_from_advantage(tf.advantage_ceiling(eps, delta), delta) == pytest.approx(eps)
    assert tf.epsilon_from_advantage(-0.1, 1e-5) == 0.0


def audit_results(tier_names=("ε=1", "ε=3"), gprs=(0.05, 0.02), label="IDP-SGD (SAMPLE)") -> dict:
    def algo(key, name, lab, formal, g):
        return {"key": key, "name": name, "label": lab, "formal_dp": formal, "algorithm": {"name": name},
                "plan": None, "info": {},
                "gpr": {"groups": {t: {"mean": v, "low": v - 0.01, "high": v + 0.01} for t, v in zip(tier_names, g)},
                        "delta": {"value": 100 * (max(g) - min(g)), "low": 0.0, "high": 5.0}, "n_boot": 100, "ci": 0.95},
                "null_floor": 0.005, "advantage_mean": float(np.mean(g)),
                "baselines": {"pa_ga": 0.01, "pa_gba": {}}, "accuracy": {"mean": 0.8, "std": 0.01, "min": 0.79,
                                                                          "max": 0.81, "groups": {}},
                "lira": {"groups": {}, "roc": {}}, "histogram": {"edges": [0.0, 1.0], "counts": {}},
                "epsilon": {"tiers": [{"name": t, "claimed": e, "target": e, "lower_bound": 0.1 * e}
                                      for t, e in zip(tier_names, (1.0, 3.0))], "confidence": 0.95, "delta": 1e-5}}
    return {"kind": "audit", "version": 2, "config": {}, "dataset": "digits", "n_train": 10, "R": 2, "n_models": 4,
            "threshold": "held_out", "group_by": "tier", "group_names": list(tier_names),
            "group_sizes": {t: 5 for t in tier_names}, "tier_names": list(tier_names), "tier_sizes": [5, 5],
            "algorithms": [algo("idp_sample", "idp_sample", label, True, gprs),
                           algo("ino", "ino", "INO-SGD", True, tuple(2 * v for v in gprs))]}


def test_audit_gpr_per_tier_against_its_epsilon():
    results = audit_results()
    spec = talk.build_talk_figures([make_run(1, "idp_sample"), make_run(2, "ino")], names=["audit_tiers"],
                                   audit=results)[0]
    f = spec.data
    assert len(f) == 2 * 2 and list(f["epsilon"][:2]) == [1.0, 3.0]
    row = f[(f.algorithm == "ino") & (f.tier == "ε=1")].iloc[0]
    assert row["gpr"] == pytest.approx(0.1) and row["ceiling"] == pytest.approx(tf.advantage_ceiling(1.0, 1e-5))
    assert row["epsilon_from_gpr"] == pytest.approx(tf.epsilon_from_advantage(0.1, 1e-5))
    assert row["epsilon_lower_bound"] == pytest.approx(0.1)
    names = [t.name for t in spec.figure.data]
    assert "IDP-SGD (SAMPLE): GPR" in names and "largest advantage (ε, δ)-DP allows" in names
    ceiling = next(t for t in spec.figure.data if t.name == "largest advantage (ε, δ)-DP allows")
    assert all(b >= a for a, b in zip(ceiling.y, ceiling.y[1:]))  # grows with ε
    gpr = next(t for t in spec.figure.data if t.name == "INO-SGD: GPR")
    assert list(gpr.y) == pytest.approx([0.1, 0.04]) and list(gpr.error_y.array) == pytest.approx([0.01, 0.01])
    floors = next(t for t in spec.figure.data if t.name == "INO-SGD: null floor")
    assert list(floors.y) == pytest.approx([0.005, 0.005])  # GPR's zero, beside its CI
    # GPRs far below the (ε, δ)-DP ceiling: the GPR panel zooms to them (every CI and floor inside) and says so
    low, high = spec.figure.layout.yaxis.range
    assert low < 0 <= 0.005 and 0.11 < high < tf.advantage_ceiling(1.0, 1e-5)
    assert any("ceiling" in (a.text or "") and "0.46" in a.text for a in spec.figure.layout.annotations)
    near = talk.build_talk_figures([make_run(1, "idp_sample")], names=["audit_tiers"],
                                   audit=audit_results(gprs=(0.3, 0.2)))[0].figure
    assert near.layout.yaxis.range is None and not any("ceiling" in (a.text or "") for a in near.layout.annotations)
    table = tf.results_table([make_run(1, "idp_sample"), make_run(2, "ino", gain=0.2)], results).set_index("algorithm")
    assert table.at["INO-SGD #2", "audit Δ (pp)"] == f"{100 * (0.1 - 0.04):.2f}"  # matched by algorithm
    none = talk.build_talk_figures([make_run(1, "idp_sample")], names=["audit_tiers"])[0]
    assert none.data.empty and "no audit" in none.figure.layout.annotations[0].text


# --- escaping ---------------------------------------------------------------------------------------------------------

def test_user_text_is_escaped_in_every_talk_figure():
    runs = [hostile_run(1, "idp_sample"), hostile_run(2, "ino"), hostile_run(3, "dpsgd_s"),
            hostile_run(4, "dpsgd_global_adapt")]
    for k, e in enumerate(runs[3]["evals"]):  # what Global-Adapt's evaluations record: Z, C / max(Z, C), its noise
        z = 0.5 + 0.3 * k
        e.update({"group_clip_norms": [max(z, 1.0)], "noise_std": 1.4, "global_threshold": z,
                  "global_scale": 1.0 / max(z, 1.0)})
    for e in runs[1]["evals"]:
        e[tf.RHO_KEY] = [0.1, 0.5, 0.9]
        e[tf.DOWNWEIGHTED_KEY] = 0.2
    runs[2]["plan"]["clip_groups"] = [f"{HOSTILE} group {k}" for k in range(3)]
    for e in runs[2]["evals"]:
        e["group_clip_norms"], e["noise_std"] = [1.0, 2.0, 3.0], 1.5
    runs[0]["evals"][-1]["individual_epsilon"] = {  # individual ε per group (issue 62), its groups named by the user
        "tier": {"step": 100, "accountant": "rdp", "run_accountant": "rdp", "delta": 1e-5, "panel_per_group": 256,
                 "checkpoints": [0], "tier_epsilons": [1.0, 2.0], "groups": [
                     {"group": f"{HOSTILE} tier {k}", "n_samples": 5, "epsilon_q1": 0.1, "epsilon_median": 0.2,
                      "epsilon_q3": 0.3, "share_q1": 0.1, "share_median": 0.2, "share_q3": 0.3} for k in range(2)]}}
    results = audit_results(tier_names=(f"{HOSTILE} tier 0", f"{HOSTILE} tier 2"), label=HOSTILE)
    for spec in talk.build_talk_figures(runs, audit=results, skip_empty=True):
        assert_escaped(spec.figure, spec.name)
    assert {s.name for s in talk.build_talk_figures(runs, audit=results, skip_empty=True)} == \
        set(talk.TALK_FIGURES) - {"tif_sweep"}
    data = talk.build_talk_figures(runs, names=["results_table"])[0].data
    assert f"{HOSTILE} #1" in set(data["algorithm"])  # the CSV keeps what the user wrote
    assert isinstance(data, pd.DataFrame)
