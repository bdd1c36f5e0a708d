"""Hostile run and audit configs: each gives one ConfigError naming the exact dotted field.

Every case below once gave a traceback, was accepted silently, or planned unbounded work (issue 9).
The run cases go through ``RunConfig.from_dict(d).validate()`` (the JSON path of the CLI, the worker
and the dashboard); the text cases through the file reader; the URL cases through
``parse_tiers_param``; a handful through ``python -m engine run`` as a user types it (exit 2, one
line on stderr naming the field, the store untouched, earlier finished runs intact).
"""
import json
import os

import pytest
from in_process import cli_here

from engine.config.run import RunConfig
from engine.config.schema import ConfigError



def tiers(*members, assign="class", key="classes"):
    """A tiers section with one tier per member list (ε = 1, 2, ...)."""
    return {"tiers": {"assign": assign, "tiers": [{"epsilon": k + 1, key: m} for k, m in enumerate(members)]}}


DIGITS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
PIECEWISE = {"name": "ino", "tif": "piecewise"}

# (case id, run-config JSON object, the dotted field the ConfigError must name)
RUN_CASES = [
    # --- classes: ints only, duplicates on the id training uses ---------------------------------------
    ("class-3.7", tiers([0, 1, 2, 3.7, 4], [3, 5, 6, 7, 8, 9]), "tiers.tiers[0].classes[3]"),
    ("class-str-3-beside-3", tiers([0, 1, 2, "3", 4], [3, 5, 6, 7, 8, 9]), "tiers.tiers[0].classes[3]"),
    ("class-true", tiers([True, 0, 2, 3, 4], [5, 6, 7, 8, 9]), "tiers.tiers[0].classes[0]"),
    ("class-arabic-digit", tiers(["٣", 0, 1, 2, 4], [5, 6, 7, 8, 9]), "tiers.tiers[0].classes[0]"),
    ("classes-string", tiers("0123456789"), "tiers.tiers[0].classes"),
    ("classes-int", tiers(5), "tiers.tiers[0].classes"),
    ("classes-object-item", tiers([{}]), "tiers.tiers[0].classes[0]"),
    ("classes-null-item", tiers([None, 1]), "tiers.tiers[0].classes[0]"),
    ("classes-nested-list", tiers([[0, 1], 2]), "tiers.tiers[0].classes[0]"),
    ("class-negative", tiers([-1, 0, 1]), "tiers.tiers[0].classes[0]"),
    ("class-huge", tiers([10**30]), "tiers.tiers[0].classes[0]"),
    ("class-duplicate-same-tier", tiers([0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]), "tiers.tiers[0].classes"),
    ("class-duplicate-across", tiers([0, 1, 2, 3], [3, 4, 5, 6, 7, 8, 9]), "tiers.tiers[1].classes"),
    # --- the other tier fields --------------------------------------------------------------------------
    ("epsilon-string", {"tiers": {"tiers": [{"epsilon": "1", "classes": DIGITS}]}}, "tiers.tiers[0].epsilon"),
    ("epsilon-bool", {"tiers": {"tiers": [{"epsilon": True, "classes": DIGITS}]}}, "tiers.tiers[0].epsilon"),
    ("epsilon-missing", {"tiers": {"tiers": [{"classes": DIGITS}]}}, "tiers.tiers[0].epsilon"),
    ("epsilon-10e400-int", {"tiers": {"tiers": [{"epsilon": 10**400, "classes": DIGITS}]}}, "tiers.tiers[0].epsilon"),
    ("epsilon-nan", {"tiers": {"tiers": [{"epsilon": float("nan"), "classes": DIGITS}]}}, "tiers.tiers[0].epsilon"),
    ("tier-name-object", {"tiers": {"tiers": [{"epsilon": 1, "classes": DIGITS, "name": {}}]}}, "tiers.tiers[0].name"),
    ("tier-not-object", {"tiers": {"tiers": [5]}}, "tiers.tiers[0]"),
    ("tiers-not-list", {"tiers": {"tiers": {"epsilon": 1}}}, "tiers.tiers"),
    ("tiers-empty", {"tiers": {"tiers": []}}, "tiers.tiers"),
    ("tiers-section-string", {"tiers": "paper"}, "tiers"),
    ("assign-int", {"tiers": {"assign": 5}}, "tiers.assign"),
    ("values-int", tiers([1], assign="attribute", key="values"), "tiers.tiers[0].values[0]"),
    ("values-duplicate", tiers(["a"], ["a"], assign="attribute", key="values"), "tiers.tiers[1].values"),
    ("attribute-int", {"tiers": {"assign": "attribute", "attribute": 7,
                                 "tiers": [{"epsilon": 1, "values": ["a"]}]}}, "tiers.attribute"),
    ("ratio-string", {"tiers": {"assign": "random", "tiers": [{"epsilon": 1, "ratio": "1"}]}}, "tiers.tiers[0].ratio"),
    ("ratio-over-1", {"tiers": {"assign": "random", "tiers": [{"epsilon": 1, "ratio": 1.5}]}}, "tiers.tiers[0].ratio"),
    ("assignment-strings", {"tiers": {"assign": "explicit", "tiers": [{"epsilon": 1}], "assignment": ["0", "0"]}},
     "tiers.assignment[0]"),
    ("assignment-floats", {"tiers": {"assign": "explicit", "tiers": [{"epsilon": 1}], "assignment": [0, 0.5]}},
     "tiers.assignment[1]"),
    ("assignment-bools", {"tiers": {"assign": "explicit", "tiers": [{"epsilon": 1}], "assignment": [False]}},
     "tiers.assignment[0]"),
    ("assignment-out-of-range", {"tiers": {"assign": "explicit", "tiers": [{"epsilon": 1}], "assignment": [0, 1]}},
     "tiers.assignment[1]"),
    ("assignment-string", {"tiers": {"assign": "explicit", "tiers": [{"epsilon": 1}], "assignment": "0000"}},
     "tiers.assignment"),
    # --- algorithm ----------------------------------------------------------------------------------
    ("ema-string", {"algorithm": {"name": "dpsgd_s", "ema": "0.9"}}, "algorithm.ema"),
    ("ema-one", {"algorithm": {"name": "dpsgd_s", "ema": 1}}, "algorithm.ema"),
    ("quantile-bool", {"algorithm": {"name": "dpsgd_s", "quantile": True}}, "algorithm.quantile"),
    ("tau-string", {"algorithm": {"name": "dpsgd_s", "tau": "x"}}, "algorithm.tau"),
    ("private-quantile-int", {"algorithm": {"name": "dpsgd_s", "private_quantile": 1}}, "algorithm.private_quantile"),
    ("private-quantile-string", {"algorithm": {"private_quantile": "no"}}, "algorithm.private_quantile"),
    ("count-noise-string", {"algorithm": {"name": "dpsgd_s", "count_noise_std": "1"}}, "algorithm.count_noise_std"),
    ("group-by-list", {"algorithm": {"name": "dpsgd_s", "group_by": []}}, "algorithm.group_by"),
    ("step-cut-string", {"algorithm": {"name": "ino", "tif": "step", "step_cut": "0.5"}}, "algorithm.step_cut"),
    ("alpha-string", {"algorithm": {"alpha": "1"}}, "algorithm.alpha"),
    ("power-null", {"algorithm": {"tif": "power", "power": None}}, "algorithm.power"),
    ("tail-length-string", {"algorithm": {"tail_length": "3"}}, "algorithm.tail_length"),
    ("tail-fraction-huge-int", {"algorithm": {"tail_fraction": 10**400}}, "algorithm.tail_fraction"),
    ("algorithm-name-int", {"algorithm": {"name": 5}}, "algorithm.name"),
    # a value no algorithm accepts, set for one that ignores the field (it trained and was stored; issue 58)
    ("quantile-1.5-idp", {"algorithm": {"name": "idp_sample", "quantile": 1.5}}, "algorithm.quantile"),
    ("count-noise-negative-idp", {"algorithm": {"name": "idp_scale", "count_noise_std": -1.0}},
     "algorithm.count_noise_std"),
    ("group-by-unknown-dpsgd", {"algorithm": {"name": "dpsgd", "group_by": "nope"}}, "algorithm.group_by"),
    ("c-min-over-c-max-ino", {"algorithm": {"name": "ino", "c_min": 5.0, "c_max": 1.0}}, "algorithm.c_min"),
    ("tif-unknown-dpsgd-s", {"algorithm": {"name": "dpsgd_s", "tif": "spline"}}, "algorithm.tif"),
    ("knots-decreasing-nonprivate", {"algorithm": {"name": "nonprivate", "knots": [[0, 0.9], [1, 0.1]]}},
     "algorithm.knots"),
    ("knots-string", {"algorithm": {**PIECEWISE, "knots": "abc"}}, "algorithm.knots"),
    ("knots-flat", {"algorithm": {**PIECEWISE, "knots": [0, 1]}}, "algorithm.knots[0]"),
    ("knots-short-pair", {"algorithm": {**PIECEWISE, "knots": [[0], [1, 1]]}}, "algorithm.knots[0]"),
    ("knots-long-pair", {"algorithm": {**PIECEWISE, "knots": [[0, 0], [1, 1, 1]]}}, "algorithm.knots[1]"),
    ("knots-string-value", {"algorithm": {**PIECEWISE, "knots": [[0, "a"], [1, 1]]}}, "algorithm.knots[0][1]"),
    ("knots-object-value", {"algorithm": {**PIECEWISE, "knots": [[0, {}], [1, 1]]}}, "algorithm.knots[0][1]"),
    ("knots-bool-value", {"algorithm": {**PIECEWISE, "knots": [[0, False], [1, True]]}}, "algorithm.knots[0][1]"),
    ("knots-one", {"algorithm": {**PIECEWISE, "knots": [[0, 0]]}}, "algorithm.knots"),
    ("knots-too-many", {"algorithm": {**PIECEWISE, "knots": [[k / 2000, 0] for k in range(2001)]}}, "algorithm.knots"),
    # --- model --------------------------------------------------------------------------------------
    ("hidden-string-item", {"model": {"name": "mlp", "hidden": ["a"]}}, "model.hidden[0]"),
    ("hidden-1e12-float", {"model": {"name": "mlp", "hidden": [1e12]}}, "model.hidden[0]"),
    ("hidden-10e12-int", {"model": {"name": "mlp", "hidden": [10**12]}}, "model.hidden[0]"),
    ("hidden-bool", {"model": {"name": "mlp", "hidden": [True]}}, "model.hidden[0]"),
    ("hidden-zero", {"model": {"name": "mlp", "hidden": [0]}}, "model.hidden[0]"),
    ("hidden-too-wide", {"model": {"name": "mlp", "hidden": [65537]}}, "model.hidden[0]"),
    ("hidden-too-deep", {"model": {"name": "mlp", "hidden": [8] * 17}}, "model.hidden"),
    ("hidden-too-many-weights", {"model": {"name": "mlp", "hidden": [65536, 65536]}}, "model.hidden"),
    ("hidden-int", {"model": {"name": "mlp", "hidden": 64}}, "model.hidden"),
    ("hidden-empty", {"model": {"name": "mlp", "hidden": []}}, "model.hidden"),
    ("model-name-list", {"model": {"name": ["mlp"]}}, "model.name"),
    ("model-not-object", {"model": "mlp"}, "model"),
    # --- data ---------------------------------------------------------------------------------------
    ("data-dir-int", {"data": {"data_dir": 123}}, "data.data_dir"),
    ("data-dir-nul", {"data": {"data_dir": "/tmp/x\x00y"}}, "data.data_dir"),
    ("data-dir-empty", {"data": {"data_dir": ""}}, "data.data_dir"),
    ("data-name-int", {"data": {"name": 5}}, "data.name"),
    ("max-train-float", {"data": {"max_train": 100.5}}, "data.max_train"),
    ("max-train-string", {"data": {"max_train": "100"}}, "data.max_train"),
    ("max-train-bool", {"data": {"max_train": True}}, "data.max_train"),
    # --- top-level run fields -------------------------------------------------------------------------
    ("seed-negative", {"seed": -1}, "seed"),
    ("seed-2**70", {"seed": 2**70}, "seed"),
    ("seed-2**63", {"seed": 2**63}, "seed"),
    ("seed-float", {"seed": 1.5}, "seed"),
    ("seed-string", {"seed": "0"}, "seed"),
    ("seed-bool", {"seed": True}, "seed"),
    ("seeds-zero", {"seeds": 0}, "seeds"),
    ("seeds-17", {"seeds": 17}, "seeds"),
    ("seeds-2**70", {"seeds": 2**70}, "seeds"),
    ("seeds-float", {"seeds": 3.0}, "seeds"),
    ("seeds-string", {"seeds": "3"}, "seeds"),
    ("seeds-bool", {"seeds": True}, "seeds"),
    ("seed-index-at-seeds", {"seeds": 3, "seed_index": 3, "seed": 5}, "seed_index"),
    ("seed-index-negative", {"seed_index": -1}, "seed_index"),
    ("seed-index-over-seed", {"seeds": 3, "seed_index": 2, "seed": 1}, "seed_index"),
    ("seed-index-null", {"seed_index": None}, "seed_index"),
    ("seeds-past-max-seed", {"seeds": 4, "seed": 2**63 - 2}, "seed"),
    ("name-object", {"name": {}}, "name"),
    ("name-nul", {"name": "a\x00b"}, "name"),
    ("name-too-long", {"name": "x" * 10_000}, "name"),
    ("batch-float", {"batch_size": 128.0}, "batch_size"),
    ("batch-string", {"batch_size": "128"}, "batch_size"),
    ("batch-bool", {"batch_size": True}, "batch_size"),
    ("batch-huge", {"batch_size": 10**8}, "batch_size"),
    ("epochs-string", {"epochs": "10"}, "epochs"),
    ("epochs-bool", {"epochs": True}, "epochs"),
    ("epochs-infinity", {"epochs": float("inf")}, "epochs"),
    ("epochs-10e400-int", {"epochs": 10**400}, "epochs"),
    ("delta-string", {"delta": "1e-5"}, "delta"),
    ("delta-0.9", {"delta": 0.9}, "delta"),  # the accountant's search never ended
    ("clip-list", {"clip_norm": []}, "clip_norm"),
    ("lr-string", {"optimizer": {"lr": "0.1"}}, "optimizer.lr"),
    ("momentum-string", {"optimizer": {"momentum": "0.9"}}, "optimizer.momentum"),
    ("momentum-one", {"optimizer": {"momentum": 1.0}}, "optimizer.momentum"),
    ("device-int", {"device": 0}, "device"),
    ("eval-every-negative", {"eval_every": -1}, "eval_every"),
    ("eval-every-float", {"eval_every": 2.5}, "eval_every"),
    ("threads-10**6", {"threads": 10**6}, "threads"),
    ("threads-zero", {"threads": 0}, "threads"),
    ("threads-string", {"threads": "4"}, "threads"),
    ("threads-float", {"threads": 4.0}, "threads"),
    ("allow-large-string", {"allow_large": "yes"}, "allow_large"),
    ("unknown-field", {"epoch": 3}, "epoch"),
    ("unknown-nested-field", {"algorithm": {"gamma": 3}}, "algorithm.gamma"),
    # --- bounds on work ------------------------------------------------------------------------------
    ("epochs-1e12", {"epochs": 1e12}, "epochs"),
    ("epochs-1e7", {"epochs": 1e7}, "epochs"),
    ("epochs-over-cap", {"epochs": 1_000_001, "batch_size": 1}, "epochs"),
]


