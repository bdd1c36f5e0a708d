"""The collusion study's spec (experiments/collusion.json) is checked whole before anything trains: every hostile
spec ends the script with one line on stderr naming the field, and exit status 2 (issue 58, point 1)."""
import copy
import json
from pathlib import Path

import pytest
from in_process import main_here

from experiments import collusion

REPO = Path(__file__).resolve().parents[1]
SPEC = json.loads((REPO / "experiments" / "collusion.json").read_text())


def _with(change):
    spec = copy.deepcopy(SPEC)
    change(spec)
    return spec


def _set(path: str, value):
    """A change setting ``spec[path]`` (dotted keys, [k] indices)."""
    def change(spec):
        node, parts = spec, path.replace("[", ".").replace("]", "").split(".")
        for p in parts[:-1]:
            node = node[int(p)] if isinstance(node, list) else node[p]
        last = parts[-1]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return change


def _drop(path: str, key: str):
    def change(spec):
        node = spec
        for p in path.replace("[", ".").replace("]", "").split("."):
            node = node[int(p)] if isinstance(node, list) else node[p]
        del node[key]
    return change


HOSTILE = [  # (change, the field the one line names)
    (_set("settings[2]", "looser"), "settings[2]"),
    (_set("settings[1].epsilons[0]", "2"), "settings[1].epsilons[0]"),
    (_set("settings[1].epsilons[1]", -3.0), "settings[1].epsilons[1]"),
    (_set("settings[1].epsilons[1]", 0), "settings[1].epsilons[1]"),
    (_set("settings[0].epsilons", [1.0]), "settings[0].epsilons"),
    (_set("settings[0].epsilons", 1.0), "settings[0].epsilons"),
    (_drop("settings[3]", "name"), "settings[3].name"),
    (_set("settings[3].name", 7), "settings[3].name"),
    (_set("settings[0].extra", 1), "settings[0].extra"),
    (_set("settings", {"equal": [1, 1]}), "settings"),
    (_set("settings", []), "settings"),
    (_drop("other_tiers[0]", "classes"), "other_tiers[0].classes"),
    (_drop("other_tiers[1]", "name"), "other_tiers[1].name"),
    (_set("other_tiers[1].classes", ["0", 1]), "other_tiers[1].classes[0]"),
    (_set("other_tiers[0]", [3, 7, 8]), "other_tiers[0]"),
    (_set("other_tiers", "3,7,8"), "other_tiers"),
    (_set("fixed_tier", [2, 5, 9]), "fixed_tier"),
    (_set("fixed_tier.epsilon", "1"), "fixed_tier.epsilon"),
    (_set("fixed_tier.epsilon", -1.0), "fixed_tier.epsilon"),
    (_drop("fixed_tier", "name"), "fixed_tier.name"),
    (_set("fixed_tier.classes", []), "fixed_tier.classes"),
    (_set("fixed_tier.colour", "red"), "fixed_tier.colour"),
    (_set("modes.smoke", [1, 2]), "modes.smoke"),
    (_set("modes.smoke.audit", "R=2"), "modes.smoke.audit"),
    (_set("modes.smoke.one_run.canaries", -5), "one_run.canaries"),
    (_set("modes.smoke.audit.R", 0), "audit.R"),
    (_set("modes.smoke.bogus", {}), "modes.smoke.bogus"),
    (_set("audit.run.delta", "small"), "audit.run.delta"),
    (_set("one_run.run.optimizer", {"name": "rmsprop"}), "one_run.run.optimizer.name"),
]


@pytest.mark.parametrize("change, field", HOSTILE, ids=[f for _, f in HOSTILE])
def test_a_hostile_collusion_spec_is_one_line_naming_its_field_and_exit_2(tmp_path, change, field):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(_with(change)))
    store = tmp_path / "s.sqlite"
    r = main_here(collusion.main, ["--smoke", "--no-figures", "--config", str(path), "--store", str(store)])
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and r.stdout == "", r.stderr
    assert lines[0].startswith(f"error: {field}:"), lines[0]


def test_a_bad_spec_is_refused_before_anything_trains(tmp_path):
    """The last setting is the bad one: nothing is stored for the good settings before it."""
    from engine.store.db import RunStore

    path = tmp_path / "spec.json"
    path.write_text(json.dumps(_with(_set("settings[3].epsilons[1]", float("inf")))).replace("Infinity", "1e999"))
    store = tmp_path / "s.sqlite"
    r = main_here(collusion.main, ["--smoke", "--no-figures", "--config", str(path), "--store", str(store)])
    assert r.returncode == 2 and r.stderr.startswith("error: settings[3].epsilons[1]:"), r.stderr
    assert not store.exists() or RunStore(store, readonly=True).list_runs() == []


def test_the_shipped_spec_passes_the_check():
    spec = collusion.check_spec(copy.deepcopy(SPEC))
    for mode in ("quick", "full", "smoke"):
        planned = collusion.planned_configs(spec, mode)
        assert [label for label, _, _ in planned] == [s["name"] for s in SPEC["settings"]]


def test_experiment_configs_refuse_and_warn_as_the_cli_does(capsys):
    """An experiment's run configs go through the run config's validation (a value no algorithm accepts is refused)
    and its advisories (a valid value the algorithm ignores is one warning line, once however many runs share it)."""
    from experiments import common
    from engine.config.schema import ConfigError

    common._WARNED.clear()
    base = {"data": {"name": "digits"}, "algorithm": {"name": "idp_sample", "quantile": 0.9}}
    for seed in (0, 1):
        common.run_config(base, {}, seed=seed)
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("warning: algorithm.quantile: 0.9 is ignored by IDP-SGD")
    with pytest.raises(ConfigError) as e:
        common.run_config(base, {"algorithm.quantile": 1.5})
    assert e.value.field == "algorithm.quantile"
    spec = _with(_set("audit.algorithms", [{"name": "idp_sample", "group_by": "class"}]))
    collusion.planned_configs(collusion.check_spec(spec), "smoke")
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["warning: audit.algorithms[0].group_by: 'class' is ignored by IDP-SGD (SAMPLE): only DP-SGD-S "
                   "and DPSGD-F use it (the run trains as if it were unset)"], err
