"""Test-wide settings: the data directory is ../shared/data beside the repository (CI lays it
there); runs go to a throw-away store so nothing touches a user's ~/.privacy-imbalance-lab.

Markers (pytest.ini registers them; README's fast subset is ``-m "not browser and not slow"``):
``browser`` is every test of a ``tests/test_browser*.py`` module (given here, by file, so a new browser
test cannot be forgotten); ``slow`` is set on the test itself, for a test that trains, serves or starts processes for long (over ~1.5 s
on a quiet 2-core machine) and is not the only check of a privacy invariant: the fast subset keeps every test
of sensitivity, accounting, the planner, the audit estimator and the one-run bound (ResNet-18's gradient
equalities are slow: LR, MLP and CNN check the same identity fast)."""
import gc
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

if "PRIVACY_LAB_DATA_DIR" not in os.environ and SHARED_DATA.is_dir():
    os.environ["PRIVACY_LAB_DATA_DIR"] = str(SHARED_DATA)

# The plan cache (engine.dp.plan_cache) and the encoded-table cache (engine.data.user_table) write beside the user's
# files by default (~/.cache, the data folder): tests, and every server and worker they start (they inherit the
# environment), write them to a temporary folder of this process instead, removed when it ends.
_CACHES = tempfile.mkdtemp(prefix="lab-test-caches-")
os.environ["PRIVACY_LAB_PLAN_CACHE"] = os.path.join(_CACHES, "plans.sqlite")
os.environ["PRIVACY_LAB_TABLE_CACHE"] = os.path.join(_CACHES, "tables")


def pytest_unconfigure(config):
    shutil.rmtree(_CACHES, ignore_errors=True)


# Modules that start a Ray instance (test_ray.py checks Ray's worker processes on the whole machine).
RAY_MODULES = {"test_ray.py", "test_browser_ray.py"}
# The groups that start first under the README's ``--no-loadscope-reorder`` (the longest: the browser group is
# ~320 s alone, the Ray group ~110 s), each on its own worker from the start.
FIRST_GROUPS = ("browser", "ray")


def xdist_group(path: Path) -> str:
    """The pytest-xdist group of a test module, used by the README's full command (``-n 3 --dist loadgroup``; the
    fast subset runs ``-n 2`` without it): the tests of one group run on one worker, one after another, in file
    order. The Ray modules are one group (one Ray instance at a time on the machine); the other browser modules one
    (they share one Streamlit server and one Chromium, the ``lab`` and ``browser`` fixtures below, which a group
    on one worker makes once; and two browser groups at once made every page slower on 2 cores); any other
    module is its own group, so its module-scoped fixtures are made once, as when the module runs alone."""
    if path.name in RAY_MODULES:
        return "ray"
    if path.name.startswith("test_browser"):
        return "browser"
    return path.stem


def first_groups_first(items) -> None:
    """Put the tests of ``FIRST_GROUPS`` first, in that order, the others after them as collected (a stable sort:
    each module keeps its own order). pytest-xdist hands out groups in the order their first test comes (with
    ``--no-loadscope-reorder``; by default it would start the groups with the most tests first), so the longest
    groups start at once and the short ones fill the other workers around them."""
    rank = {group: i for i, group in enumerate(FIRST_GROUPS)}
    items.sort(key=lambda item: rank.get(xdist_group(item.path), len(rank)))


def invariant_tests() -> set[str]:
    """tests/invariants.txt: the privacy-invariant tests (``module::function``) the fast subset must keep."""
    lines = (REPO / "tests" / "invariants.txt").read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def invariant_problems(listed: set[str], collected: dict[str, bool], defined: set[str]) -> list[str]:
    """What keeps a listed invariant test out of the fast subset. ``collected``: ``module::function`` → whether
    that test is left out of the fast subset (marked slow or browser); ``defined``: every ``module::test_*``
    function of the collected modules (a run of one test by its node id collects that test alone). A listed test of
    a collected module that the module does not define was renamed, merged or deleted; one left out was moved out."""
    modules = {name.split("::")[0] for name in collected}
    gone = sorted(t for t in listed if t.split("::")[0] in modules and t not in defined)
    out = sorted(t for t in listed if collected.get(t))
    return (([f"gone: {', '.join(gone)}"] if gone else [])
            + ([f"marked slow or browser: {', '.join(out)}"] if out else []))