@pytest.mark.parametrize("config,field", [c[1:] for c in RUN_CASES], ids=[c[0] for c in RUN_CASES])
def test_hostile_run_config_names_the_field(config, field):
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict(config).validate()
    assert e.value.field == field, str(e.value)
    message = str(e.value)
    assert message.startswith(f"{field}: ") and "\n" not in message and len(message) < 400


def test_case_ids_unique_and_enough():
    ids = [c[0] for c in RUN_CASES]
    assert len(set(ids)) == len(ids) and len(ids) >= 60


def test_python_built_configs_are_checked_too():
    """validate() on a config built in Python (not from JSON) applies the same type checks."""
    from engine.config.run import TierConfig, TiersConfig

    cases = [
        (RunConfig().replace(**{"tiers.tiers": (TierConfig(1.0, classes=(0, 1, 2, 3.7)),)}), "tiers.tiers[0].classes[3]"),
        (RunConfig().replace(**{"tiers": TiersConfig(tiers=({"epsilon": 1},))}), "tiers.tiers[0]"),
        (RunConfig().replace(seed=-1), "seed"),
        (RunConfig().replace(**{"algorithm.name": "dpsgd_s", "algorithm.ema": "0.9"}), "algorithm.ema"),
        (RunConfig().replace(**{"model.name": "mlp", "model.hidden": ("a",)}), "model.hidden[0]"),
        (RunConfig().replace(epochs=10**400), "epochs"),
    ]
    for config, field in cases:
        with pytest.raises(ConfigError) as e:
            config.validate()
        assert e.value.field == field


