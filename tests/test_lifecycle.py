"""One registry of job kinds and one store lifecycle for every run: worker, CLI, job manager."""
from __future__ import annotations

import os
import signal

import pytest
from in_process import cli_here

from engine.config.run import RunConfig
from engine.config.schema import ConfigError
from engine.jobs.kinds import JOB_KINDS, execute, job_kind, run_queued
from engine.store.db import RunStore
from engine.jobs.runs import algorithm_label
from engine.store.lifecycle import Cancelled, store_lifecycle

TINY = RunConfig().replace(**{"data.max_train": 200, "epochs": 1.0, "batch_size": 32, "eval_every": 1})


@pytest.fixture()
def store(tmp_path):
    return RunStore(tmp_path / "runs.sqlite")


def test_registry_knows_train_audit_and_one_run_and_names_an_unknown_kind():
    assert set(JOB_KINDS) == {"train", "audit", "one_run"}
    assert job_kind("audit").name == "audit"
    for bad in ("nope", None, 3):
        with pytest.raises(ConfigError) as e:
            job_kind(bad)
        assert e.value.field == "kind" and "known: train, audit, one_run" in e.value.message
    assert job_kind("train").parse(TINY.to_dict()) == TINY
    with pytest.raises(ConfigError) as e:  # each kind parses (and validates) its own config shape
        job_kind("train").parse({"epochs": 0})
    assert e.value.field == "epochs"


def test_each_kind_is_watched_where_its_page_shows_it():
    """The Runs page's link to a re-run opens the page and section that show its kind (a one-run audit opened the
    PA-ALOOA section, which warned and showed another audit)."""
    assert JOB_KINDS["train"].watch(7, "cmp-a b") == ("Train", "train?group=cmp-a%20b")
    assert JOB_KINDS["audit"].watch(7, "audit-x") == ("Audit", "audit?audit=7")
    assert JOB_KINDS["one_run"].watch(7, "onerun-x") == ("Audit", "audit?one_run=7")
    from app_pages._one_run import PARAM

    assert PARAM == "one_run"  # the query parameter the one-run section opens a run from


def test_success_finishes(store):
    rid = store.create_run(TINY, status="queued")
    with store_lifecycle(store, rid, sigterm=False) as life:
        life.start(total_steps=3, plan={"p": 1})
        assert store.get_run(rid)["status"] == "running" and store.get_run(rid)["pid"] == os.getpid()
        life.finish({"accuracy": 0.5})
    run = store.get_run(rid)
    assert run["status"] == "finished" and run["summary"] == {"accuracy": 0.5} and run["error"] is None


@pytest.mark.parametrize("exc, error", [
    (RuntimeError("boom"), "RuntimeError: boom"),
    (ConfigError("run.data.name", "unknown value 'x'"), "run.data.name: unknown value 'x'"),
])
def test_an_exception_marks_failed_with_its_message(store, exc, error):
    rid = store.create_run(TINY, status="queued")
    with pytest.raises(type(exc)):
        with store_lifecycle(store, rid, sigterm=False) as life:
            life.start(total_steps=3)
            raise exc
    run = store.get_run(rid)
    assert run["status"] == "failed" and run["error"] == error


def test_cancelled_marks_cancelled_and_sigterm_cancels(store):
    rid = store.create_run(TINY, status="queued")
    with pytest.raises(Cancelled):
        with store_lifecycle(store, rid, sigterm=False):
            raise Cancelled("stopped at step 4")
    assert store.get_run(rid)["status"] == "cancelled" and store.get_run(rid)["error"] == "stopped at step 4"
    rid = store.create_run(TINY, status="queued")
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Cancelled):
        with store_lifecycle(store, rid) as life:
            life.start(total_steps=1)
            os.kill(os.getpid(), signal.SIGTERM)  # what the job manager's Cancel sends
            for _ in range(1000):  # the handler runs between bytecodes
                pass
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is put back
    assert store.get_run(rid)["status"] == "cancelled" and "signal" in store.get_run(rid)["error"]


def test_ctrl_c_marks_cancelled_not_failed(store):
    rid = store.create_run(TINY, status="queued")
    with pytest.raises(KeyboardInterrupt):
        with store_lifecycle(store, rid) as life:
            life.start(total_steps=1)
            raise KeyboardInterrupt
    assert (store.get_run(rid)["status"], store.get_run(rid)["error"]) == ("cancelled", "interrupted (Ctrl-C)")


