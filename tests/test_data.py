"""Tests of engine.data: registry, loaders, checksums, CIFAR safety, UTKFace parsing."""

from __future__ import annotations

import csv
import gzip
import io
import os
import pickle
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import engine.data as data
from engine.data import DATASETS, DataError, Dataset, dataset_names, load_dataset
from engine.data import cifar, files

try:  # tests/ as a package or as a plain folder on sys.path
    from . import fixtures_data as fx
except ImportError:  # pragma: no cover
    import fixtures_data as fx

REAL_DOWNLOAD = files.download_file

MNIST_TRAIN_HIST = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_HIST = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


# ------------------------------------------------------------------------------ fixtures
pytestmark = pytest.mark.usefixtures("no_network")  # conftest.py: every download attempt fails


@pytest.fixture(scope="session")
def shared_data() -> Path:
    env = os.environ.get("PRIVACY_LAB_DATA_DIR")
    p = Path(env).resolve() if env else Path(__file__).resolve().parents[2] / "shared" / "data"
    if not (p / "mnist").is_dir():
        pytest.skip(f"staged data not found at {p}")
    return p


def _hist(t: torch.Tensor, k: int) -> list[int]:
    return np.bincount(t.numpy(), minlength=k).tolist()


def _unnormalize(ds: Dataset, x: torch.Tensor) -> np.ndarray:
    n = ds.meta["normalization"]
    mean = np.asarray(n["mean"], dtype=np.float32).reshape(1, -1, 1, 1)
    std = np.asarray(n["std"], dtype=np.float32).reshape(1, -1, 1, 1)
    return (x.numpy() * std + mean) * n["scale"]


# ------------------------------------------------------------------------------ registry / API
def test_registry_and_names():
    expected = ["digits", "mnist", "cifar10", "cifar100", "cifar100_fv", "adult", "bank", "credit_default",
                "german_credit", "law_school", "utkface"]
    assert dataset_names() == expected
    assert list(DATASETS) == expected
    for name, info in DATASETS.items():
        assert info.name == name and info.kind in {"image", "tabular"} and callable(info.loader)
        assert info.description and info.source
        if info.default_sensitive is not None:
            assert info.default_sensitive in info.sensitive_attributes
    assert DATASETS["adult"].default_sensitive == "sex"
    assert set(DATASETS["adult"].sensitive_attributes) == {"sex", "race"}
    assert DATASETS["bank"].default_sensitive == "age_group"
    assert DATASETS["utkface"].default_sensitive == "race"
    assert [n for n, i in DATASETS.items() if i.offline] == ["digits", "mnist", "adult"]


def test_unknown_dataset_lists_known_names():
    with pytest.raises(DataError) as e:
        load_dataset("imagenet")
    msg = str(e.value)
    assert "imagenet" in msg
    for n in dataset_names():
        assert n in msg


def test_bad_arguments(tmp_path):
    for bad in (0, -3, 2.5, True):
        with pytest.raises(DataError, match="max_train"):
            load_dataset("digits", data_dir=str(tmp_path), max_train=bad)
    with pytest.raises(DataError, match="seed"):
        load_dataset("digits", data_dir=str(tmp_path), seed="x")


def test_data_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv(files.ENV_VAR, raising=False)
    assert data.data_dir() == (Path.home() / ".cache" / "privacy-imbalance-lab" / "data").resolve()
    monkeypatch.setenv(files.ENV_VAR, str(tmp_path / "env"))
    assert data.data_dir() == tmp_path / "env"
    assert data.data_dir(str(tmp_path / "explicit")) == tmp_path / "explicit"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(files.ENV_VAR, "rel/dir")
    assert data.data_dir() == tmp_path / "rel" / "dir"


def test_availability(tmp_path, shared_data):
    assert DATASETS["digits"].is_available(tmp_path)
    assert DATASETS["adult"].is_available(tmp_path)  # shipped copy in assets/adult
    assert DATASETS["mnist"].is_available(tmp_path)  # shipped copy in assets/mnist
    assert not DATASETS["cifar10"].is_available(tmp_path)
    assert DATASETS["mnist"].is_available(shared_data)
    assert DATASETS["mnist"].expected_dir(tmp_path) == tmp_path.resolve() / "mnist"


