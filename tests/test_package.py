"""The installable package: ``pip install`` of the repository into a fresh virtual environment gives
the ``privacy-lab`` console command, which works from any directory (store and data folder passed as
paths), re-runs a stored run with overrides, and refuses a bad override in one line (exit 2)."""
from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SUBCOMMANDS = ("run", "rerun", "plan", "show", "list", "export", "audit", "worker", "app")


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A virtual environment over this interpreter's packages with the repository installed (not
    editable: the command must not depend on the checkout being the working directory)."""
    root = tmp_path_factory.mktemp("venv")
    # --without-pip: the venv's own old setuptools would shadow this environment's; pip, setuptools and the
    # dependencies come from the environment running the tests, put on the new venv's path by a .pth file.
    # (--system-site-packages would give the *base* interpreter's packages: inside a fresh `python3 -m venv`,
    # as the README tells a newcomer, those are not the ones requirements.txt installed.)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "env")], check=True, timeout=120)
    py = root / "env" / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    # plain folder lines: their own .pth files (this checkout's editable install among them) are not read, so
    # the venv cannot import the checkout instead of the package installed below
    outer = [p for p in dict.fromkeys(site.getsitepackages()) if os.path.isdir(p)]
    Path(purelib, "_outer_environment.pth").write_text("\n".join(outer) + "\n")
    build = root / "src"  # a copy: building in the checkout would leave build/ and *.egg-info there
    _copy_tree(REPO, build)
    proc = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--no-index", str(build)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root / "env" / "bin"


def _copy_tree(src: Path, dst: Path) -> None:
    import shutil

    files = subprocess.run(["git", "-C", str(src), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           check=True, capture_output=True, timeout=60).stdout.decode().split("\0")
    for rel in filter(None, files):
        p = src / rel
        if p.is_file() and not rel.startswith(("tests/", "docs/", "bench/")):
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, dst / rel)


def lab(venv: Path, *args, cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PRIVACY_LAB_STORE")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([str(venv / "privacy-lab"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_console_command_lists_its_subcommands(venv, tmp_path):
    out = lab(venv, "--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: privacy-lab")
    for sub in SUBCOMMANDS:
        assert sub in out.stdout
    # the installed code is the package's, not the checkout's: app.py with its app_pages/ (never a pages/
    # folder, which would put Streamlit in its legacy multipage mode)
    where = subprocess.run([str(venv / "python"), "-c", "import engine, json, os, privacy_lab_app;"
                            "app = privacy_lab_app.__path__[0];"
                            "print(json.dumps([engine.__file__, os.path.isfile(os.path.join(app, 'app.py')),"
                            "os.listdir(os.path.join(app, 'app_pages')), os.path.exists(os.path.join(app, 'pages'))]))"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    engine_file, has_app, app_pages, has_pages = json.loads(where.stdout)
    assert not Path(engine_file).is_relative_to(REPO) and has_app, where.stderr
    pages = {p.name for p in (REPO / "app_pages").glob("*.py")}
    assert "train_view.py" in pages and pages <= set(app_pages) and not has_pages, where.stdout


@pytest.mark.slow
def test_rerun_with_an_override_from_another_directory(venv, tmp_path):
    data = os.environ.get("PRIVACY_LAB_DATA_DIR") or str(tmp_path / "no-data")
    store = tmp_path / "store" / "runs.sqlite"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps({"model": {"name": "lr"}, "epochs": 1, "data": {"name": "digits", "max_train": 200},
                               "algorithm": {"name": "idp_sample"}, "batch_size": 50}))
    first = lab(venv, "--store", str(store), "--data-dir", data, "run", str(cfg), "--json", cwd=elsewhere)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout.strip().splitlines()[-1])["run_id"] == 1

    listed = lab(venv, "--store", str(store), "list", cwd=tmp_path)
    assert listed.returncode == 0 and "finished" in listed.stdout and "idp_sample" in listed.stdout

    # the Runs page's "copy as CLI" line, plus overrides, from yet another directory
    again = lab(venv, "--store", str(store), "--data-dir", data, "rerun", "1", "--set", "epochs=2",
                "--set", 'algorithm.name="ino"', "--json", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout.strip().splitlines()[-1])
    assert summary["run_id"] == 2 and summary["rerun_of"] == 1 and summary["algorithm"] == "ino"
    runs = json.loads(lab(venv, "--store", str(store), "list", "--json", cwd=elsewhere).stdout)
    by_id = {r["id"]: r for r in runs}
    assert by_id[2]["status"] == "finished" and by_id[2]["algorithm"] == "ino"
    assert by_id[2]["total_steps"] == 2 * by_id[1]["total_steps"]  # epochs 1 → 2
    shown = json.loads(lab(venv, "--store", str(store), "show", "2", "--json", cwd=elsewhere).stdout)
    assert shown["config"]["epochs"] == 2 and shown["config"]["data"]["max_train"] == 200  # the rest is kept


# the installed command's one line for a bad value and a bad --set (every kind of bad override: tests/test_cli.py)
@pytest.mark.slow
@pytest.mark.parametrize("override,field", [("epochs=abc", "epochs"), ("epochs", "--set")])
def test_bad_override_is_one_line_exit_2(venv, tmp_path, override, field):
    store = tmp_path / "runs.sqlite"
    from engine.config.run import RunConfig
    from engine.store.db import RunStore

    RunStore(store).create_run(RunConfig().validate(), status="finished")
    out = lab(venv, "--store", str(store), "rerun", "1", "--set", override, cwd=tmp_path, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:"), out.stderr
    assert len(RunStore(store, readonly=True).list_runs()) == 1  # nothing was started


@pytest.mark.slow
def test_the_installed_package_carries_the_demo_offline(venv, tmp_path):
    """The wheel holds the shipped MNIST (checksum-verified on load) and the example runs, so the default
    demo and the first Results view work from any directory on a machine without a data folder."""
    empty = tmp_path / "no-data"
    empty.mkdir()
    code = ("import json; from engine.data import load_dataset; from engine.data.files import ASSETS_DIR;"
            "from engine.tools.demo import DEFAULT_TRAIN, example_runs;"
            "ds = load_dataset(DEFAULT_TRAIN.dataset);"
            "print(json.dumps([str(ASSETS_DIR), len(ds.y_train), len(example_runs())]))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PRIVACY_LAB_DATA_DIR=str(empty), PRIVACY_LAB_OFFLINE="1", OMP_NUM_THREADS="1")
    out = subprocess.run([str(venv / "python"), "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr
    assets, n_train, n_examples = json.loads(out.stdout.strip().splitlines()[-1])
    assert not Path(assets).is_relative_to(REPO) and Path(assets).name == "assets"
    assert n_train == 60000 and n_examples >= 2 and list(empty.iterdir()) == []
