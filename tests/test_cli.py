"""The CLI as a user runs it: subprocesses, exit codes, one-line errors."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def cli(*args, store):
    return subprocess.run([sys.executable, "-m", "engine", "--store", str(store), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def store(tmp_path):
    return tmp_path / "runs.sqlite"


def test_run_json_show_list(tmp_path, store):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"model": {"name": "lr"}, "epochs": 3, "algorithm": {"name": "ino"}}))
    out = cli("run", str(cfg), "--json", store=store)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["run_id"] == 1 and summary["accuracy"] > 0.3
    assert [t["epsilon"] for t in summary["tiers"]] == [1.0, 2.0, 3.0]
    assert all(0 <= t["recall"] <= 1 for t in summary["tiers"])
    shown = cli("show", "1", store=store)
    assert "finished" in shown.stdout and "ε=1" in shown.stdout
    listed = json.loads(cli("list", "--json", store=store).stdout)
    assert listed[0]["status"] == "finished" and listed[0]["algorithm"] == "ino"


def test_run_prints_per_tier_recall(tmp_path, store):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"model": {"name": "lr"}, "epochs": 2, "algorithm": {"name": "idp_sample"}}))
    out = cli("run", str(cfg), store=store)
    assert out.returncode == 0, out.stderr
    assert "recall" in out.stdout and out.stdout.count("ε=") >= 3


@pytest.mark.parametrize("config,field", [({"delta": 2}, "delta"), ({"epochs": 0}, "epochs"),
                                          ({"algorithm": {"name": "nope"}}, "algorithm.name"),
                                          ({"batch_size": 999999}, "batch_size")])
def test_config_error_is_one_line_exit_2(tmp_path, store, config, field):
    cfg = tmp_path / "bad.json"
    cfg.write_text(json.dumps(config))
    out = cli("run", str(cfg), store=store)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:")
    assert "Traceback" not in out.stderr


def test_not_json_and_missing_file(tmp_path, store):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for path in (bad, tmp_path / "missing.json"):
        out = cli("run", str(path), store=store)
        assert out.returncode == 2 and "Traceback" not in out.stderr and out.stderr.startswith("error: config:")


def test_plan_flags(store):
    out = cli("plan", "--mode", "dpsgd", "--epsilons", "1", "2", "3", "--tier-sizes", "20000", "20000", "20000",
              "--batch-size", "600", "--steps", "3000", "--json", store=store)
    plan = json.loads(out.stdout)
    assert plan["noise_multiplier"] == pytest.approx(2.35909, rel=1e-3)
    table = cli("plan", "--mode", "scale", "--epsilons", "1", "3", "--tier-sizes", "1000", "3000",
                "--batch-size", "100", "--steps", "200", store=store)
    assert table.returncode == 0 and "tier 1" in table.stdout
    bad = cli("plan", "--mode", "sample", "--epsilons", "-1", "--tier-sizes", "10", "--batch-size", "5",
              "--steps", "10", store=store)
    assert bad.returncode == 2 and bad.stderr.startswith("error:")