# ------------------------------------------------------------------------------ digits
def test_digits_offline(tmp_path, no_network):
    ds = load_dataset("digits", data_dir=str(tmp_path))
    assert ds.kind == "image" and ds.input_shape == (1, 8, 8) and ds.num_classes == 10
    assert len(ds.y_train) == 1437 and len(ds.y_test) == 360
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    assert float(ds.x_train.min()) == 0.0 and float(ds.x_train.max()) == 1.0  # x / 16
    assert ds.sensitive_train == {} and ds.default_sensitive is None
    tr, te = _hist(ds.y_train, 10), _hist(ds.y_test, 10)
    for a, b in zip(tr, te):  # stratified 80/20
        assert abs(b / (a + b) - 0.2) < 0.02
    assert no_network == [] and list(tmp_path.iterdir()) == []


def test_max_train_stratified_deterministic(tmp_path):
    full = load_dataset("digits", data_dir=str(tmp_path))
    a = load_dataset("digits", data_dir=str(tmp_path), max_train=200, seed=1)
    assert a is load_dataset("digits", data_dir=str(tmp_path), max_train=200, seed=1)  # cached
    data.clear_cache()
    a2 = load_dataset("digits", data_dir=str(tmp_path), max_train=200, seed=1)
    b = load_dataset("digits", data_dir=str(tmp_path), max_train=200, seed=2)
    assert a2 is not a and torch.equal(a.x_train, a2.x_train) and torch.equal(a.y_train, a2.y_train)
    assert len(a.y_train) == 200 and not torch.equal(a.x_train, b.x_train)
    frac_full = np.bincount(full.y_train.numpy()) / len(full.y_train)
    assert np.all(np.abs(np.bincount(a.y_train.numpy()) - 200 * frac_full) <= 1.0)
    assert torch.equal(a.x_test, full.x_test)  # test set untouched
    # every subsampled row is a row of the full training set, with its label
    rows = {tuple(r): int(y) for r, y in zip(full.x_train.flatten(1).numpy().round(4).tolist(), full.y_train)}
    for r, y in zip(a.x_train.flatten(1).numpy().round(4).tolist(), a.y_train):
        assert rows[tuple(r)] == int(y)
    assert len(load_dataset("digits", data_dir=str(tmp_path), max_train=10**6).y_train) == 1437


# ------------------------------------------------------------------------------ MNIST
def test_mnist_full(shared_data):
    data.clear_cache()
    files.clear_verification_cache()
    ds = load_dataset("mnist", data_dir=str(shared_data))
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.x_test.shape == (10000, 1, 28, 28)
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    assert _hist(ds.y_train, 10) == MNIST_TRAIN_HIST
    assert _hist(ds.y_test, 10) == MNIST_TEST_HIST
    assert ds.class_names == [str(i) for i in range(10)]
    # (x/255 - 0.1307) / 0.3081: the training set has mean ~0 and std ~1
    assert abs(float(ds.x_train.mean())) < 1e-3 and abs(float(ds.x_train.std()) - 1.0) < 1e-2
    assert float(ds.x_train.min()) == pytest.approx(-0.1307 / 0.3081, abs=1e-5)
    assert load_dataset("mnist", data_dir=str(shared_data)) is ds  # cached in-process
    sub = load_dataset("mnist", data_dir=str(shared_data), max_train=1000, seed=0)
    assert len(sub.y_train) == 1000 and min(_hist(sub.y_train, 10)) >= 89


@pytest.fixture
def no_assets(tmp_path, monkeypatch):
    """The shipped copies (assets/) hidden: an empty assets folder."""
    from engine.data import images, tabular

    empty = tmp_path / "no-assets"
    empty.mkdir()
    for mod in (files, images, tabular):
        monkeypatch.setattr(mod, "ASSETS_DIR", empty)
    return empty


def test_mnist_missing_gives_clear_error(tmp_path, no_network, no_assets):
    assert not DATASETS["mnist"].is_available(tmp_path)
    with pytest.raises(DataError) as e:
        load_dataset("mnist", data_dir=str(tmp_path))
    msg = str(e.value)
    for name in ("train-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        assert name in msg
    assert str(tmp_path.resolve() / "mnist") in msg
    assert "https://" in msg and "download failed" in msg
    assert len(no_network) == 4  # one attempt per file, all refused


def test_mnist_corrupt_file_rejected(tmp_path, shared_data):
    d = tmp_path / "mnist"
    d.mkdir()
    for n in fx_mnist_names():
        shutil.copy(shared_data / "mnist" / n, d / n)
    raw = bytearray(gzip.decompress((d / "t10k-labels-idx1-ubyte.gz").read_bytes()))
    raw[100] = (raw[100] + 1) % 10  # one flipped label
    (d / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(bytes(raw)))
    with pytest.raises(DataError, match=r"Checksum mismatch.*t10k-labels-idx1-ubyte\.gz"):
        load_dataset("mnist", data_dir=str(tmp_path))


def fx_mnist_names():
    return ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
            "t10k-labels-idx1-ubyte.gz"]


