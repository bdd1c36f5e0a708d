"""A field set for an algorithm that does not read it (issue 58, point 3): a value no algorithm accepts is refused
whatever the algorithm (the same ConfigError from a run config, an audit's and a one-run audit's algorithms, and
the CLI's run, rerun, audit and one-run-audit), and a valid value the algorithm ignores is one ``warning:`` line
(``advisories``). Which algorithm reads which field is its registry entry's ``fields``."""
import dataclasses
import json
from pathlib import Path

import pytest
from in_process import cli_here

from engine.audit.one_run.config import ONE_RUN_ALGORITHMS, OneRunConfig
from engine.audit.pa_alooa.config import AuditConfig
from engine.audit.pa_alooa.presets import PRESETS
from engine.config.algorithms import FIELD_CHECKS
from engine.config.run import AlgorithmConfig, RunConfig, comparison_advisories
from engine.config.schema import ConfigError
from engine.dp.algorithms import ALGORITHM_REGISTRY

REPO = Path(__file__).resolve().parents[1]
NAMES = tuple(ALGORITHM_REGISTRY)

# values no algorithm accepts, one per field that has a range (field → value)
INVALID_FOR_ALL = {
    "idp_mode": "both", "tif": "spline", "alpha": 0.0, "beta": -1.0, "power": -2.0, "step_cut": 1.5,
    "knots": ((0.0, 0.8), (1.0, 0.2)), "tail_length": 0.0, "tail_fraction": -0.5, "clip_rule": "magic", "tau": 0.0,
    "quantile": 1.5, "ema": 1.0, "c_min": -0.5, "c_max": 0.0, "initial_clip": -1.0, "group_by": "nope",
    "group_sizes": (0, 5), "group_size_noise_std": 0.0, "quantile_lr": -0.2, "count_noise_std": -1.0,
}
# valid values away from the default, one per field
VALID_NON_DEFAULT = {
    "idp_mode": "scale", "tif": "power", "alpha": 2.0, "beta": 3.0, "power": 3.0, "step_cut": 0.3,
    "knots": ((0.0, 0.0), (1.0, 1.0)), "tail_length": 2.0, "tail_fraction": 0.25, "clip_rule": "reference",
    "tau": 1.5, "quantile": 0.9, "ema": 0.5, "c_min": 0.25, "c_max": 2.0, "initial_clip": 0.5, "group_by": "class",
    "group_sizes": (10, 20, 30), "group_size_noise_std": 3.0, "private_quantile": False, "quantile_lr": 0.1,
    "count_noise_std": 2.0,
}


def test_every_field_has_its_values_checked_and_is_read_by_some_algorithm():
    fields = [f.name for f in dataclasses.fields(AlgorithmConfig) if f.name != "name"]
    assert sorted(FIELD_CHECKS) == sorted(fields)
    assert sorted(VALID_NON_DEFAULT) == sorted(fields)
    assert set(INVALID_FOR_ALL) == set(fields) - {"private_quantile"}  # a boolean: its type is its whole range
    read = {f for a in ALGORITHM_REGISTRY.values() for f in a.fields}
    assert read == set(fields)  # no field nobody reads, no spec naming a field that does not exist


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("field", sorted(INVALID_FOR_ALL))
def test_a_value_no_algorithm_accepts_is_refused_whatever_the_algorithm(name, field):
    with pytest.raises(ConfigError) as e:
        RunConfig(algorithm=AlgorithmConfig(name=name, **{field: INVALID_FOR_ALL[field]})).validate()
    assert e.value.field.split("[")[0] == f"algorithm.{field}", str(e.value)  # (group_sizes[0])


def test_c_min_above_c_max_is_refused_for_every_algorithm():
    for name in NAMES:
        with pytest.raises(ConfigError) as e:
            AlgorithmConfig(name=name, c_min=3.0, c_max=2.0).validate()
        assert e.value.field == "algorithm.c_min"


@pytest.mark.parametrize("field, value", [("quantile", 1.5), ("count_noise_std", -1.0), ("group_by", "nope")])
def test_audits_refuse_the_same_values_naming_their_algorithm(field, value):
    algo = {"name": "idp_sample", field: value}
    with pytest.raises(ConfigError) as e:
        AuditConfig.from_dict({"algorithms": ["dpsgd", algo]}).validate()
    assert e.value.field == f"algorithms[1].{field}"
    with pytest.raises(ConfigError) as e:
        OneRunConfig.from_dict({"algorithms": [algo]}).validate()
    assert e.value.field == f"algorithms[0].{field}"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("field", sorted(VALID_NON_DEFAULT))
def test_a_valid_value_is_an_advisory_exactly_where_the_algorithm_ignores_it(name, field):
    config = AlgorithmConfig(name=name, **{field: VALID_NON_DEFAULT[field]})
    RunConfig(algorithm=config).validate()  # valid for every algorithm: never refused
    advisories = config.advisories()
    if field in ALGORITHM_REGISTRY[name].fields:
        assert advisories == []
    else:
        assert [a.field for a in advisories] == [f"algorithm.{field}"]
        users = [a.label for a in ALGORITHM_REGISTRY.values() if field in a.fields]
        assert ALGORITHM_REGISTRY[name].label in advisories[0].message
        assert all(u in advisories[0].message for u in users) and "ignored" in advisories[0].message


