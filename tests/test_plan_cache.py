"""The persistent plan cache (engine.dp.plan_cache) behind ``accounting.plan``: a plan seen before comes back as
the very plan a fresh computation makes, in any process and fast; a changed input or a changed accounting code
misses; a corrupt file is rebuilt without an error; several processes write to it at once without harm."""
from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.dp import accounting, plan_cache

REPO = Path(__file__).resolve().parents[1]
DIGITS = dict(mode="sample", epsilons=(1.0, 2.0, 3.0), delta=1e-5, tier_sizes=(431, 428, 578), batch_size=128,
              clip_norm=1.0, steps=112)  # the digits default config's plan (`privacy-lab plan` of `{}`)
SMALL = dict(mode="sample", epsilons=(1.0, 3.0), delta=1e-5, tier_sizes=(3000, 3000), batch_size=60, clip_norm=1.0,
             steps=40)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "cache" / "plans.sqlite"
    monkeypatch.setenv(plan_cache.ENV_VAR, str(path))
    accounting.clear_caches()
    yield path
    accounting.clear_caches()


def _rows(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT COUNT(*) FROM plans").fetchone()[0]


def _fresh(monkeypatch, **kw) -> accounting.Plan:
    """The plan computed with no cache at all (and no in-process ε cached)."""
    monkeypatch.setenv(plan_cache.ENV_VAR, plan_cache.OFF)
    accounting.clear_caches()
    try:
        return accounting.plan(**kw)
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_a_cached_plan_is_the_plan_a_fresh_computation_makes(cache, monkeypatch, accountant):
    first = accounting.plan(**SMALL, accountant=accountant)
    assert _rows(cache) == 1
    accounting.clear_caches()  # this process forgets: the next answer is the file's
    again = accounting.plan(**SMALL, accountant=accountant)
    fresh = _fresh(monkeypatch, **SMALL, accountant=accountant)
    assert again.to_dict() == first.to_dict() == fresh.to_dict()
    assert again == fresh


def test_a_plan_seen_before_takes_under_a_second_in_a_fresh_process(cache):
    """The issue's goal for the plan preview: a PLD plan seen before, ≤ 1 s, in a process that has never planned
    (a fresh server, worker or CLI); it does not even import dp-accounting. Same numbers as the process that made it."""
    made = accounting.plan(**DIGITS, accountant="pld")
    code = f"""if True:
        import json, sys, time
        from engine.dp import accounting
        t0 = time.perf_counter()
        p = accounting.plan(**{DIGITS!r}, accountant="pld")
        print(json.dumps({{"s": time.perf_counter() - t0, "plan": p.to_dict(),
                           "dp_accounting": "dp_accounting" in sys.modules}}))
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                         env={**__import__("os").environ, plan_cache.ENV_VAR: str(cache)})
    got = json.loads(out.stdout)
    assert got["plan"] == json.loads(json.dumps(made.to_dict()))
    assert got["s"] < 1.0 and not got["dp_accounting"]


def test_a_changed_input_misses(cache):
    base = accounting.plan(**SMALL)
    changed = [dict(SMALL, steps=41), dict(SMALL, epsilons=(1.0, 3.5)), dict(SMALL, delta=1e-6),
               dict(SMALL, tier_sizes=(3000, 3001)), dict(SMALL, batch_size=61), dict(SMALL, clip_norm=2.0),
               dict(SMALL, mode="scale")]
    for k, kw in enumerate(changed):
        p = accounting.plan(**kw)
        assert p.to_dict() != base.to_dict()
        assert _rows(cache) == k + 2  # each a new entry, none served from another's
    accounting.plan(**SMALL, accountant="prv")
    assert _rows(cache) == len(changed) + 2
    # DP-SGD-S's one-off release: keyed by the plan it composes with and its noise multiplier
    d = accounting.plan(mode="dpsgd", epsilons=(1.0,), delta=1e-5, tier_sizes=(6000,), batch_size=60, clip_norm=1.0,
                        steps=40)
    one, other = accounting.plan_with_release(d, 30.0), accounting.plan_with_release(d, 40.0)
    assert one.release_noise_multipliers == (30.0,) and other.release_noise_multipliers == (40.0,)
    assert one.noise_multiplier > other.noise_multiplier > d.noise_multiplier
    accounting.clear_caches()
    assert accounting.plan_with_release(d, 30.0) == one


def test_a_changed_accounting_code_or_library_misses(cache, tmp_path, monkeypatch):
    """The key holds a hash of the accounting sources and the libraries' versions: one byte more in a source is
    another fingerprint, and a plan stored under the old one is not served."""
    here = Path(plan_cache.__file__).parent
    copy = tmp_path / "dp"
    copy.mkdir()
    for name in plan_cache.SOURCES:
        shutil.copy(here / name, copy / name)
    assert plan_cache.fingerprint_of(copy) == plan_cache.fingerprint()
    (copy / "accountants.py").write_text((copy / "accountants.py").read_text() + "\n")
    edited = plan_cache.fingerprint_of(copy)
    assert edited != plan_cache.fingerprint()
    stored = accounting.plan(**SMALL).to_dict()
    assert plan_cache.get("plan", _inputs(SMALL)) == json.loads(json.dumps(stored))  # the key the planner uses
    monkeypatch.setattr(plan_cache, "fingerprint", lambda: edited)
    plan_cache.clear_memory()
    assert plan_cache.get("plan", _inputs(SMALL)) is None
    accounting.plan(**SMALL)
    assert _rows(cache) == 2  # computed again, stored beside the old one
    monkeypatch.setattr(plan_cache.metadata, "version", lambda lib: "0.0-other")
    assert plan_cache.fingerprint_of(copy) != edited


def _inputs(kw: dict) -> dict:
    return dict(mode=kw["mode"], epsilons=[float(e) for e in kw["epsilons"]], delta=kw["delta"],
                tier_sizes=list(kw["tier_sizes"]), batch_size=float(kw["batch_size"]),
                clip_norm=float(kw["clip_norm"]), steps=kw["steps"], accountant="rdp")


@pytest.mark.parametrize("garbage", [b"not a database at all" * 100, b"SQLite format 3\x00" + b"\xff" * 5000, b""],
                         ids=["text", "a-broken-sqlite-header", "empty"])
def test_a_corrupt_cache_file_is_ignored_and_rebuilt(cache, monkeypatch, garbage):
    cache.parent.mkdir(parents=True)
    cache.write_bytes(garbage)
    p = accounting.plan(**SMALL)
    assert p == _fresh(monkeypatch, **SMALL)
    assert _rows(cache) == 1  # a cache again, with this plan in it
    accounting.clear_caches()
    assert accounting.plan(**SMALL) == p


def test_a_row_that_is_not_a_plan_is_not_served(cache, monkeypatch):
    """A value that is not JSON, or a plan that does not answer the request, is computed again and replaced."""
    good = accounting.plan(**SMALL)
    k = plan_cache.key("plan", _inputs(SMALL))
    for bad in ("{not json", json.dumps(dict(good.to_dict(), epsilons=[9.0, 9.0])),
                json.dumps(dict(good.to_dict(), steps=7))):
        with sqlite3.connect(cache) as db:
            db.execute("UPDATE plans SET value = ? WHERE key = ?", (bad, k))
        accounting.clear_caches()
        assert accounting.plan(**SMALL) == good


def test_the_cache_is_bounded(cache, monkeypatch):
    monkeypatch.setattr(plan_cache, "MAX_ENTRIES", 5)
    for k in range(8):
        plan_cache.put("test", {"k": k}, {"value": k})
    assert _rows(cache) == 5
    plan_cache.clear_memory()
    assert [plan_cache.get("test", {"k": k}) for k in range(8)] == [None] * 3 + [{"value": k} for k in range(3, 8)]


def test_two_processes_writing_at_once_do_not_corrupt_it(cache):
    """Two processes each write 60 entries into one new cache file at the same moment (and read them back): every
    entry is there afterwards, whole, and the file passes SQLite's integrity check."""
    code = """if True:
        import sys, time
        from engine.dp import plan_cache
        who, start = sys.argv[1], float(sys.argv[2])
        while time.time() < start:
            pass
        for k in range(60):
            plan_cache.put("test", {"who": who, "k": k}, {"who": who, "k": k, "pad": "x" * 500})
            assert plan_cache.get("test", {"who": who, "k": k})["k"] == k
    """
    start = time.time() + 0.5  # both started and imported by then: they write together
    procs = [subprocess.Popen([sys.executable, "-c", code, who, str(start)], cwd=REPO,
                              env={**__import__("os").environ, plan_cache.ENV_VAR: str(cache)},
                              stderr=subprocess.PIPE, text=True) for who in ("a", "b")]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read()
    assert _rows(cache) == 120
    with sqlite3.connect(cache) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    plan_cache.clear_memory()
    for who in ("a", "b"):
        for k in range(60):
            assert plan_cache.get("test", {"who": who, "k": k}) == {"who": who, "k": k, "pad": "x" * 500}


def test_the_cache_can_be_turned_off_and_an_unusable_folder_is_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv(plan_cache.ENV_VAR, plan_cache.OFF)
    accounting.clear_caches()
    p = accounting.plan(**SMALL)
    assert plan_cache.cache_path() is None and plan_cache.get("plan", _inputs(SMALL)) is None
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv(plan_cache.ENV_VAR, str(blocker / "plans.sqlite"))  # its folder cannot be made
    accounting.clear_caches()
    assert accounting.plan(**SMALL) == p
