"""The experiment scripts (experiments/*.py): argument handling, a tiny smoke configuration of each, the
paired-seed property they rely on, and the two configurable conventions (steps rule, CNN padding).
The quick and full runs are not run here (they take minutes to hours)."""
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from in_process import main_here

from engine.config.run import ModelConfig, RunConfig, total_steps
from engine.config.schema import ConfigError
from engine.figures.experiments import COLLUSION_COLUMNS, collusion_sentence, fig_collusion
from engine.models.nets import build_model
from engine.store.db import RunStore
from experiments import accountants, collusion, group_risk, ino_vs_idp, pareto, tif_search

REPO = Path(__file__).resolve().parents[1]
SCRIPT_MAINS = {"ino_vs_idp.py": ino_vs_idp.main, "pareto.py": pareto.main, "group_risk.py": group_risk.main,
                "tif_search.py": tif_search.main, "accountants.py": accountants.main, "collusion.py": collusion.main}
SCRIPTS = tuple(SCRIPT_MAINS)


def _cli(script, *args):
    """``python experiments/SCRIPT ARGS`` in this process (tests/in_process.py): its exit code, stdout, stderr."""
    return main_here(SCRIPT_MAINS[script], list(args), cwd=REPO)


# --- conventions ---------------------------------------------------------------------------------

def test_steps_rule_round_is_default_and_floor_per_epoch_is_the_reference_count():
    assert total_steps(12, 60000, 512) == 1406  # round(12 · 60000 / 512) = round(1406.25)
    assert total_steps(12, 60000, 512, "floor_per_epoch") == 1404  # 12 · ⌊60000 / 512⌋ = 12 · 117
    assert RunConfig().steps_rule == "round"
    cfg = RunConfig.from_dict({"epochs": 12, "batch_size": 512, "steps_rule": "floor_per_epoch"}).validate()
    assert cfg.planned_steps(60000) == 1404
    assert RunConfig(epochs=12, batch_size=512).planned_steps(60000) == 1406
    assert RunConfig.from_json(cfg.to_json()) == cfg
    for bad in ("floor", 3, None):
        with pytest.raises(ConfigError) as e:
            RunConfig.from_dict({"steps_rule": bad}).validate()
        assert e.value.field == "steps_rule"