def test_defaults_and_shipped_configs_carry_no_ignored_field():
    """Nothing the lab ships sets a field its algorithm ignores: the defaults, the audit presets, the one-run
    audit's algorithms and every experiment spec's algorithms."""
    assert all(AlgorithmConfig(name=n).advisories() == [] for n in NAMES)
    algos = [a for p in PRESETS.values() for a in p.algorithms] + list(ONE_RUN_ALGORITHMS)
    for spec_path in sorted((REPO / "experiments").glob("*.json")):
        algos += [AlgorithmConfig(**d) for d in _algorithm_objects(json.loads(spec_path.read_text()))]
    assert len(algos) > 5
    assert [(a.name, a.advisories()) for a in algos if a.advisories()] == []


def _algorithm_objects(node):
    """Every JSON object of a spec that is an algorithm's (a known ``name`` and only AlgorithmConfig fields)."""
    fields = {f.name for f in dataclasses.fields(AlgorithmConfig)}
    if isinstance(node, dict):
        if node.get("name") in ALGORITHM_REGISTRY and set(node) <= fields and len(node) > 1:
            yield {k: tuple(map(tuple, v)) if k == "knots" else tuple(v) if isinstance(v, list) else v
                   for k, v in node.items()}
        for value in node.values():
            yield from _algorithm_objects(value)
    elif isinstance(node, list):
        for value in node:
            yield from _algorithm_objects(value)


def test_a_comparison_is_told_of_a_value_every_algorithm_of_it_ignores():
    base = RunConfig(algorithm=AlgorithmConfig(quantile=0.9, group_by="class")).validate()
    configs = [base.replace(**{"algorithm.name": n}) for n in ("idp_sample", "ino")]
    [quantile, group_by] = comparison_advisories(configs)
    assert (quantile.field, group_by.field) == ("algorithm.quantile", "algorithm.group_by")
    assert "IDP-SGD (SAMPLE) and INO-SGD" in quantile.message and "DP-SGD-S" in quantile.message
    with_user = configs + [base.replace(**{"algorithm.name": "dpsgd_global_adapt"})]
    assert [a.field for a in comparison_advisories(with_user)] == ["algorithm.group_by"]  # Global-Adapt reads q


# --- the command line ---------------------------------------------------------------------------------------------

TINY_RUN = {"data": {"name": "digits", "max_train": 300}, "model": {"name": "lr"}, "epochs": 1, "batch_size": 64,
            "device": "cpu"}


def _one_error(out, field):
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {field}:"), out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("field, value", [("quantile", 1.5), ("count_noise_std", -1.0), ("group_by", "nope")])
def test_run_audit_and_one_run_audit_refuse_a_value_no_algorithm_accepts(tmp_path, field, value):
    store = tmp_path / "runs.sqlite"
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({**TINY_RUN, "algorithm": {"name": "idp_sample", field: value}}))
    _one_error(cli_here("run", str(cfg), store=store), f"algorithm.{field}")
    audit = tmp_path / "audit.json"
    audit.write_text(json.dumps({"run": TINY_RUN, "R": 2, "algorithms": [{"name": "idp_sample", field: value}]}))
    _one_error(cli_here("audit", str(audit), store=store), f"algorithms[0].{field}")
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"run": TINY_RUN, "algorithms": [{"name": "idp_sample", field: value}]}))
    _one_error(cli_here("one-run-audit", str(one), store=store), f"algorithms[0].{field}")
    _one_error(cli_here("one-run-audit", "--set", f"algorithms=[{json.dumps({'name': 'dpsgd', field: value})}]",
                        store=store), f"algorithms[0].{field}")
    assert not store.exists()  # nothing was started


def test_run_warns_of_a_value_its_algorithm_ignores_in_one_line_and_trains(tmp_path, one_thread):
    store = tmp_path / "runs.sqlite"
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({**TINY_RUN, "algorithm": {"name": "idp_sample", "quantile": 0.9}}))
    out = cli_here("run", str(cfg), "--json", store=store)
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: algorithm.quantile: 0.9 is ignored by IDP-SGD")
    planned = cli_here("plan", str(cfg), store=store)
    assert planned.returncode == 0 and "warning: algorithm.quantile:" in planned.stderr


def test_rerun_set_warns_of_a_value_the_algorithm_ignores(tmp_path, one_thread):
    from engine.store.db import RunStore

    store = tmp_path / "runs.sqlite"
    RunStore(store).create_run(RunConfig.from_dict({**TINY_RUN, "algorithm": {"name": "dpsgd"}}).validate(),
                               status="finished")
    out = cli_here("rerun", "1", "--set", "algorithm.tau=2", store=store)
    assert out.returncode == 0, out.stderr
    assert [line for line in out.stderr.splitlines() if line.startswith("warning:")] == [
        "warning: algorithm.tau: 2 is ignored by DP-SGD: only DP-SGD-S uses it (the run trains as if it were unset)"]


def test_audit_warns_of_a_value_one_of_its_algorithms_ignores(tmp_path, one_thread):
    store = tmp_path / "runs.sqlite"
    audit = tmp_path / "audit.json"
    audit.write_text(json.dumps({"run": TINY_RUN, "R": 2, "n_boot": 20, "looa_k": 0, "group_by": "tier",
                                 "algorithms": [{"name": "dpsgd", "group_by": "class"}]}))
    out = cli_here("audit", str(audit), "--json", store=store)
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: algorithms[0].group_by: 'class' is ignored by "
                                                         "DP-SGD"), out.stderr