def test_the_class_a_tier_lists_is_the_class_it_trains():
    """The issue's privacy mix-up: [0,1,2,3.7,4] at ε=1 beside [3,…] at ε=2 trained class 3 at ε=2.
    A valid split trains each listed class at its tier's ε, and the tier name shows the same ids."""
    from engine.data import load_dataset
    from engine.dp.tiers import assign_tiers

    cfg = RunConfig.from_dict(tiers([0, 1, 2, 4], [3, 5, 6, 7, 8, 9])).validate()
    ds = load_dataset("digits")
    assignment = assign_tiers(cfg.tiers, ds)
    y = ds.y_train.numpy()
    assert set(assignment.train[y == 3]) == {1} and set(assignment.train[y == 4]) == {0}
    assert assignment.names[0] == "ε=1 (0,1,2,4)"
    with pytest.raises(ConfigError) as e:
        assign_tiers(RunConfig.from_dict(tiers([0, 1, 2, 4, 10], [3, 5, 6, 7, 8, 9])).tiers, ds)
    assert e.value.field == "tiers.tiers[0].classes[4]"


def test_any_json_value_gives_config_error_or_a_config():
    """RunConfig.from_dict(d).validate() on arbitrary JSON values either succeeds or raises ConfigError."""
    import random

    rng = random.Random(0)
    atoms = [None, True, False, 0, 1, -1, 2**70, 1.5, 1e308, "", "x", "\x00", [], {}, [1], [[0, 1]], {"a": 1}]
    paths = [("epochs",), ("seed",), ("seeds",), ("seed_index",), ("name",), ("tiers",), ("tiers", "tiers"), ("tiers", "assignment"),
             ("tiers", "assign"), ("model", "hidden"), ("algorithm", "knots"), ("algorithm", "name"),
             ("algorithm", "ema"), ("data", "data_dir"), ("data",), ("optimizer", "momentum"), ("threads",)]
    for _ in range(400):
        d: dict = {}
        for _ in range(rng.randint(1, 3)):
            path = rng.choice(paths)
            node = d
            for key in path[:-1]:
                node = node.setdefault(key, {}) if isinstance(node.get(key, {}), dict) else {}
            node[path[-1]] = rng.choice(atoms)
        try:
            RunConfig.from_dict(d).validate()
        except ConfigError as e:
            assert "\n" not in str(e)