def test_idx_parser_rejects_bad_header():
    from engine.data.images import parse_idx

    good = b"\x00\x00\x08\x01" + (3).to_bytes(4, "big") + bytes([1, 2, 3])
    assert parse_idx(good, 1).tolist() == [1, 2, 3]
    with pytest.raises(DataError):
        parse_idx(good[:-1], 1)  # truncated
    with pytest.raises(DataError):
        parse_idx(b"\x00\x00\x0d\x01" + good[4:], 1)  # float IDX


# ------------------------------------------------------------------------------ tabular
def _adult_reference(path: Path, skip_first: bool):
    """Independent count of complete rows with the csv module."""
    with gzip.open(path, "rt") as f:
        lines = f.read().splitlines()[1 if skip_first else 0:]
    rows = [[c.strip() for c in r] for r in csv.reader(lines) if r]
    rows = [r for r in rows if len(r) == 15 and "?" not in r]
    return len(rows), Counter(r[14].rstrip(".") for r in rows), Counter(r[9] for r in rows), rows[0]


def test_adult(shared_data):
    ds = load_dataset("adult", data_dir=str(shared_data))
    n_tr, inc_tr, sex_tr, first_tr = _adult_reference(shared_data / "adult" / "adult.data.gz", False)
    n_te, inc_te, sex_te, _ = _adult_reference(shared_data / "adult" / "adult.test.gz", True)
    assert (len(ds.y_train), len(ds.y_test)) == (n_tr, n_te) == (30162, 15060)
    assert n_tr + n_te == 45222
    assert int(ds.y_train.sum()) == inc_tr[">50K"] and int(ds.y_test.sum()) == inc_te[">50K"]
    assert Counter(ds.sensitive_train["sex"].tolist()) == sex_tr
    assert Counter(ds.sensitive_test["sex"].tolist()) == sex_te
    assert ds.default_sensitive == "sex" and ds.class_names == ["<=50K", ">50K"]
    assert set(ds.sensitive_train["race"]) == {"White", "Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other"}
    # first row of adult.data: 39, State-gov, ..., White, Male, ..., <=50K
    assert first_tr[9] == "Male" and ds.sensitive_train["sex"][0] == "Male" and int(ds.y_train[0]) == 0
    # sex is kept as a one-hot feature, aligned with the sensitive array
    col = ds.feature_names.index("sex_Male")
    for x, s in ((ds.x_train, ds.sensitive_train), (ds.x_test, ds.sensitive_test)):
        assert np.array_equal(x[:, col].numpy() == 1.0, s["sex"] == "Male")
    assert "income" not in " ".join(ds.feature_names)
    # numerics standardised on train
    age = ds.x_train[:, ds.feature_names.index("age")]
    assert abs(float(age.mean())) < 1e-4 and abs(float(age.std()) - 1) < 1e-3


def test_adult_ships_with_the_repo(tmp_path, no_network):
    ds = load_dataset("adult", data_dir=str(tmp_path), max_train=1000, seed=5)
    assert len(ds.y_train) == 1000 and len(ds.y_test) == 15060 and no_network == []
    col = ds.feature_names.index("sex_Male")
    assert np.array_equal(ds.x_train[:, col].numpy() == 1.0, ds.sensitive_train["sex"] == "Male")
    assets = Path(__file__).resolve().parents[1] / "assets" / "adult"
    assert (assets / "README.md").read_text().count("10.24432/C5XW20") >= 1


# name -> (rows, positives, {attribute: expected value counts over all rows or value set})
TABULAR = {
    "adult": (45222, None, {"sex": {"Male", "Female"}}),
    "bank": (45211, 5289, {"age_group": {"<25", "25-60", ">60"}}),
    "credit_default": (30000, 6636, {"sex": {"male": 11888, "female": 18112}}),
    "german_credit": (1000, 300, {"sex": {"female": 310, "male": 690}, "age_group": {"<=25", ">25"}}),
    "law_school": (21791, 19360, {"sex": {"1": 9537, "2": 12254},
                                  "race": {"White": 18285, "Black": 1282, "Asian": 845, "Hispanic": 488,
                                           "Mexican": 389, "Other": 293, "Puertorican": 110, "Amerindian": 99}}),
}


