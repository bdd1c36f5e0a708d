"""The execution backend's choice (engine.config.backend): what each value means, and one clear error for a bad
one wherever it is given (CLI flag, environment, the dashboard's sidebar, a worker's run). No Ray starts here
(tests/test_ray.py runs on Ray)."""
from __future__ import annotations

import json

import pytest

from engine.config.backend import BACKEND_ENV, BackendConfig, backend_from_env
from engine.config.schema import ConfigError
from engine.jobs.kinds import execute
from engine.store.db import RunStore
from in_process import cli_here


@pytest.mark.parametrize("text, kind, address", [
    ("local", "local", None), ("", "local", None), ("  local ", "local", None),
    ("ray", "ray", None), ("ray:local", "ray", None),
    ("ray:auto", "ray", "auto"),
    ("ray://head.example:10001", "ray", "ray://head.example:10001"),
    ("ray:ray://10.0.0.5:10001", "ray", "ray://10.0.0.5:10001"),
    ("ray:10.0.0.5:6379", "ray", "10.0.0.5:6379"),
])
def test_each_backend_value_means_one_thing_and_reads_back(text, kind, address):
    b = BackendConfig.parse(text)
    assert (b.kind, b.address) == (kind, address)
    assert BackendConfig.parse(b.spec()) == b  # what a worker's environment gets reads back the same
    assert b.local_instance == (kind == "ray" and address is None)
    assert ("127.0.0.1" in b.describe()) == b.local_instance


@pytest.mark.parametrize("bad", ["Ray", "spark", "ray:", "ray:nohost", "ray://", "ray://host", "ray:host:port",
                                 "local ray", "ray:auto; rm -rf /", 3])
def test_a_bad_backend_value_is_one_error_naming_where_it_came_from(bad):
    with pytest.raises(ConfigError) as e:
        BackendConfig.parse(bad, field="--backend")
    assert e.value.field == "--backend" and "ray://HOST:PORT" in e.value.message
    with pytest.raises(ConfigError) as e:
        backend_from_env({BACKEND_ENV: str(bad)})
    assert e.value.field == BACKEND_ENV


def test_unset_environment_is_local():
    assert backend_from_env({}) == BackendConfig()


def test_the_cli_refuses_a_bad_backend_in_one_line_and_keeps_the_store(tmp_path):
    store = tmp_path / "runs.sqlite"
    RunStore(store).create_run({"note": "kept"}, kind="train")
    out = cli_here("--backend", "spark", "list", "--json", store=store)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and "--backend" in out.stderr and "Traceback" not in out.stderr
    assert len(RunStore(store).list_runs()) == 1
    ok = cli_here("--backend", "local", "list", "--json", store=store)
    assert ok.returncode == 0 and len(json.loads(ok.stdout)) == 1


def test_a_run_under_a_bad_backend_fails_with_the_reason_in_its_row(tmp_path, monkeypatch):
    from engine.audit.pa_alooa.presets import preset

    store = RunStore(tmp_path / "runs.sqlite")
    config = preset("quick")
    run_id = store.create_run(config.to_dict(), kind="audit")
    monkeypatch.setenv(BACKEND_ENV, "sparks")
    with pytest.raises(ConfigError):
        execute(store, run_id, config, kind="audit")
    row = store.get_run(run_id)
    assert row["status"] == "failed" and BACKEND_ENV in row["error"] and "sparks" in row["error"]


@pytest.mark.slow
def test_the_sidebar_names_the_backend_and_a_bad_value_is_an_error_not_a_traceback(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from test_forms import APP, texts

    monkeypatch.setenv("PRIVACY_LAB_STORE", str(tmp_path / "runs.sqlite"))
    monkeypatch.setenv("PRIVACY_LAB_PREWARM", "0")
    from app_pages import _handles

    try:
        monkeypatch.setenv(BACKEND_ENV, "ray")
        at = AppTest.from_file(APP, default_timeout=120).run()
        assert not at.exception
        assert "Backend: Ray (an instance on this machine, 127.0.0.1)" in texts(at.sidebar.caption)
        monkeypatch.setenv(BACKEND_ENV, "spark")
        at = AppTest.from_file(APP, default_timeout=120).run()
        assert not at.exception
        errors = [e.value for e in at.sidebar.error]
        assert len(errors) == 1 and "spark" in errors[0] and BACKEND_ENV in errors[0]
    finally:
        _handles._manager.clear()