# --- bounds on work that need the training-set size ----------------------------------------------------

def test_planned_steps_over_the_cap_name_epochs_before_planning():
    from engine.config.run import MAX_TOTAL_STEPS, total_steps
    from engine.train.loop import prepare

    n = 1437  # digits' training split
    epochs = 100_000  # under the data-free bound (epochs <= cap), over it once n / batch is known
    assert total_steps(epochs, n, 128) > MAX_TOTAL_STEPS
    cfg = RunConfig(epochs=epochs).validate()
    with pytest.raises(ConfigError) as e:
        prepare(cfg)
    assert e.value.field == "epochs" and "allow_large" in e.value.message
    assert cfg.replace(allow_large=True).planned_steps(n) == total_steps(epochs, n, 128)


def test_allow_large_lifts_the_data_free_cap_only_when_asked():
    RunConfig(epochs=1e7, allow_large=True).validate()
    with pytest.raises(ConfigError):
        RunConfig(epochs=1e7).validate()


def test_mlp_too_big_for_the_data_is_refused_before_allocating():
    from engine.config.run import ModelConfig
    from engine.models.nets import build_model

    with pytest.raises(ConfigError) as e:  # 3·32·32 inputs × 65536 = 201 M weights
        build_model(RunConfig.from_dict({"model": {"name": "mlp", "hidden": [65536]}}).validate().model,
                    (3, 32, 32), 10)
    assert e.value.field == "model.hidden"
    small = build_model(ModelConfig(name="mlp", hidden=(16, 8)), (64,), 10)
    assert sum(p.numel() for p in small.parameters()) == 65 * 16 + 17 * 8 + 9 * 10