def defined_tests(module) -> set[str]:
    """``module::function`` of each test function a collected test module defines."""
    stem = Path(module.__file__).stem
    return {f"{stem}::{name}" for name, value in vars(module).items() if name.startswith("test") and callable(value)}


def can_select(markexpr: str, marks: set[str]) -> bool:
    """Whether a ``-m`` expression can select a test carrying ``marks``: true for some set of the markers it names
    that holds them all (each other name true or false)."""
    import itertools
    import re

    from _pytest.mark.expression import Expression

    if not markexpr.strip():
        return True
    try:
        expr = Expression.compile(markexpr)
    except Exception:  # pytest itself says what is wrong with the expression
        return True
    names = sorted(set(re.findall(r"[A-Za-z_][\w.:+-]*", markexpr)) - {"and", "or", "not", "True", "False", "None"}
                   - marks)
    for values in itertools.product((False, True), repeat=len(names)):
        held = marks | {n for n, v in zip(names, values) if v}
        if expr.evaluate(lambda name, /, **kwargs: name in held):
            return True
    return False


def module_marks(path: Path) -> set[str]:
    """The marks every test of a test module carries: ``browser`` by its name, ``slow`` by a module-wide
    ``pytestmark = pytest.mark.slow`` line."""
    marks = {"browser"} if path.name.startswith("test_browser") else set()
    if any(line.split("#")[0].strip() == "pytestmark = pytest.mark.slow"
           for line in path.read_text(encoding="utf-8").splitlines()):
        marks.add("slow")
    return marks


def pytest_ignore_collect(collection_path, config):
    """A test module none of whose tests the ``-m`` expression can select (the fast subset's ``"not browser and not
    slow"``: the browser modules and test_ray.py) is not imported: its tests would all be deselected, and importing
    them cost each worker ~3 s of collection."""
    if collection_path.name.startswith("test_") and collection_path.suffix == ".py":
        marks = module_marks(collection_path)
        if marks and not can_select(config.getoption("markexpr") or "", marks):
            return True
    return None


