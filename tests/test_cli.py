"""The CLI as a user runs it: exit codes, one-line errors. ``cli`` runs ``python -m engine`` as a subprocess,
as a user does (a run's JSON, a config error, the app server, cancelling a running run); ``cli_here`` runs the
same ``main`` in this process (tests/in_process.py), for tests of what the commands say rather than of the
process, without the ~6 s import each subprocess pays."""
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from in_process import cli_here

from conftest import wait_until
from engine.config.run import RunConfig
from engine.store.db import RunStore

REPO = Path(__file__).resolve().parents[1]


def cli(*args, store):
    return subprocess.run([sys.executable, "-m", "engine", "--store", str(store), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def store(tmp_path):
    return tmp_path / "runs.sqlite"


@pytest.mark.slow
def test_run_json_show_list(tmp_path, store):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"model": {"name": "lr"}, "epochs": 3, "algorithm": {"name": "ino"}}))
    out = cli("run", str(cfg), "--json", store=store)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["run_id"] == 1 and summary["accuracy"] > 0.3
    assert [t["epsilon"] for t in summary["tiers"]] == [1.0, 2.0, 3.0]
    assert all(0 <= t["recall"] <= 1 for t in summary["tiers"])
    shown = cli_here("show", "1", store=store)
    assert "finished" in shown.stdout and "ε=1" in shown.stdout
    listed = json.loads(cli_here("list", "--json", store=store).stdout)
    assert listed[0]["status"] == "finished" and listed[0]["algorithm"] == "ino"


def test_run_prints_per_tier_recall(tmp_path, store):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"model": {"name": "lr"}, "epochs": 2, "algorithm": {"name": "idp_sample"}}))
    out = cli_here("run", str(cfg), store=store)
    assert out.returncode == 0, out.stderr
    assert "recall" in out.stdout and out.stdout.count("ε=") >= 3


@pytest.mark.parametrize("config,field", [({"delta": 2}, "delta"), ({"epochs": 0}, "epochs"),
                                          ({"algorithm": {"name": "nope"}}, "algorithm.name"),
                                          ({"batch_size": 999999}, "batch_size")])
def test_config_error_is_one_line_exit_2(tmp_path, store, config, field):
    cfg = tmp_path / "bad.json"
    cfg.write_text(json.dumps(config))
    out = cli_here("run", str(cfg), store=store)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:")
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_not_json_and_missing_file(tmp_path, store):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    # the process as a user starts it once (nothing else on its stderr: no warning, no traceback), then the
    # missing file through the same main in this process
    for out in (cli("run", str(bad), store=store), cli_here("run", str(tmp_path / "missing.json"), store=store)):
        assert out.returncode == 2 and "Traceback" not in out.stderr and out.stderr.startswith("error: config:")


def test_plan_flags(store):
    out = cli_here("plan", "--mode", "dpsgd", "--epsilons", "1", "2", "3", "--tier-sizes", "20000", "20000", "20000",
              "--batch-size", "600", "--steps", "3000", "--json", store=store)
    plan = json.loads(out.stdout)
    assert plan["noise_multiplier"] == pytest.approx(2.35909, rel=1e-3)
    table = cli_here("plan", "--mode", "scale", "--epsilons", "1", "3", "--tier-sizes", "1000", "3000",
                "--batch-size", "100", "--steps", "200", store=store)
    assert table.returncode == 0 and "tier 1" in table.stdout
    bad = cli_here("plan", "--mode", "sample", "--epsilons", "-1", "--tier-sizes", "10", "--batch-size", "5",
              "--steps", "10", store=store)
    assert bad.returncode == 2 and bad.stderr.startswith("error:")