def test_audit_sections_reuse_the_run_parser():
    """An audit config nests a run config: parse_section names the nested field, e.under() prefixes
    errors raised by the run's own validate()."""
    from dataclasses import dataclass, field

    from engine.config.run import check_work
    from engine.config.schema import parse_section

    @dataclass(frozen=True)
    class Outer:
        run: RunConfig = field(default_factory=RunConfig)
        R: int = 16

    with pytest.raises(ConfigError) as e:
        parse_section(Outer, {"run": {"tiers": {"tiers": [{"epsilon": "1"}]}}})
    assert e.value.field == "run.tiers.tiers[0].epsilon"
    outer = parse_section(Outer, {"run": {"seed": -1}, "R": 4})
    with pytest.raises(ConfigError) as e:
        try:
            outer.run.validate()
        except ConfigError as err:
            raise err.under("run.") from None
    assert e.value.field == "run.seed"
    with pytest.raises(ConfigError) as e:
        check_work(2 * 10**8, "R", limit=10**8, what="model-steps")
    assert e.value.field == "R" and "200,000,000 model-steps" in e.value.message
    assert check_work(2 * 10**8, "R", limit=10**8, allow_large=True) == 2 * 10**8


# --- reading config files ------------------------------------------------------------------------------

def _read(path):
    from engine.config.run import load_config

    return load_config(str(path))


