"""The embedded default demo: MNIST shipped in assets/mnist (checksum-verified, used when the data folder
has no MNIST), the default comparison (engine.tools.demo.DEFAULT_TRAIN) as valid run configs within budget,
and the example runs of the first Results view (matching the default comparison, INO's early gain)."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import engine.data as data
from engine.data import DataError, files, images, load_dataset
from engine.tools.demo import DEFAULT_TRAIN, EXAMPLE_PATH, EXAMPLE_SEEDS, config_key, example_runs, tier_gains

ASSETS = Path(__file__).resolve().parents[1] / "assets"
MNIST_NAMES = list(images.MNIST_FILES)
MNIST_TRAIN_HIST = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]


pytestmark = pytest.mark.usefixtures("no_network")  # conftest.py: every download attempt fails


@pytest.fixture
def empty_data_dir(tmp_path, monkeypatch):
    """A data folder without any dataset, as on a fresh machine ($PRIVACY_LAB_DATA_DIR points at it)."""
    d = tmp_path / "empty-data"
    d.mkdir()
    monkeypatch.setenv(files.ENV_VAR, str(d))
    data.clear_cache()
    files.clear_verification_cache()
    yield d
    data.clear_cache()
    files.clear_verification_cache()


# --- the shipped MNIST ----------------------------------------------------------------------------------

def test_mnist_assets_match_their_pinned_checksums():
    folder = ASSETS / "mnist"
    sums = dict(reversed(line.split()) for line in (folder / "SHA256SUMS").read_text().splitlines() if line.strip())
    assert sorted(sums) == sorted(MNIST_NAMES)
    for name in MNIST_NAMES:
        actual = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        assert actual == sums[name] == files.KNOWN_FILES[f"mnist/{name}"].sha256, name
    assert (folder / "train-images-idx3-ubyte.gz").stat().st_size == 9_912_422
    notes = (folder / "LICENSE").read_text() + (folder / "README.md").read_text()
    for word in ("LeCun", "Cortes", "Burges", "CC BY-SA 3.0", "yann.lecun.com/exdb/mnist"):
        assert word in notes


def test_mnist_falls_back_to_the_shipped_copy(empty_data_dir, no_network):
    assert data.DATASETS["mnist"].is_available()
    ds = load_dataset("mnist")
    assert ds.x_train.shape == (60000, 1, 28, 28) and len(ds.y_test) == 10000
    assert np.bincount(ds.y_train.numpy(), minlength=10).tolist() == MNIST_TRAIN_HIST
    assert no_network == [] and list(empty_data_dir.iterdir()) == []  # nothing downloaded, nothing written


def test_mnist_in_the_data_folder_wins_over_the_shipped_copy(tmp_path):
    d = tmp_path / "mnist"
    d.mkdir()
    for n in MNIST_NAMES:
        shutil.copy(ASSETS / "mnist" / n, d / n)
    fp = files.fingerprint(data.DATASETS["mnist"], tmp_path)
    assert [Path(p[0]).parent for p in fp] == [d] * 4


def test_a_corrupted_shipped_copy_is_one_clear_error(empty_data_dir, tmp_path, monkeypatch):
    fake = tmp_path / "assets"
    (fake / "mnist").mkdir(parents=True)
    for n in MNIST_NAMES:
        shutil.copy(ASSETS / "mnist" / n, fake / "mnist" / n)
    broken = fake / "mnist" / "train-labels-idx1-ubyte.gz"
    raw = bytearray(broken.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte in the deflate stream
    broken.write_bytes(bytes(raw))
    for mod in (files, images):
        monkeypatch.setattr(mod, "ASSETS_DIR", fake)
    with pytest.raises(DataError) as e:
        load_dataset("mnist")
    msg = str(e.value)
    assert msg.startswith(f"Checksum mismatch for {broken}") and "\n" not in msg
    assert files.KNOWN_FILES["mnist/train-labels-idx1-ubyte.gz"].sha256 in msg
    assert "shipped copy" in msg and "restore it" in msg


# --- the default comparison -----------------------------------------------------------------------------

def test_default_train_is_the_paper_comparison():
    d = DEFAULT_TRAIN
    assert (d.dataset, d.model, d.batch, d.lr, d.momentum, d.preset) == ("mnist", "auto", 512, 0.5, 0.5, "paper")
    assert d.algos == ("idp_sample", "ino") and d.highlight_tier == "ε=1" and d.max_train == 0
    idp, ino = d.run_configs()
    assert (idp.algorithm.name, ino.algorithm.name) == ("idp_sample", "ino")
    assert idp.replace(**{"algorithm.name": "ino"}) == ino  # the same run but for the algorithm
    tiers = {t.name: (t.epsilon, set(t.classes)) for t in idp.tiers.tiers}
    assert tiers == {"ε=1": (1.0, {2, 5, 9}), "ε=2": (2.0, {3, 7, 8}), "ε=3": (3.0, {0, 1, 4, 6})}
    assert idp.data.max_train is None and idp.optimizer.momentum == 0.5 and idp.eval_every == d.eval_every


def test_default_train_plans_within_budget_offline(empty_data_dir, one_thread):
    """Both runs prepare from the shipped MNIST; every tier's planned ε is within its budget; the plan is
    the full 12-epoch run's and an evaluation comes every ``eval_every`` steps from the start."""
    from engine.models.nets import resolve_model_name
    from engine.train.loop import prepare

    for cfg in DEFAULT_TRAIN.run_configs():
        prep = prepare(cfg)
        assert prep.steps == 1406 and len(prep.dataset.y_train) == 60000
        assert resolve_model_name(cfg.model, prep.dataset.input_shape) == "cnn"
        planned = prep.plan.to_dict()["epsilons"]
        assert len(planned) == 3
        for eps, target in zip(planned, prep.tiers.epsilons):
            assert eps <= target * (1 + 1e-9), (planned, prep.tiers.epsilons)
            assert eps > 0.9 * target  # the budget is used, not wasted
        assert prep.expected_batch == pytest.approx(512, rel=0.01)
        assert prep.tiers.names[0] == DEFAULT_TRAIN.highlight_tier and prep.tiers.epsilons[0] == 1.0
        assert 0 < cfg.eval_every <= 117 // 4  # at least four evaluations within the first epoch