@pytest.mark.slow
def test_plan_under_a_tighter_accountant_shows_rdps_beside_it(tmp_path, store):
    """The issue's MNIST tiers (SAMPLE, batch 512, 12 epochs): under PLD the ε = 1 tier's rate rises above RDP's
    at the same batch, and the noise saved is said once; a config plans under the accountant it names, and an
    unknown one is refused in one line."""
    flags = ("plan", "--epsilons", "1", "2", "3", "--tier-sizes", "20000", "20000", "20000", "--batch-size", "512",
             "--steps", "1406")
    rdp = json.loads(cli_here(*flags, "--json", store=store).stdout)
    pld = json.loads(cli_here(*flags, "--accountant", "pld", "--json", store=store).stdout)
    assert (rdp["accountant"], pld["accountant"]) == ("rdp", "pld")
    assert pld["noise_multiplier"] < 0.95 * rdp["noise_multiplier"]
    assert pld["sample_rates"][0] > 1.15 * rdp["sample_rates"][0] and max(pld["epsilons"]) <= 3.0
    table = cli_here(*flags, "--accountant", "pld", store=store).stdout
    assert re.search(r"under pld against [\d.]+ under rdp: [\d.]+ % less noise", table) and "q (rdp)" in table
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"model": {"name": "lr"}, "epochs": 1, "accountant": "prv",
                               "algorithm": {"name": "idp_sample"}}))
    assert "under prv" in cli_here("plan", str(cfg), store=store).stdout
    cfg.write_text(json.dumps({"model": {"name": "lr"}, "epochs": 1, "accountant": "moments"}))
    bad = cli_here("plan", str(cfg), store=store)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "allowed: rdp, prv, pld" in bad.stderr


@pytest.mark.slow
def test_rerun_overrides_and_bad_values(tmp_path, store):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"model": {"name": "lr"}, "epochs": 1, "data": {"max_train": 200},
                               "algorithm": {"name": "idp_sample"}}))
    assert cli_here("run", str(cfg), "--json", store=store).returncode == 0
    out = cli_here("rerun", "1", "--set", "seed=7", "--set", "optimizer.lr=0.2", "--set", "accountant=pld", "--json",
                   store=store)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["run_id"] == 2 and summary["rerun_of"] == 1
    shown = json.loads(cli_here("show", "2", "--json", store=store).stdout)
    assert shown["status"] == "finished" and shown["config"]["seed"] == 7
    assert shown["config"]["accountant"] == "pld" and shown["plan"]["accountant"] == "pld"
    assert shown["config"]["optimizer"]["lr"] == 0.2 and shown["config"]["data"]["max_train"] == 200
    for bad, field in (("seed=-1", "seed"), ("seed=1.5", "seed"), ("data.nope=1", "data.nope"),
                       ("=3", "--set"), ("tiers=[]", "tiers"), ("accountant=moments", "accountant")):
        out = cli_here("rerun", "1", "--set", bad, store=store)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {field}"), (bad, out.stderr)
    missing = cli_here("rerun", "99", store=store)
    assert missing.returncode == 2 and "no run 99" in missing.stderr
    assert len(json.loads(cli_here("list", "--json", store=store).stdout)) == 2  # no bad override started a run
    # a re-run is a new comparison of its own (it must not change the old one's figures), unless --join
    joined = json.loads(cli_here("rerun", "2", "--join", "--json", store=store).stdout.strip().splitlines()[-1])
    again = json.loads(cli_here("rerun", "2", "--json", store=store).stdout.strip().splitlines()[-1])
    groups = {r["id"]: r["group_id"] for r in json.loads(cli_here("list", "--json", store=store).stdout)}
    assert summary["group_id"] == groups[2] and groups[2] and groups[2] != groups[1]
    assert joined["group_id"] == groups[3] == groups[2] and again["group_id"] == groups[4] != groups[2]


@pytest.mark.parametrize("override,field", [("epochs=abc", "epochs"), ("nope=1", "nope"),
                                            ("algorithm.name=\"banana\"", "algorithm.name"),
                                            ("epochs", "--set"), ("delta=5", "delta"),
                                            ("epochs.x=1", "epochs.x")])
def test_bad_override_is_one_line_exit_2_and_starts_nothing(store, override, field):
    RunStore(store).create_run(RunConfig().validate(), status="finished")
    out = cli_here("rerun", "1", "--set", override, store=store)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:"), out.stderr
    assert len(RunStore(store, readonly=True).list_runs()) == 1  # nothing was started