TEXT_CASES = [
    ("deep-nesting", "[" * 100_000 + "]" * 100_000),
    ("deep-nesting-in-object", '{"tiers": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    ("5000-digit-int", '{"seed": ' + "9" * 5000 + "}"),
    ("duplicate-key", '{"seed": 1, "seed": 2}'),
    ("not-json", "{not json"),
    ("top-level-list", "[1, 2]"),
    ("empty", ""),
]


@pytest.mark.parametrize("text", [c[1] for c in TEXT_CASES], ids=[c[0] for c in TEXT_CASES])
def test_hostile_text(tmp_path, text):
    path = tmp_path / "c.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        _read(path)
    assert e.value.field == "config" and "\n" not in str(e.value)


BYTES_CASES = [
    ("latin-1", json.dumps({"name": "é"}, ensure_ascii=False).encode("latin-1")),
    ("utf-16", json.dumps({"name": "x"}).encode("utf-16")),
    ("utf-16-be-no-bom", json.dumps({"name": "x"}).encode("utf-16-be")),
    ("invalid-utf8", b'{"name": "\xff\xfe\xfa"}'),
    ("over-4-MiB", b'{"name": "' + b"x" * (4 * 1024 * 1024) + b'"}'),
]


@pytest.mark.parametrize("data", [c[1] for c in BYTES_CASES], ids=[c[0] for c in BYTES_CASES])
def test_hostile_bytes(tmp_path, data):
    path = tmp_path / "c.json"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as e:
        _read(path)
    assert e.value.field == "config" and str(path) in str(e.value)


def test_utf8_with_bom_is_read(tmp_path):
    path = tmp_path / "c.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"name": "ok"}).encode())
    assert _read(path).name == "ok"


def test_non_regular_files_refused_before_reading(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer: reading would block forever
    for path, what in (("/dev/zero", "not a regular file"), (tmp_path, "a directory"), (fifo, "not a regular file"),
                       (tmp_path / "missing.json", "No such file")):
        with pytest.raises(ConfigError) as e:
            _read(path)
        assert e.value.field == "config" and what in e.value.message


# --- the dashboard's ?tiers= URL value -------------------------------------------------------------------

URL_CASES = [
    ("not-json", "{", "tiers"),
    ("deep", "[" * 100_000 + "]" * 100_000, "tiers"),
    ("big-int", '{"tiers": [{"epsilon": ' + "1" * 5000 + "}]}", "tiers"),
    ("list", "[]", "tiers"),
    ("class-3.7", json.dumps(tiers([0, 1, 2, 3.7, 4], [3, 5, 6, 7, 8, 9])["tiers"]), "tiers.tiers[0].classes[3]"),
    ("classes-string", json.dumps(tiers("0123456789")["tiers"]), "tiers.tiers[0].classes"),
    ("epsilon-string", '{"tiers": [{"epsilon": "1"}]}', "tiers.tiers[0].epsilon"),
    ("unknown", '{"gamma": 1}', "tiers.gamma"),
    ("huge", '{"assign": "' + "x" * (5 * 1024 * 1024) + '"}', "tiers"),
]


@pytest.mark.parametrize("text,field", [c[1:] for c in URL_CASES], ids=[c[0] for c in URL_CASES])
def test_hostile_tiers_url_param(text, field):
    from engine.config.run import parse_tiers_param

    with pytest.raises(ConfigError) as e:
        parse_tiers_param(text)
    assert e.value.field == field


def test_tiers_url_param_round_trip():
    from engine.config.run import PAPER_TIERS, TiersConfig, parse_tiers_param

    text = json.dumps(RunConfig().to_dict()["tiers"])
    assert parse_tiers_param(text) == TiersConfig(tiers=PAPER_TIERS)


# --- audit configs (the fields an audit has besides its run) --------------------------------------------

AUDIT_CASES = [
    ("R-string", {"R": "16"}, "R"),
    ("R-float", {"R": 16.0}, "R"),
    ("R-bool", {"R": True}, "R"),
    ("R-huge", {"R": 10**9}, "R"),
    ("threshold-int", {"threshold": 5}, "threshold"),
    ("n-boot-float", {"n_boot": 1e3}, "n_boot"),
    ("confidence-string", {"confidence": "0.95"}, "confidence"),
    ("confidence-one", {"confidence": 1.0}, "confidence"),
    ("null-perms-negative", {"null_perms": -1}, "null_perms"),
    ("looa-k-string", {"looa_k": "2"}, "looa_k"),
    ("looa-models-float", {"looa_models": 1.5}, "looa_models"),
    ("group-by-int", {"group_by": 5}, "group_by"),
    ("chunk-models-zero", {"chunk_models": 0}, "chunk_models"),
    ("chunk-models-string", {"chunk_models": "8"}, "chunk_models"),
    ("memory-budget-string", {"memory_budget_gib": "1"}, "memory_budget_gib"),
    ("memory-budget-10e400-int", {"memory_budget_gib": 10**400}, "memory_budget_gib"),
    ("name-object", {"name": {}}, "name"),
    ("algorithms-string", {"algorithms": "ino"}, "algorithms"),
    ("algorithms-int-item", {"algorithms": [5]}, "algorithms[0]"),
    ("algorithms-unknown-name", {"algorithms": ["adaclip"]}, "algorithms[0]"),
    ("algorithms-ema-string", {"algorithms": [{"name": "dpsgd_s", "ema": "0.9"}]}, "algorithms[0].ema"),
    ("algorithms-knots-junk", {"algorithms": [{"name": "ino", "tif": "piecewise", "knots": [[0, "a"]]}]},
     "algorithms[0].knots[0][1]"),
    ("algorithms-step-cut-string", {"algorithms": [{"name": "ino", "tif": "step", "step_cut": "x"}]},
     "algorithms[0].step_cut"),
    ("algorithms-private-quantile-int", {"algorithms": [{"name": "dpsgd_s", "private_quantile": 0}]},
     "algorithms[0].private_quantile"),
    ("algorithms-quantile-1.5-idp", {"algorithms": ["dpsgd", {"name": "idp_sample", "quantile": 1.5}]},
     "algorithms[1].quantile"),
    ("algorithms-group-by-unknown-dpsgd", {"algorithms": [{"name": "dpsgd", "group_by": "nope"}]},
     "algorithms[0].group_by"),
]


@pytest.mark.parametrize("config,field", [c[1:] for c in AUDIT_CASES], ids=[c[0] for c in AUDIT_CASES])
def test_hostile_audit_config_names_the_field(config, field):
    from engine.audit.pa_alooa.config import AuditConfig

    with pytest.raises(ConfigError) as e:
        AuditConfig.from_dict(config).validate()
    assert e.value.field == field, str(e.value)
    assert "\n" not in str(e.value)


# --- through the CLI: exit 2, one line naming the field, the store untouched ---------------------------

def cli(*args, store):
    return cli_here(*args, store=store)  # in this process (tests/in_process.py): no 6 s import per call


def _runs(store):
    import sqlite3

    with sqlite3.connect(store) as db:
        return db.execute("SELECT id, status, config_json, summary_json FROM runs ORDER BY id").fetchall()


CLI_CASES = [
    (json.dumps(tiers([0, 1, 2, 3.7, 4], [3, 5, 6, 7, 8, 9])), "tiers.tiers[0].classes[3]"),
    (json.dumps({"seed": 2**70}), "seed"),
    (json.dumps({"seeds": 99}), "seeds"),
    (json.dumps({"epochs": 1e12}), "epochs"),
    (json.dumps({"threads": 10**6}), "threads"),
    (json.dumps({"model": {"name": "mlp", "hidden": [1e12]}}), "model.hidden[0]"),
    ('{"seed": ' + "7" * 5000 + "}", "config"),
    ("[" * 100_000 + "]" * 100_000, "config"),
]


def test_cli_refuses_hostile_configs_and_keeps_the_store(tmp_path):
    store = tmp_path / "runs.sqlite"
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"model": {"name": "lr"}, "epochs": 1, "algorithm": {"name": "dpsgd"}}))
    first = cli("run", str(good), "--json", store=store)
    assert first.returncode == 0, first.stderr
    before = _runs(store)
    assert [r[1] for r in before] == ["finished"]
    for k, (text, field) in enumerate(CLI_CASES):
        path = tmp_path / f"bad{k}.json"
        path.write_text(text, encoding="utf-8")
        out = cli("run", str(path), store=store)
        assert out.returncode == 2, (field, out.stderr[-500:])
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {field}:"), (field, out.stderr[-500:])
        assert _runs(store) == before  # nothing written, the finished run intact
    for path in ("/dev/zero", str(tmp_path), str(tmp_path / "missing.json")):
        out = cli("run", path, store=tmp_path / "other.sqlite")
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
        assert out.stderr.startswith("error: config:")
        assert not (tmp_path / "other.sqlite").exists()
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"name": "\xe9"}')
    out = cli("run", str(latin), store=store)
    assert out.returncode == 2 and out.stderr.startswith("error: config:") and "UTF-8" in out.stderr
    assert _runs(store) == before
