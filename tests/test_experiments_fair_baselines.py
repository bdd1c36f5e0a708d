"""experiments/fair_baselines.py: one tiny audit (--quick, Adult, one ε, DP-SGD and DP-SGD-S) into tmp_path; its rows,
the paired difference against DP-SGD (checked against the audit's own DP-SGD-S − DP-SGD comparison) and the table."""
import json
from pathlib import Path

import pytest
from in_process import main_here

from engine.audit.pa_alooa.report import AuditReport
from engine.dp.algorithms import algorithm
from engine.store.db import RunStore
from experiments import fair_baselines

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quick_adult_audit_rows_paired_differences_and_table(tmp_path):
    out, store = tmp_path / "rows.json", tmp_path / "runs.sqlite"
    argv = ["--quick", "--datasets", "adult", "--epsilons", "10", "--algorithms", "dpsgd,dpsgd_s",
            "--out", out, "--store", store]
    r = main_here(fair_baselines.main, argv, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [x["algorithm"] for x in rows] == ["dpsgd", "dpsgd_s"]
    assert {x["label"] for x in rows} == {algorithm("dpsgd").label, algorithm("dpsgd_s").label}
    for x in rows:
        assert (x["dataset"], x["epsilon"], x["n_models"], x["clip_norm"]) == ("adult", 10.0, fair_baselines.QUICK_MODELS,
                                                                               5.0)
        acc = x["accuracy_pct"]
        assert 0 < acc["value"] <= 100 and acc["low"] <= acc["value"] <= acc["high"]
        groups = x["group_accuracy_pct"]
        assert sorted(groups) == ["Female", "Male"] and all(0 < v <= 100 for v in groups.values())
        assert x["group_accuracy_gap_pp"] == pytest.approx(max(groups.values()) - min(groups.values()))
        d, nd = x["delta_pp"], x["null_delta_pp"]  # (a max − min's percentile CI need not hold its point)
        assert d["value"] >= 0 and d["low"] <= d["high"] and nd["low"] <= nd["high"]
        assert isinstance(x["resolved"], bool)
    dpsgd, s = rows
    assert dpsgd["vs"] == {}  # DP-SGD is the first partner: compared with none
    assert list(s["vs"]) == ["dpsgd"]  # DP-SGD-S with DP-SGD only
    diff = s["vs"]["dpsgd"]
    for key in ("delta_pp", "accuracy_pp"):
        e = diff[key]
        assert e["low"] <= e["value"] <= e["high"]
    # the pair's Δ difference is the two rows' Δs apart, and what the audit itself compares (its per-sample
    # advantages in float64, ours the store's float32: the same point values, the same paired accuracy interval)
    assert diff["delta_pp"]["value"] == pytest.approx(s["delta_pp"]["value"] - dpsgd["delta_pp"]["value"], abs=1e-4)
    report = AuditReport.from_dict(RunStore(store).get_run(s["run_id"])["summary"])
    own = report.comparison("dpsgd_s", "dpsgd")
    assert diff["delta_pp"]["value"] == pytest.approx(own.delta.value, abs=1e-4)
    assert diff["accuracy_pp"]["value"] == pytest.approx(own.accuracy.value, abs=1e-9)
    assert diff["accuracy_pp"]["low"] == pytest.approx(own.accuracy.low, abs=1e-9)
    # the table: printed after the run and by --table from the file, one line per row
    table = fair_baselines.markdown(rows)
    assert r.stdout == table
    lines = table.splitlines()
    assert len(lines) == 2 + len(rows)
    assert "Δ − Δ_DP-SGD [paired CI]" in lines[0] and "Δ − Δ_DP-SGD-S [paired CI]" in lines[0]
    assert lines[2].startswith("| Adult (sex) | 5 | 10 | DP-SGD |") and lines[3].startswith("| Adult (sex) | 5 | 10 | DP-SGD-S |")
    assert lines[3].split(" | ")[-2].startswith(f"{diff['delta_pp']['value']:+.2f} [")
    t = main_here(fair_baselines.main, ["--table", "--out", out], cwd=tmp_path)
    assert t.returncode == 0 and t.stdout == table
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("runs.sqlite")) == ["rows.json"]


def test_bad_arguments_end_in_one_line_before_any_audit(tmp_path):
    out = tmp_path / "rows.json"
    for argv in (["--algorithms", "dpsgd,no_such"], ["--datasets", "cifar"], ["--epsilons", "0"], ["--clip", "-1"],
                 ["--models", "7", "--datasets", "adult", "--algorithms", "dpsgd"]):
        r = main_here(fair_baselines.main, [*argv, "--out", out, "--store", tmp_path / "s.sqlite"], cwd=tmp_path)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (argv, r.stderr)
    assert list(tmp_path.iterdir()) == []


def test_partners_and_default_algorithms():
    assert fair_baselines.DEFAULT_ALGORITHMS == ("dpsgd", "dpsgd_s", "dpsgd_f", "dpsgd_global_adapt")
    names = fair_baselines.DEFAULT_ALGORITHMS
    assert [fair_baselines.partners_of(n, names) for n in names] == [(), ("dpsgd",), ("dpsgd", "dpsgd_s"),
                                                                     ("dpsgd", "dpsgd_s")]
    assert fair_baselines.partners_of("dpsgd_f", ("dpsgd_f", "dpsgd")) == ("dpsgd",)