@pytest.mark.slow
def test_run_with_seeds_lists_shows_and_reruns_the_job(tmp_path, store):
    """``run --set seeds=3`` trains one job of three rows; ``rerun`` of a replica row re-runs the whole job;
    ``--set seeds=1 --set seed=S`` re-runs one seed alone."""
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"model": {"name": "lr"}, "epochs": 1, "data": {"max_train": 200}, "seed": 3,
                               "algorithm": {"name": "ino"}}))
    out = cli_here("run", str(cfg), "--set", "seeds=3", "--json", store=store)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["run_ids"] == [1, 2, 3] and result["run_id"] == 1
    assert [s["seed"] for s in result["per_seed"]] == [3, 4, 5] and [s["run_id"] for s in result["per_seed"]] == [1, 2, 3]
    listed = json.loads(cli_here("list", "--json", store=store).stdout)
    assert [(r["id"], r["seed"], r["seed_index"], r["seeds"], r["job_id"], r["status"]) for r in listed] == \
        [(3, 5, 2, 3, 1, "finished"), (2, 4, 1, 3, 1, "finished"), (1, 3, 0, 3, 1, "finished")]
    table = cli_here("list", store=store).stdout
    assert "3/3 #1" in table and "1/3 #1" in table
    shown = cli_here("show", "2", store=store).stdout
    assert "seed 4, 2 of 3 in job #1" in shown and "job rows: 1, 2, 3" in shown and "ε=1" in shown
    again = cli_here("rerun", "2", "--json", store=store)  # a replica row: the whole job again
    assert again.returncode == 0, again.stderr
    rerun = json.loads(again.stdout.strip().splitlines()[-1])
    assert rerun["run_ids"] == [4, 5, 6] and rerun["rerun_of"] == 2
    assert [s["seed"] for s in rerun["per_seed"]] == [3, 4, 5]
    assert [s["accuracy"] for s in rerun["per_seed"]] == [s["accuracy"] for s in result["per_seed"]]  # reproducible
    one = cli_here("rerun", "2", "--set", "seeds=1", "--set", "seed=4", "--json", store=store)
    assert one.returncode == 0, one.stderr
    single = json.loads(one.stdout.strip().splitlines()[-1])
    assert single["run_id"] == 7 and "run_ids" not in single and single["seed"] == 4
    row = json.loads(cli_here("show", "7", "--json", store=store).stdout)
    assert row["seeds"] == 1 and row["job_id"] is None and "seeds" not in row["config"]
    bad = cli_here("run", str(cfg), "--set", "seeds=17", store=store)
    assert bad.returncode == 2 and bad.stderr.startswith("error: seeds:") and len(bad.stderr.strip().splitlines()) == 1


def test_data_dir_flag_is_used(tmp_path, store):
    """``--data-dir`` names the data folder: adult from an empty folder falls back to the shipped copy,
    and the run's data report does not mention the caller's $PRIVACY_LAB_DATA_DIR."""
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"model": {"name": "lr"}, "epochs": 1, "data": {"name": "nope-set"}}))
    empty = tmp_path / "data"
    empty.mkdir()  # an empty folder (a missing one is warned about: tests/test_cli_light.py)
    out = cli_here("--data-dir", str(empty), "run", str(cfg), store=store)
    assert out.returncode == 2 and out.stderr.startswith("error: data.name")


@pytest.mark.slow
def test_app_serves_on_localhost_and_ends_with_its_parent(tmp_path, store):
    import signal
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "engine", "--store", str(store), "app", "--port", str(port)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        body = b""
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).read()
                break
            except OSError:
                time.sleep(0.3)
        assert body == b"ok", "the dashboard did not answer"
        children = _descendants(proc.pid)
        assert children
        assert _listening(port) == {"0100007F"}  # 127.0.0.1 only
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) is not None
        wait_until(lambda: not [c for c in children if Path(f"/proc/{c}").exists()], 30, "the app's children to end")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            kids = [int(k) for k in (task / "children").read_text().split()]
            out += kids
            todo += kids
    return out