def _stop_as_on_ctrl_c(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    """A SIGTERM ends the run as Ctrl-C does: pytest then tears its fixtures down (the browser tests' Streamlit
    servers and the runs they launched, Ray instances, temporary folders). Without it a terminated pytest left
    every server a module had started running, with its standbys and its training runs.

    Under pytest-xdist each worker runs torch on one thread: two workers share the 2 cores, and torch's default
    of one thread per core makes its threads spin against the other worker's (a one-run audit test took 20 s
    beside two busy processes on 2 threads, 6 s on one)."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _stop_as_on_ctrl_c)
    if hasattr(config, "workerinput"):
        import torch

        torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    collected: dict[str, bool] = {}
    defined: set[str] = set()
    for module in {getattr(item, "module", None) for item in items} - {None}:
        defined |= defined_tests(module)
    for item in items:
        if item.path.name.startswith("test_browser"):
            item.add_marker(pytest.mark.browser)
        item.add_marker(pytest.mark.xdist_group(xdist_group(item.path)))
        name = f"{item.path.stem}::{getattr(item, 'originalname', item.name)}"
        left_out = bool(item.get_closest_marker("slow") or item.get_closest_marker("browser"))
        collected[name] = collected.get(name, False) or left_out
    first_groups_first(items)
    problems = invariant_problems(invariant_tests(), collected, defined)
    if problems:
        raise pytest.UsageError("privacy-invariant tests (tests/invariants.txt) must stay in the fast subset; "
                                + "; ".join(problems))


_FROZEN_AT: list = [None]


def pytest_runtest_setup(item):
    """At each module's first test (the first one right after collection), the objects alive then leave the
    garbage collector's care, its garbage collected first: every module the tests import (torch, numpy, pandas,
    Plotly, Streamlit, Opacus and the engine, over a million objects), then what each module imports lazily
    (dp-accounting, Opacus' PRV, Plotly's figure classes, Streamlit's test runner) and keeps alive. Each full
    collection walked them all again (~0.25 s each, 25-30 of them in a fast-subset worker, and five more when
    pytest ends). Frozen objects are still freed by reference counting; only a reference cycle among them
    outlives the run."""
    module = getattr(item, "module", None)
    if module is not _FROZEN_AT[0]:
        _FROZEN_AT[0] = module
        gc.collect()
        gc.freeze()


def _prctl():
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl


_PRCTL = _prctl()  # looked up here: between fork and exec the child only calls it (no import, no dlopen)
_SIGTERM = int(signal.SIGTERM)


def dies_with_this_process() -> None:
    """For ``subprocess.Popen(preexec_fn=...)``: the child gets SIGTERM when the process that started it ends,
    however it ends (also kill -9, where no teardown runs). Linux only (``prctl(PR_SET_PDEATHSIG)``); a no-op
    elsewhere. Popen from the main thread only: the signal follows the thread that forked."""
    if _PRCTL is not None:
        _PRCTL(1, _SIGTERM)  # PR_SET_PDEATHSIG


# What a timed-out wait adds to its message (e.g. the browser tests' server: the runs of its store and their states).
ON_TIMEOUT: list = []


def wait_until(pred, timeout: float = 90.0, what: str = "condition", interval: float = 0.2):
    """Poll ``pred`` every ``interval`` seconds until it is truthy (that value is returned) or ``timeout`` seconds
    pass (AssertionError naming ``what``, with what each ``ON_TIMEOUT`` reporter says). The one poll helper of the
    suite: tests wait for a state (the store, a process, a page), never for a fixed time."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            notes = "; ".join(filter(None, (report() for report in ON_TIMEOUT)))
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}" + (f"; {notes}" if notes else ""))
        time.sleep(interval)


@pytest.fixture(scope="session", autouse=True)
def _ray_temp_dir():
    """Ray's session folders (of every instance a test starts, in this process or a child) go to a temporary folder
    removed at the end, not to /tmp/ray. (Short: Ray's socket paths must stay under 107 characters.)"""
    folder = tempfile.mkdtemp(prefix="lab-ray-")
    old = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = folder
    yield
    if old is None:
        os.environ.pop("RAY_TMPDIR", None)
    else:
        os.environ["RAY_TMPDIR"] = old
    shutil.rmtree(folder, ignore_errors=True)


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


# --- the browser modules' (tests/test_browser*.py) shared app and Chromium. Here, not in test_browser.py: a
# session-scoped fixture that modules import is made once per importing module (pytest keeps one definition per
# module that names it), one in conftest.py once per run. ---

@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """The app the browser modules share (through ``test_browser.server``): one Streamlit server with its standby
    workers on one store for the run, not one per module (each start cost ~12 s of CPU: Streamlit's first script
    run and two standbys importing torch). A test that needs a fresh store uses ``test_browser.own_server``; tests
    that count runs count the ones they launched."""
    from test_browser import start_lab, stop_lab

    from engine.store.db import RunStore

    tmp = tmp_path_factory.mktemp("lab-browser")
    proc, url = start_lab(tmp)
    store = RunStore(tmp / "runs.sqlite")
    try:
        yield url, store, tmp
    finally:
        stop_lab(proc, store)


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for the run; each test opens its pages in fresh contexts (``new_page``,
    ``new_context``: no cookie or storage of another test's)."""
    from playwright.sync_api import sync_playwright
    from test_browser import ARGS, CHROMIUM

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()