def test_an_ended_run_is_not_overwritten_and_no_store_is_a_no_op(store):
    rid = store.create_run(TINY, status="queued")
    with pytest.raises(ValueError):
        with store_lifecycle(store, rid, sigterm=False) as life:
            life.finish({"done": True})
            raise ValueError("after the finish (e.g. printing the summary)")
    assert store.get_run(rid)["status"] == "finished"
    with pytest.raises(ValueError):
        with store_lifecycle(None, None, sigterm=False) as life:
            assert not life.active
            life.start(total_steps=1)
            life.finish({})
            raise ValueError("no store: nothing to record")


def test_execute_and_run_queued_train_through_the_lifecycle(store):
    rid = store.create_run(TINY, status="queued")
    result = execute(store, rid, TINY, kind="train")
    assert store.get_run(rid)["status"] == "finished" and result.summary == store.get_run(rid)["summary"]
    # the worker entry: kind and config from the store; a prepared run is used when offered
    from engine.train.loop import prepare

    ready = prepare(TINY)
    asked = []

    def prepared(config):
        asked.append(config)
        return ready

    rid2 = store.create_run(TINY, status="queued", group_id="g")
    out = run_queued(store, rid2, prepared=prepared)
    assert asked == [TINY] and store.get_run(rid2)["status"] == "finished"
    assert out.summary["accuracy"] == result.summary["accuracy"]  # prepare is deterministic: same run
    bad = store.create_run(TINY.replace(batch_size=5000), status="queued", group_id="g")
    with pytest.raises(ConfigError):
        run_queued(store, bad)
    assert store.get_run(bad)["status"] == "failed" and store.get_run(bad)["error"].startswith("batch_size:")
    with pytest.raises(ConfigError) as e:
        run_queued(store, 9999)
    assert e.value.field == "run_id"


def test_run_queued_of_a_replica_row_runs_its_whole_job(store):
    job = TINY.replace(seeds=2, seed=3)
    ids = store.create_job(job.seed_configs(), status="queued", group_id="g")
    out = run_queued(store, ids[1])  # a worker given a replica row trains the job from its leader
    runs = [store.get_run(i) for i in ids]
    assert [r["status"] for r in runs] == ["finished", "finished"]
    assert [r["summary"]["seed"] for r in runs] == [3, 4] and out.config.seed == 3
    # a failure ends every row of the job with the one-line message
    bad = store.create_job(job.replace(batch_size=5000).seed_configs(), status="queued", group_id="g")
    with pytest.raises(ConfigError):
        run_queued(store, bad[0])
    assert all(store.get_run(i)["status"] == "failed" and store.get_run(i)["error"].startswith("batch_size:")
               for i in bad)


def test_worker_with_an_unknown_kind_fails_the_run_with_one_line(store):
    rid = store.create_run({"x": 1}, kind="nope", group_id="g")
    out = cli_here("worker", rid, store=store.path)  # what `python -m engine worker` runs (tests/in_process.py)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: kind: unknown job kind 'nope'; known: train, audit, one_run"]
    run = store.get_run(rid)
    assert run["status"] == "failed" and run["error"] == "kind: unknown job kind 'nope'; known: train, audit, one_run"
    shown = cli_here("show", rid, store=store.path)
    assert shown.returncode == 0 and "kind=nope" in shown.stdout and "failed" in shown.stdout


def test_a_runs_algorithms_in_words_for_each_kind(store):
    """The Runs page's algorithm column: a training run's algorithm, an audit's and a one-run audit's each (an
    audit row read "run")."""
    from engine.audit.pa_alooa.config import DEFAULT_RUN, AuditConfig
    from engine.audit.one_run.config import OneRunConfig
    from engine.config.run import AlgorithmConfig
    from engine.jobs.runs import algorithms_label

    train = store.get_run(store.create_run(TINY.replace(**{"algorithm.name": "ino"})))
    audit = AuditConfig(run=DEFAULT_RUN, algorithms=(AlgorithmConfig(name="dpsgd"),
                                                     AlgorithmConfig(name="dpsgd_s", group_by="attribute")))
    audit = store.get_run(store.create_run(audit.to_dict(), kind="audit"))
    one_run = store.get_run(store.create_run(OneRunConfig().to_dict(), kind="one_run"))
    assert algorithms_label(train) == "INO-SGD"
    assert algorithms_label(audit) == "DP-SGD, DP-SGD-S"
    assert algorithms_label(one_run) == ", ".join(
        algorithm_label(a.name) for a in OneRunConfig().algorithms) and algorithms_label(one_run) != "run"
    assert algorithms_label({"kind": "audit", "algorithm": None, "config": {"R": "x"}}) == "run"  # unreadable