@pytest.mark.parametrize("name", list(TABULAR))
def test_tabular_sets(name, shared_data):
    rows, positives, expected = TABULAR[name]
    ds = load_dataset(name, data_dir=str(shared_data))
    info = DATASETS[name]
    assert ds.kind == "tabular" and ds.num_classes == 2 and len(ds.input_shape) == 1
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    assert ds.x_train.shape[1] == ds.x_test.shape[1] == len(ds.feature_names)
    assert torch.isfinite(ds.x_train).all() and torch.isfinite(ds.x_test).all()
    assert set(ds.y_train.unique().tolist()) == {0, 1} and set(ds.y_test.unique().tolist()) == {0, 1}
    assert len(ds.y_train) + len(ds.y_test) == rows
    if positives is not None:
        assert int(ds.y_train.sum() + ds.y_test.sum()) == positives
        assert abs(len(ds.y_test) - 0.2 * rows) <= 1  # 80/20 stratified
        assert abs(float(ds.y_train.float().mean()) - float(ds.y_test.float().mean())) < 0.01
    assert ds.default_sensitive == info.default_sensitive
    assert set(ds.sensitive_train) == set(info.sensitive_attributes) == set(ds.sensitive_test)
    for attr, exp in expected.items():
        tr, te = ds.sensitive_train[attr], ds.sensitive_test[attr]
        assert len(tr) == len(ds.y_train) and len(te) == len(ds.y_test)
        assert tr.dtype.kind == "U"
        counts = Counter(tr.tolist()) + Counter(te.tolist())
        if isinstance(exp, dict):
            assert dict(counts) == exp
        else:
            assert set(counts) == exp


def test_tabular_sensitive_alignment(shared_data):
    g = load_dataset("german_credit", data_dir=str(shared_data))
    fem = sum(g.x_train[:, g.feature_names.index(c)].numpy() for c in g.feature_names
              if c in ("status_sex_A92", "status_sex_A95"))
    assert np.array_equal(fem == 1.0, g.sensitive_train["sex"] == "female")
    c = load_dataset("credit_default", data_dir=str(shared_data))
    assert np.array_equal(c.x_test[:, c.feature_names.index("SEX_2")].numpy() == 1.0,
                          c.sensitive_test["sex"] == "female")
    assert "ID" not in c.feature_names and "default payment next month" not in c.feature_names
    law = load_dataset("law_school", data_dir=str(shared_data))
    assert "ZFYA" not in law.feature_names and "first_pf" not in law.feature_names
    assert np.array_equal(law.x_train[:, law.feature_names.index("race_Black")].numpy() == 1.0,
                          law.sensitive_train["race"] == "Black")
    b = load_dataset("bank", data_dir=str(shared_data), max_train=5000, seed=3)
    age = b.x_train[:, b.feature_names.index("age")].numpy()
    grp = b.sensitive_train["age_group"]
    assert age[grp == "<25"].max() < age[grp == "25-60"].min() <= age[grp == "25-60"].max() < age[grp == ">60"].min()


def test_checksum_variants_and_corruption(tmp_path, shared_data):
    raw = gzip.decompress((shared_data / "german_credit" / "german.data.gz").read_bytes())
    ref = load_dataset("german_credit", data_dir=str(shared_data))
    # the uncompressed original and a differently compressed copy are both accepted
    for i, (fname, content) in enumerate([("german.data", raw), ("german.data.gz", gzip.compress(raw, mtime=1))]):
        d = tmp_path / f"ok{i}" / "german_credit"
        d.mkdir(parents=True)
        (d / fname).write_bytes(content)
        ds = load_dataset("german_credit", data_dir=str(d.parent))
        assert torch.equal(ds.x_train, ref.x_train) and torch.equal(ds.y_test, ref.y_test)
    d = tmp_path / "bad" / "german_credit"
    d.mkdir(parents=True)
    (d / "german.data.gz").write_bytes(gzip.compress(raw.replace(b"A201 1", b"A201 2", 1)))
    with pytest.raises(DataError, match="Checksum mismatch"):
        load_dataset("german_credit", data_dir=str(d.parent))


def test_download_file_verifies_sha256(tmp_path, shared_data):
    src = shared_data / "german_credit" / "german.data.gz"
    kf = files.KNOWN_FILES["german_credit/german.data.gz"]
    out = REAL_DOWNLOAD(src.as_uri(), tmp_path / "dl" / "german.data.gz", kf.sha256)
    assert out.read_bytes() == src.read_bytes()
    with pytest.raises(DataError, match="sha256"):
        REAL_DOWNLOAD(src.as_uri(), tmp_path / "dl2" / "x.gz", "0" * 64)
    assert not (tmp_path / "dl2").exists()  # nothing kept, not even the folder