def _listening(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp writes them) listening on ``port``."""
    addrs = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            addr, hexport = fields[1].split(":")
            if fields[3] == "0A" and int(hexport, 16) == port:
                addrs.add(addr)
    return addrs


def shown(stderr: str) -> list[str]:
    """A command's stderr but its progress bar (tqdm's ``label:  12%|██  | 35/4491 [...]`` updates, each ended by a
    carriage return or a newline), blank lines left out. A message written onto a bar's line is kept with it, and
    fails a test that expects the message alone."""
    segments = stderr.replace("\r", "\n").split("\n")
    return [s for s in segments if s.strip() and not re.fullmatch(r"[^|]*\d+%\|[^|]*\|[^|]*\]", s.strip())]


@pytest.mark.slow
def test_list_active_and_cancel_a_running_run(tmp_path, store):

    cfg = tmp_path / "long.json"
    cfg.write_text(json.dumps({"model": {"name": "cnn"}, "epochs": 500, "eval_every": 20,
                               "algorithm": {"name": "dpsgd"}, "threads": 1}))
    proc = subprocess.Popen([sys.executable, "-m", "engine", "--store", str(store), "run", str(cfg)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def training():  # what `list --active` says once the run trains
            out = cli_here("list", "--active", "--json", store=store)
            active = json.loads(out.stdout) if out.returncode == 0 and out.stdout.strip() else []
            return active if active and active[0]["status"] == "running" and (active[0]["step"] or 0) > 0 else None

        active = wait_until(training, 120, "the run to train (list --active)")
        assert active and active[0]["id"] == 1 and active[0]["status"] == "running", active
        out = cli_here("cancel", "1", store=store)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "run 1: cancelled"
        # the foreground command ends with one line and 128 + SIGTERM, no traceback
        assert proc.wait(timeout=30) == 143
        stderr = shown(proc.stderr.read())
        assert len(stderr) == 1 and re.fullmatch(r"stopped: terminated by signal( at step \d+)?; run 1 is recorded as "
                                                 r"cancelled, with what it logged so far", stderr[0]), stderr
        listed = json.loads(cli_here("list", "--json", store=store).stdout)
        assert listed[0]["status"] == "cancelled" and listed[0]["step"] > 0  # what it logged is kept
        assert json.loads(cli_here("list", "--active", "--json", store=store).stdout) == []
        again = cli_here("cancel", "1", store=store)
        assert again.returncode == 0 and "not active (cancelled)" in again.stdout
    finally:
        if proc.poll() is None:
            proc.kill()
    missing = cli_here("cancel", "99", store=store)
    assert missing.returncode == 2 and missing.stderr.strip().startswith("error: run_id: no run 99")
    assert len(missing.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_ctrl_c_of_a_foreground_run_ends_it_cancelled_with_one_line_and_exit_130(tmp_path):
    """Ctrl-C (SIGINT) of ``privacy-lab run``: the run is cancelled (not failed), keeps its metrics so far, and the
    command prints one line and exits 130 (no KeyboardInterrupt traceback)."""
    path = tmp_path / "runs.sqlite"
    store = RunStore(path)
    cfg = tmp_path / "long.json"
    cfg.write_text(json.dumps({"model": {"name": "lr"}, "epochs": 400, "eval_every": 5, "threads": 1}))
    # SIGINT as a terminal gives it (a shell's background job starts its children with SIGINT ignored)
    proc = subprocess.Popen([sys.executable, "-m", "engine", "--store", str(path), "run", str(cfg)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_until(lambda: store.list_runs() and len(store.eval_metrics(1)) >= 2, 120, "two evaluations of the run")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
        assert shown(proc.stderr.read()) == ["stopped: interrupted (Ctrl-C); run 1 is recorded as cancelled, with "
                                             "what it logged so far"]
        run = store.get_run(1)
        assert run["status"] == "cancelled" and run["error"] == "interrupted (Ctrl-C)", (run["status"], run["error"])
        assert len(store.eval_metrics(1)) >= 2 and run["step"] > 0
    finally:
        if proc.poll() is None:
            proc.kill()