# --- the example runs -----------------------------------------------------------------------------------

def test_example_file_is_small_and_matches_the_default_comparison():
    assert EXAMPLE_PATH.stat().st_size < 1_000_000
    doc = json.loads(EXAMPLE_PATH.read_text())
    keys = {c.algorithm.name: config_key(c) for c in DEFAULT_TRAIN.run_configs()}
    assert doc["config_keys"] == keys  # the file was written for today's defaults: rerun --write if not
    runs = example_runs()
    assert len(runs) == len(DEFAULT_TRAIN.algos) * EXAMPLE_SEEDS == len(doc["runs"])
    for r in runs:
        assert r["example"] is True and r["status"] == "finished" and r["kind"] == "train"
        assert config_key(r["config"]) == keys[r["algorithm"]]
        assert "seeds" not in r["config"] and "seed_index" not in r["config"]  # lone runs, as they trained
        assert r["group_id"] == "example"
        steps = [e["step"] for e in r["evals"]]
        assert steps[0] == 0 and steps[-1] == 1406 == r["total_steps"] and len(steps) == 1406 // 13 + 2
        assert r["summary"]["steps"] == 1406 and r["plan"]["epsilons"] is not None
    pairs = {(r["algorithm"], r["config"]["seed"]) for r in runs}
    assert pairs == {(a, DEFAULT_TRAIN.seed + j) for a in DEFAULT_TRAIN.algos for j in range(EXAMPLE_SEEDS)}
    runs[0]["evals"].clear()  # copies: the next caller gets the file's records again
    assert example_runs()[0]["evals"]


def _paired_gains(runs: list[dict], tier: str) -> dict[int, dict[int, float]]:
    """INO − IDP recall of ``tier`` per seed and step, from the records' evaluations (an independent
    reading of the file: both runs of a pair evaluate at the same steps)."""
    def recall(r):
        return {e["step"]: next(t["recall"] for t in e["tiers"] if t["name"] == tier) for e in r["evals"]}

    by = {(r["algorithm"], r["config"]["seed"]): recall(r) for r in runs}
    return {j: {s: by[("ino", j)][s] - by[("idp_sample", j)][s] for s in by[("ino", j)]}
            for a, j in by if a == "ino"}


def test_example_runs_show_inos_early_gain_on_the_most_private_tier():
    runs = example_runs()
    tier = DEFAULT_TRAIN.highlight_tier
    gains = _paired_gains(runs, tier)
    assert sorted(gains) == list(range(EXAMPLE_SEEDS))
    for j, g in gains.items():
        early = [v for s, v in g.items() if s <= 117]  # the first epoch
        assert max(early) > 0.01, (j, early)  # every seed: INO above IDP by more than a point early on
    mean = {s: np.mean([g[s] for g in gains.values()]) for s in gains[0]}
    assert max(v for s, v in mean.items() if s <= 117) > 0.02
    assert all(mean[s] > 0 for s in (78, 91, 104, 117)), mean
    # the charts' frame reads the same gain (the pairs it forms are the figures' concern)
    frame = tier_gains(runs)
    assert len(frame) and set(frame.tier) == {tier}


@pytest.mark.slow
def test_the_first_results_view_renders_the_examples():
    from engine.figures.training import RESULT_FIGURES, build_figures

    specs = {s.name: s for s in build_figures(example_runs(), theme="light", names=RESULT_FIGURES)}
    assert set(RESULT_FIGURES) <= set(specs)