def test_missing_tabular_file_names_source(tmp_path):
    with pytest.raises(DataError) as e:
        load_dataset("law_school", data_dir=str(tmp_path))
    msg = str(e.value)
    assert "law_data.csv.gz" in msg and str(tmp_path.resolve() / "law_school") in msg
    assert "counterfactual-fairness" in msg


# ------------------------------------------------------------------------------ CIFAR
def _pin(monkeypatch, path: Path):
    monkeypatch.setitem(cifar.CIFAR_CHECKSUMS, path.name, fx.sha256_md5(path))


def test_cifar10_fixture(tmp_path, monkeypatch):
    path = tmp_path / "cifar10" / "cifar-10-python.tar.gz"
    exp = fx.make_cifar10_tarball(path, per_batch=4, n_test=6)
    with pytest.raises(DataError, match="Checksum mismatch"):  # real table: refused
        load_dataset("cifar10", data_dir=str(tmp_path))
    _pin(monkeypatch, path)
    ds = load_dataset("cifar10", data_dir=str(tmp_path))
    assert ds.kind == "image" and ds.input_shape == (3, 32, 32) and ds.num_classes == 10
    assert ds.class_names == fx.CIFAR10_NAMES
    assert len(ds.y_train) == 20 and len(ds.y_test) == 6
    assert ds.y_train.tolist() == exp["y_train"].tolist() and ds.y_test.tolist() == exp["y_test"].tolist()
    assert np.abs(_unnormalize(ds, ds.x_train) - exp["x_train"]).max() < 1e-3
    assert np.abs(_unnormalize(ds, ds.x_test) - exp["x_test"]).max() < 1e-3
    assert ds.meta["normalization"]["mean"] == list(cifar.CIFAR10_MEAN)


def test_cifar100_and_fv_fixture(tmp_path, monkeypatch):
    fv = list(cifar.FV_FINE_LABELS)
    assert fv == [73, 32, 67, 91, 1, 8, 58, 90, 13, 48]
    fine_train = [0, 73, 2, 32, 67, 99, 91, 1, 8, 58, 90, 13, 48, 50, 1, 73, 48, 3, 90, 8]
    fine_test = [48, 5, 73, 13, 70, 1]
    path = tmp_path / "cifar100" / "cifar-100-python.tar.gz"
    exp = fx.make_cifar100_tarball(path, fine_train, fine_test)
    _pin(monkeypatch, path)
    full = load_dataset("cifar100", data_dir=str(tmp_path))
    assert full.num_classes == 100 and full.class_names == fx.CIFAR100_FINE_NAMES
    assert full.y_train.tolist() == fine_train and full.y_test.tolist() == fine_test
    assert np.abs(_unnormalize(full, full.x_train) - exp["x_train"]).max() < 1e-3

    ds = load_dataset("cifar100_fv", data_dir=str(tmp_path))
    assert ds.num_classes == 10 and ds.input_shape == (3, 32, 32)
    assert ds.class_names == ["shark", "flatfish", "ray", "trout", "aquarium_fish",
                              "bicycle", "pickup_truck", "train", "bus", "motorcycle"]
    keep_tr = [i for i, f in enumerate(fine_train) if f in fv]
    keep_te = [i for i, f in enumerate(fine_test) if f in fv]
    assert ds.y_train.tolist() == [fv.index(fine_train[i]) for i in keep_tr]
    assert ds.y_test.tolist() == [fv.index(fine_test[i]) for i in keep_te]
    assert np.abs(_unnormalize(ds, ds.x_train) - exp["x_train"][keep_tr]).max() < 1e-3
    assert np.abs(_unnormalize(ds, ds.x_test) - exp["x_test"][keep_te]).max() < 1e-3
    assert set(ds.y_train.tolist()) == set(range(10))
    sub = load_dataset("cifar100_fv", data_dir=str(tmp_path), max_train=3, seed=0)
    assert len(sub.y_train) == 3


