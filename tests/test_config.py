"""RunConfig: JSON round trip and one ConfigError (naming the field) per invalid case."""
import json
import math

import pytest

from engine.config.run import RunConfig, TierConfig, TiersConfig
from engine.config.schema import ConfigError
from engine.train.loop import prepare


def test_json_round_trip_is_canonical():
    cfg = RunConfig().replace(**{"algorithm.name": "dpsgd_s", "algorithm.quantile": 0.6, "epochs": 2.5})
    text = cfg.to_json()
    back = RunConfig.from_json(text)
    assert back == cfg
    assert back.to_json() == text
    assert json.loads(text)["algorithm"]["quantile"] == 0.6
    assert isinstance(back.tiers.tiers[0].classes, tuple)


def test_piecewise_knots_round_trip():
    cfg = RunConfig().replace(**{"algorithm.tif": "piecewise", "algorithm.knots": ((0, 0), (0.5, 0.2), (1, 1))})
    back = RunConfig.from_json(cfg.to_json()).validate()
    assert back.algorithm.knots == ((0, 0), (0.5, 0.2), (1, 1))


def bad(**changes):
    return RunConfig().replace(**changes)


STATIC_CASES = [
    ({"tiers.tiers": (TierConfig(epsilon=0.0, classes=tuple(range(10))),)}, "tiers.tiers[0].epsilon"),
    ({"seeds": 0}, "seeds"),
    ({"seeds": 17}, "seeds"),
    ({"seeds": 2, "seed_index": 2, "seed": 4}, "seed_index"),
    ({"seeds": 3, "seed_index": 1, "seed": 0}, "seed_index"),
    ({"tiers.tiers": (TierConfig(epsilon=-1.0, classes=tuple(range(10))),)}, "tiers.tiers[0].epsilon"),
    ({"tiers.tiers": (TierConfig(epsilon=math.inf, classes=tuple(range(10))),)}, "tiers.tiers[0].epsilon"),
    ({"tiers.tiers": (TierConfig(epsilon=math.nan, classes=tuple(range(10))),)}, "tiers.tiers[0].epsilon"),
    ({"delta": 0.0}, "delta"),
    ({"delta": 1.0}, "delta"),
    ({"delta": -1e-5}, "delta"),
    ({"tiers.tiers": (TierConfig(1.0, classes=(0, 1, 2)), TierConfig(2.0, classes=(2, 3, 4, 5, 6, 7, 8, 9)))},
     "tiers.tiers[1].classes"),
    ({"algorithm.tail_length": 0.0}, "algorithm.tail_length"),
    ({"algorithm.tail_length": -2.0}, "algorithm.tail_length"),
    ({"algorithm.tail_length": None, "algorithm.tail_fraction": 0.0}, "algorithm.tail_fraction"),
    ({"algorithm.alpha": 0.0}, "algorithm.alpha"),
    ({"algorithm.beta": -1.0}, "algorithm.beta"),
    ({"algorithm.name": "dpsgd_s", "algorithm.tau": 0.0}, "algorithm.tau"),
    ({"algorithm.name": "dpsgd_s", "algorithm.quantile": 1.0}, "algorithm.quantile"),
    ({"algorithm.name": "dpsgd_s", "algorithm.quantile": 0.0}, "algorithm.quantile"),
    ({"batch_size": 0}, "batch_size"),
    ({"data.name": "imagenet"}, "data.name"),
    ({"model.name": "transformer"}, "model.name"),
    ({"algorithm.name": "adaclip"}, "algorithm.name"),
    ({"epochs": 0}, "epochs"),
    ({"epochs": -1.0}, "epochs"),
    ({"algorithm.tif": "piecewise", "algorithm.knots": ((0, 0.6), (1, 0.3))}, "algorithm.knots"),
]


@pytest.mark.parametrize("changes,field", STATIC_CASES, ids=[f for _, f in STATIC_CASES])
def test_invalid_static(changes, field):
    with pytest.raises(ConfigError) as e:
        bad(**changes).validate()
    assert e.value.field == field
    assert field in str(e.value)