def test_cnn_padding_is_configurable_and_defaults_to_3():
    default = build_model(ModelConfig(name="cnn"), (1, 28, 28), 10)
    ref = build_model(ModelConfig(name="cnn", cnn_padding=2), (1, 28, 28), 10)
    assert default.features[0].padding == (3, 3) and ref.features[0].padding == (2, 2)
    assert ref(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    small = build_model(ModelConfig(name="cnn", cnn_padding=2), (1, 8, 8), 10)  # digits: its own small kernels
    assert small.features[0].padding == (1, 1)
    for bad in (-1, 9, "2", 2.0):
        with pytest.raises(ConfigError) as e:
            RunConfig.from_dict({"model": {"name": "cnn", "cnn_padding": bad}}).validate()
        assert e.value.field == "model.cnn_padding"


def test_train_epochs_trains_the_first_epochs_of_the_planned_run(one_thread):
    from engine.train.loop import prepare, train

    full = RunConfig.from_dict({"data": {"name": "digits", "max_train": 400}, "model": {"name": "lr"}, "epochs": 4,
                                "batch_size": 50, "eval_every": 2, "device": "cpu",
                                "algorithm": {"name": "idp_sample"}}).validate()
    part = full.replace(train_epochs=1.0)
    assert (full.trained_steps(400), part.trained_steps(400)) == (32, 8)
    res = train(part)
    assert [e["step"] for e in res.evals][-1] == 8 and res.summary["steps"] == 8
    assert res.summary["planned_steps"] == 32 and res.plan["steps"] == 32 and res.plan["trained_steps"] == 8
    assert res.plan["sample_rates"] == prepare(full).plan.to_dict()["sample_rates"]  # the 4-epoch plan
    spent = [t["epsilon_spent"] for t in res.summary["tiers"]]
    assert all(s < t["epsilon"] for s, t in zip(spent, res.summary["tiers"]))  # a quarter of the steps
    with pytest.raises(ConfigError) as e:
        full.replace(train_epochs=5.0).validate()
    assert e.value.field == "train_epochs"


# --- argument handling ---------------------------------------------------------------------------

@pytest.mark.parametrize("script", SCRIPTS)
def test_bad_arguments_end_with_one_line_and_exit_2(script):
    for args in (["--bogus"], ["--quick", "--full"], ["--threads", "0"], ["--device", "tpu"]):
        r = _cli(script, *args)
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == "", (args, r.stderr)


def test_bad_spec_or_missing_mode_is_one_line(tmp_path):
    r = _cli("ino_vs_idp.py", "--config", str(tmp_path / "nope.json"), "--smoke")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "nope.json" in r.stderr
    r = _cli("ino_vs_idp.py", "--quick", "--config", str(REPO / "experiments" / "ino_vs_idp_cifar10.json"))
    assert r.returncode == 2 and "no quick mode" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    bad = tmp_path / "bad.json"
    spec = json.loads((REPO / "experiments" / "ino_vs_idp.json").read_text())
    spec["modes"]["smoke"]["batch_size"] = 0
    bad.write_text(json.dumps(spec))
    r = _cli("ino_vs_idp.py", "--smoke", "--config", str(bad), "--store", str(tmp_path / "s.sqlite"))
    assert r.returncode == 2 and r.stderr.strip().startswith("error: batch_size")


# --- pairing ---------------------------------------------------------------------------------------

def _tiny(algorithm, seed=0):
    return RunConfig.from_dict({"data": {"name": "digits", "max_train": 300}, "model": {"name": "cnn"},
                                "batch_size": 64, "epochs": 1, "seed": seed, "device": "cpu",
                                "optimizer": {"lr": 0.5, "momentum": 0.5}, "algorithm": algorithm}).validate()


@pytest.mark.slow
def test_paired_runs_share_init_batches_and_noise_draws(one_thread):
    from experiments.pairing import check_pairing

    idp, ino = _tiny({"name": "idp_sample"}), _tiny({"name": "ino", "beta": 3.0})
    out = check_pairing(idp, ino, steps=4)
    assert out["paired"] and out["same_batches"] and out["same_random_numbers"] and out["same_init"]
    assert out["gradients_differ"]  # the weights ρ do change the update: the pair is not one run twice
    other = check_pairing(idp, _tiny({"name": "ino", "beta": 3.0}, seed=1), steps=2)
    assert not other["paired"] and not other["same_init"] and not other["same_batches"]


# --- smoke runs ------------------------------------------------------------------------------------

def _main(module, argv, capsys):
    module.main(argv)
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.slow
def test_ino_vs_idp_smoke(tmp_path, capsys, one_thread):
    store = tmp_path / "s.sqlite"
    d = _main(ino_vs_idp, ["--smoke", "--json", "--no-figures", "--store", str(store)], capsys)
    for key in ("epochs", "recall_gain_by_tier", "overall_accuracy", "pearson", "seeds", "mid", "per_epoch", "pairing"):
        assert key in d
    assert d["seeds"] == [0, 1] and d["epochs"] == [1]
    assert d["tier_epsilons"] == sorted(d["tier_epsilons"])  # from the smallest ε
    g = d["recall_gain_by_tier"]
    assert set(g) >= {"epoch1", "epoch2", "final", "auc"} and g["epoch2"] is None
    assert all(len(g[k]) == 3 for k in ("epoch1", "final", "auc"))
    assert set(d["overall_accuracy"]) >= {"ino", "idp"} and 0 <= d["overall_accuracy"]["idp"] <= 100
    assert set(d["pearson"]) >= {"r", "p"}
    assert all(p["paired"] for p in d["pairing"].values())
    per_seed = d["variants"]["ino_b1"]["gains"]["final"]["per_seed"]
    assert len(per_seed) == 2 and all(len(row) == 3 for row in per_seed)
    mean = [sum(row[j] for row in per_seed) / 2 for j in range(3)]
    assert mean == pytest.approx(g["final"])
    # the runs are in the store, one per (algorithm, seed), and --reuse takes them instead of training again
    from engine.store.db import RunStore

    assert len(RunStore(store).list_runs(kind="train", status="finished")) == 6
    again = _main(ino_vs_idp, ["--smoke", "--json", "--no-figures", "--reuse", "--store", str(store)], capsys)
    assert again["run_ids"] == d["run_ids"] and again["recall_gain_by_tier"] == g


@pytest.mark.slow
def test_accountants_smoke(tmp_path, capsys, one_thread):
    """§7's rows: every (plan, accountant, algorithm) once, the plan's own q and σ of the ε = 1 tier; PLD's plan
    gives that tier a higher rate and less noise than RDP's of the same settings."""
    d = _main(accountants, ["--smoke", "--json", "--no-figures", "--store", str(tmp_path / "a.sqlite")], capsys)
    rows = {(r["plan_epochs"], r["accountant"], r["algorithm"]): r for r in d["rows"]}
    assert set(rows) == {(p, a, k) for p in (2, 4) for a in ("rdp", "pld") for k in ("idp", "ino_b1")}
    for p in (2, 4):
        rdp, pld = rows[(p, "rdp", "idp")], rows[(p, "pld", "idp")]
        assert pld["sample_rate"] > rdp["sample_rate"] and pld["noise_multiplier"] < rdp["noise_multiplier"]
        assert rows[(p, "pld", "ino_b1")]["sample_rate"] == pld["sample_rate"]  # paired: the same plan
        for r in (rdp, pld):
            assert set(r["recall"]) >= {"epoch1", "final"} and 0 <= r["recall"]["final"]["mean"] <= 100
            assert r["epsilon_planned"] <= 1.0 and r["mid_depth"]["mean"] >= 0


@pytest.mark.slow
def test_pareto_smoke(tmp_path, capsys, one_thread):
    d = _main(pareto, ["--smoke", "--json", "--no-figures", "--store", str(tmp_path / "p.sqlite")], capsys)
    kinds = [s["kind"] for s in d["settings"]]
    assert kinds == ["reference", "ino"] and d["n_seeds"] == 2
    for s in d["settings"]:
        assert s["n"] == 2 and 0 <= s["accuracy"] <= 100 and s["imbalance"] is not None


def test_tif_search_refuses_bad_search_settings_in_one_line(tmp_path):
    for args in (["--trials", "0"], ["--parallel", "-2"], ["--max-accuracy-drop", "101"],
                 ["--max-accuracy-drop", "nan"]):
        r = _cli("tif_search.py", "--smoke", "--store", str(tmp_path / "t.sqlite"), *args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and r.stdout == "", (args, r.stderr)
    assert "max_accuracy_drop" in r.stderr
    spec = json.loads((REPO / "experiments" / "tif_search.json").read_text())
    spec["space"]["beta"] = [2.0, 1.0]
    spec["base_from"] = str(REPO / "experiments" / spec["base_from"])
    (tmp_path / "bad.json").write_text(json.dumps(spec))
    r = _cli("tif_search.py", "--smoke", "--config", str(tmp_path / "bad.json"), "--store", str(tmp_path / "t.sqlite"))
    assert r.returncode == 2 and r.stderr.strip().startswith("error: space.beta[1]"), r.stderr
    assert not (tmp_path / "t.sqlite").exists() or RunStore(tmp_path / "t.sqlite").list_runs() == []  # nothing ran


@pytest.mark.slow
def test_tif_search_smoke_keeps_the_best_trial_within_the_accuracy_bound(tmp_path, capsys, one_thread):
    """4 trials in one round of 4 (Optuna's random start). Checked against the store, not the script's own table:
    every trial is a finished INO-SGD run of the search's group with the proposed α, β, γ inside the space; its
    feasibility is its stored accuracy against IDP-SGD's minus the bound; the answer is the feasible trial with the
    highest AUC. Then a bound between the trials' accuracies: the same trials (seeded, and the random start does
    not see the bound), reused from the store, with some of them now beyond it."""
    store = tmp_path / "t.sqlite"
    argv = ["--smoke", "--json", "--no-figures", "--trials", "4", "--parallel", "4", "--store", str(store)]
    d = _main(tif_search, argv + ["--max-accuracy-drop", "100"], capsys)
    rows = {r["id"]: r for r in RunStore(store).list_runs(kind="train")}
    assert len(rows) == 5 and all(r["status"] == "finished" for r in rows.values())
    assert {r["group_id"] for r in rows.values()} == set(d["group_ids"]) and len(d["group_ids"]) == 1
    ref_acc = 100.0 * rows[d["run_ids"]["reference/0"]]["summary"]["accuracy"]
    assert d["accuracy_bound"] == pytest.approx(ref_acc - 100)
    assert [t["trial"] for t in d["trials"]] == [0, 1, 2, 3]
    for t in d["trials"]:
        run = rows[d["run_ids"][f"trial{t['trial']}/0"]]
        algo = run["config"]["algorithm"]
        assert algo["name"] == "ino" and algo["tif"] == "beta"
        for k in ("tail_fraction", "beta", "alpha"):
            lo, hi = d["space"][k]
            assert algo[k] == t[k] and lo <= algo[k] <= hi
        assert t["accuracy"] == pytest.approx(100.0 * run["summary"]["accuracy"]) and t["feasible"]
    assert len({(t["tail_fraction"], t["beta"], t["alpha"]) for t in d["trials"]}) == 4
    assert d["best"]["auc_private"] == max(t["auc_private"] for t in d["trials"])
    accs = sorted({t["accuracy"] for t in d["trials"]})
    assert len(accs) >= 2
    drop = ref_acc - (accs[0] + accs[1]) / 2  # the least accurate trial(s) below the bound (negative: beat IDP-SGD by)
    again = _main(tif_search, argv + ["--max-accuracy-drop", str(drop), "--reuse"], capsys)
    assert len(RunStore(store).list_runs(kind="train")) == 5  # nothing trained again
    assert [(t["tail_fraction"], t["beta"], t["alpha"]) for t in again["trials"]] == \
        [(t["tail_fraction"], t["beta"], t["alpha"]) for t in d["trials"]]
    assert [t["feasible"] for t in again["trials"]] == [t["accuracy"] >= ref_acc - drop for t in d["trials"]]
    assert 1 <= sum(t["feasible"] for t in again["trials"]) <= 3
    feasible = [t for t in again["trials"] if t["feasible"]]
    assert again["best"]["trial"] == max(feasible, key=lambda t: t["auc_private"])["trial"]


@pytest.mark.slow
def test_group_risk_smoke(tmp_path, capsys, one_thread):
    figures = tmp_path / "figures"
    d = _main(group_risk, ["--smoke", "--json", "--figures", str(figures), "--store", str(tmp_path / "g.sqlite")], capsys)
    # the figures come through the project's own builders and export (real PNGs, Kaleido + Chromium); the tiered
    # one is the talk figure of the tiered audit's report (GPR per tier vs its ε, and the ε lower bound)
    names = sorted(Path(p).name for p in d["figures"])
    assert names == sorted(["group_risk_smoke_fairness.png", "group_risk_smoke_tiered_gpr_vs_epsilon.png",
                            "group_risk_smoke_gpr_tiered.png"] + [f"group_risk_smoke_gpr_{ds}_eps{e}.png"
                                                                   for ds in ("adult", "mnist10k") for e in (1, 10)])
    assert all((figures / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)
    adult = d["audits"]["adult"]
    assert set(adult) == {"eps1", "eps10"}
    assert set(adult["eps10"]["algorithms"]) == {"nonprivate", "dpsgd", "dpsgd_s"}
    assert set(adult["eps1"]["algorithms"]) == {"dpsgd", "dpsgd_s"}  # the non-private reference is audited once
    row = adult["eps10"]["algorithms"]["dpsgd"]
    assert set(row["gpr"]) == set(adult["eps10"]["groups"]) and len(row["gpr"]) == 2
    assert {"value", "low", "high"} <= set(row["delta_pp"]) and row["null_floor"] is not None
    assert adult["eps10"]["n_models_per_algorithm"] == 4
    assert len(d["audits"]["mnist10k"]["eps1"]["groups"]) == 10
    tiers = d["tiered"]["algorithms"]["idp"]["gpr_by_tier"]
    assert [t["epsilon"] for t in tiers] == [1.0, 2.0, 3.0]
    fair = d["fairness"]["eps10"]["dpsgd"]
    assert fair["demographic_parity_difference"]["n"] == 1 and 0 <= fair["equalized_odds_difference"]["mean"] <= 1


@pytest.mark.slow
def test_collusion_smoke(tmp_path, capsys, one_thread):
    """The collusion test (issue 42): per setting of the other tiers' budgets, the fixed tier's one-run ε̂ by both
    bounds and its GPR, from a one-run audit and a PA-ALOOA audit stored as runs; the figure and the sentence."""
    d = _main(collusion, ["--smoke", "--json", "--no-figures", "--store", str(tmp_path / "c.sqlite")], capsys)
    rows = d["rows"]
    assert [r["others"] for r in rows] == ["1, 1", "2, 3", "3, 6", "4, 8"]
    for r in rows:
        assert r["tier"] == "ε=1" and r["epsilon"] == pytest.approx(1.0, rel=1e-5)  # the fixed tier keeps its claim
        assert 0 <= r["epsilon_hat"] <= r["epsilon"] and 0 <= r["epsilon_hat_fdp"] <= r["epsilon"]
        assert r["gpr_low"] <= r["gpr"] <= r["gpr_high"] and r["null_floor"] is not None
    # the planner pays for the others' larger rates with a smaller σ, and the fixed tier's rate falls to keep ε = 1
    sigmas, rates = [r["noise_multiplier"] for r in rows], [r["sample_rate"] for r in rows]
    assert sigmas == sorted(sigmas, reverse=True) and rates == sorted(rates, reverse=True)
    store = RunStore(tmp_path / "c.sqlite")
    kinds = sorted(store.get_run(r[key])["kind"] for r in rows for key in ("one_run_id", "audit_id"))
    assert kinds == ["audit"] * 4 + ["one_run"] * 4
    assert d["sentence"].startswith("As the other tiers' budgets go from (1, 1) to (4, 8), the ε=1 tier's GPR moves from")
    assert d["sentence"].endswith("its claimed ε = 1 holding in every setting.")
    frame = pd.DataFrame(rows, columns=COLLUSION_COLUMNS)
    assert collusion_sentence(frame) == d["sentence"]
    fig = fig_collusion(frame)
    by_name = {t.name: t for t in fig.data}
    assert list(by_name["ε̂ f-DP"].y) == [r["epsilon_hat_fdp"] for r in rows]
    assert list(by_name["GPR"].y) == [r["gpr"] for r in rows]
    assert fig.layout.title.subtitle.text.replace("<br>", " ") == d["sentence"]