def test_wrong_checksum_is_refused_before_unpickling(tmp_path, monkeypatch):
    path = tmp_path / "cifar10" / "cifar-10-python.tar.gz"
    marker = tmp_path / "UNPICKLED"
    fx.make_malicious_cifar10_tarball(path, marker)
    calls = []
    monkeypatch.setattr(cifar, "_unpickle", lambda b: calls.append(b) or pytest.fail("unpickled!"))
    monkeypatch.setattr(pickle, "load", lambda *a, **k: pytest.fail("pickle.load called"))
    monkeypatch.setattr(pickle, "loads", lambda *a, **k: pytest.fail("pickle.loads called"))
    with pytest.raises(DataError, match="(?s)Checksum mismatch.*Refusing to unpickle"):
        load_dataset("cifar10", data_dir=str(tmp_path))
    # sha256 pinned to this file but md5 wrong: still refused
    monkeypatch.setitem(cifar.CIFAR_CHECKSUMS, path.name, {**fx.sha256_md5(path), "md5": "0" * 32})
    with pytest.raises(DataError, match="md5"):
        load_dataset("cifar10", data_dir=str(tmp_path))
    # explicit checksums argument overrides the table (and still refuses a wrong value)
    with pytest.raises(DataError, match="sha256"):
        cifar.read_cifar_tarball(path, cifar.CIFAR10_MEMBERS, checksums={path.name: {"sha256": "1" * 64}})
    with pytest.raises(DataError, match="No pinned checksum"):
        cifar.read_cifar_tarball(path, cifar.CIFAR10_MEMBERS, checksums={})
    assert calls == [] and not marker.exists()


def test_cifar_unpickler_only_resolves_numpy_globals():
    up = cifar._CifarUnpickler(io.BytesIO(b""), encoding="bytes")
    assert up.find_class("numpy", "ndarray") is np.ndarray
    for module, name in (("os", "mkdir"), ("builtins", "eval"), ("posix", "system"), ("numpy", "load")):
        with pytest.raises(pickle.UnpicklingError):
            up.find_class(module, name)


def test_cifar_missing(tmp_path, no_network):
    with pytest.raises(DataError) as e:
        load_dataset("cifar100_fv", data_dir=str(tmp_path))
    msg = str(e.value)
    assert "cifar-100-python.tar.gz" in msg and str(tmp_path.resolve() / "cifar100") in msg
    assert "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz" in msg
    assert no_network == ["https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"]


# ------------------------------------------------------------------------------ UTKFace
def test_utkface_fixture(tmp_path):
    pytest.importorskip("PIL")
    made = fx.make_utkface_folder(tmp_path / "utkface")
    ds = load_dataset("utkface", data_dir=str(tmp_path))
    n = len(made["valid"])
    assert ds.meta["n_images"] == n == len(ds.y_train) + len(ds.y_test)
    assert ds.meta["n_malformed_names"] == len(made["malformed"])
    assert ds.meta["n_unreadable"] == len(made["unreadable"])
    assert ds.input_shape == (3, 32, 32) and ds.class_names == ["male", "female"]
    assert ds.default_sensitive == "race" and set(ds.sensitive_train) == {"race"}
    assert Counter(ds.y_train.tolist() + ds.y_test.tolist()) == Counter(g for _, g, _ in made["valid"])
    races = ["White", "Black", "Asian", "Indian", "Others"]
    palette = {(g, r): np.array(fx.utk_color(g, r), dtype=np.float32) for g in (0, 1) for r in range(5)}
    for x, y, s in ((ds.x_train, ds.y_train, ds.sensitive_train), (ds.x_test, ds.y_test, ds.sensitive_test)):
        assert len(s["race"]) == len(y)
        colors = _unnormalize(ds, x).mean(axis=(2, 3))
        for c, label, race in zip(colors, y.tolist(), s["race"].tolist()):
            g, r = min(palette, key=lambda k: np.abs(palette[k] - c).sum())
            assert np.abs(palette[(g, r)] - c).max() < 6
            assert (g, races[r]) == (label, race)


def test_utkface_name_parser():
    from engine.data.images import parse_utk_name

    assert parse_utk_name("26_1_3_20170119193006411.jpg.chip.jpg") == (26, 1, 3)
    assert parse_utk_name("100_0_0_20170112213500903.jpg") == (100, 0, 0)
    for bad in ("39_1_20170116174525125.jpg.chip.jpg", "26_1_5_20170119193006411.jpg", "26_1_3_x.jpg",
                "26_1_3_20170119193006411.png", "a_1_3_20170119193006411.jpg", "26_1_3_20170119193006411.jpg.txt"):
        assert parse_utk_name(bad) is None, bad


def test_utkface_missing_folder(tmp_path):
    with pytest.raises(DataError, match="utkface"):
        load_dataset("utkface", data_dir=str(tmp_path))