DATA_CASES = [
    # a class assigned to no tier
    ({"tiers.tiers": (TierConfig(1.0, classes=(0, 1, 2)), TierConfig(2.0, classes=(3, 4, 5, 6, 7, 8)))},
     "tiers.tiers"),
    # a tier with no samples (explicit assignment never uses tier 1)
    ({"tiers": TiersConfig(assign="explicit", tiers=(TierConfig(1.0), TierConfig(2.0)),
                           assignment=(0,) * 1437)}, "tiers.tiers[1]"),
    ({"batch_size": 100000}, "batch_size"),
    ({"model.name": "resnet18", "data.name": "adult"}, "model.name"),
    ({"tiers": TiersConfig(assign="attribute", tiers=(TierConfig(1.0, values=("x",)),))}, "tiers.attribute"),
]


@pytest.mark.parametrize("changes,field", DATA_CASES, ids=[f for _, f in DATA_CASES])
def test_invalid_against_data(changes, field):
    with pytest.raises(ConfigError) as e:
        prepare(bad(**changes))
    assert e.value.field == field


def test_unknown_json_field_named():
    with pytest.raises(ConfigError) as e:
        RunConfig.from_json('{"algorithm": {"name": "ino", "gamma": 3}}')
    assert e.value.field == "algorithm.gamma"


def test_valid_default_prepares():
    prep = prepare(RunConfig())
    assert sum(prep.tiers.sizes) == 1437 and min(prep.tiers.sizes) > 0
    assert len(prep.plan.sample_rates) == 3


def test_seeds_default_to_one_and_stay_out_of_the_canonical_json():
    """Configs written before ``seeds`` existed parse to seeds = 1, seed_index = 0, and a single-seed
    config's canonical JSON (hence any hash of it) is unchanged: the fields appear only when not default."""
    old = {"model": {"name": "lr"}, "epochs": 3, "seed": 4}
    cfg = RunConfig.from_dict(old).validate()
    assert (cfg.seeds, cfg.seed_index, cfg.base_seed) == (1, 0, 4)
    assert "seeds" not in cfg.to_json() and "seed_index" not in cfg.to_json()
    assert cfg.seed_configs() == [cfg] and cfg.job_config() is cfg
    job = cfg.replace(seeds=3).validate()
    rows = job.seed_configs()
    assert [(r.seed, r.seed_index, r.seeds) for r in rows] == [(4, 0, 3), (5, 1, 3), (6, 2, 3)]
    for r in rows:
        back = RunConfig.from_json(r.to_json()).validate()
        assert back == r and back.to_json() == r.to_json() and back.job_config() == job
        assert json.loads(r.to_json())["seeds"] == 3
    assert rows[0].to_dict()["seeds"] == 3 and "seed_index" not in rows[0].to_dict()
    assert json.loads(rows[2].to_json())["seed_index"] == 2


def test_a_data_dir_that_is_a_file_is_an_error_not_a_fall_back(tmp_path, monkeypatch):
    from engine.config.run import RunConfig
    from engine.config.schema import ConfigError
    from engine.data import DataError, data_dir, load_dataset

    f = tmp_path / "not-a-folder"
    f.write_text("x")
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict({"data": {"name": "digits", "data_dir": str(f)}}).validate()
    assert e.value.field == "data.data_dir" and "is a file, not a folder" in str(e.value)
    with pytest.raises(DataError, match="is a file, not a folder"):
        load_dataset("mnist", data_dir=str(f))
    monkeypatch.setenv("PRIVACY_LAB_DATA_DIR", str(f))
    with pytest.raises(DataError, match="PRIVACY_LAB_DATA_DIR"):
        data_dir()
    monkeypatch.setenv("PRIVACY_LAB_DATA_DIR", str(tmp_path / "missing"))
    assert data_dir() == (tmp_path / "missing").resolve()  # a folder that does not exist yet is fine
