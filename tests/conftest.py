"""Test-wide settings: the data directory is ../shared/data beside the repository (CI lays it
there); runs go to a throw-away store so nothing touches a user's ~/.privacy-imbalance-lab.

Markers (pytest.ini registers them; README's fast subset is ``-m "not browser and not slow"``):
``browser`` is every test of a ``tests/test_browser*.py`` module (given here, by file, so a new browser
test cannot be forgotten); ``slow`` is set on the test itself, for a test that trains, serves or starts processes for long (over ~1.5 s
on a quiet 2-core machine) and is not the only check of a privacy invariant: the fast subset keeps every test
of sensitivity, accounting, the planner, the audit estimator and the one-run bound (ResNet-18's gradient
equalities are slow: LR, MLP and CNN check the same identity fast)."""
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

if "PRIVACY_LAB_DATA_DIR" not in os.environ and SHARED_DATA.is_dir():
    os.environ["PRIVACY_LAB_DATA_DIR"] = str(SHARED_DATA)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name.startswith("test_browser"):
            item.add_marker(pytest.mark.browser)


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIVACY_LAB_STORE", str(tmp_path / "runs.sqlite"))


@pytest.fixture
def shared_data() -> Path:
    path = Path(os.environ.get("PRIVACY_LAB_DATA_DIR", SHARED_DATA))
    if not (path / "mnist").is_dir():
        pytest.skip(f"shared data not found at {path}")
    return path


@pytest.fixture
def one_thread():
    """torch on one thread for the test (tests share a loaded 2-core machine)."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def no_network(monkeypatch):
    """No test may reach the network: every download attempt fails (and is recorded)."""
    from engine.data import files

    calls = []

    def refuse(url, dest, sha256, timeout=10.0):
        calls.append(url)
        raise OSError("network disabled in tests")

    monkeypatch.setattr(files, "download_file", refuse)
    return calls
