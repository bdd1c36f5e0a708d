"""A researcher's own table (issue 61, the data layer): reading CSV / .csv.gz / Parquet, the one encoding rule,
owners' budgets → tiers (with bins), the preview record, the cache keyed by the file's sha256, uploads, the
CSV escaping and the shipped worked example. The bad tables: tests/test_user_table_bad.py."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config.run import MAX_TIERS, TierConfig, TiersConfig
from engine.data import DataError
from engine.data import table_file, user_table
from engine.data.budgets import budget_tiers
from engine.data.example_table import EXAMPLE_FILE, EXAMPLE_SCHEMA, example_csv_text
from engine.data.files import ASSETS_DIR
from engine.data.table_encode import MISSING
from engine.data.table_records import TablePreview, TableSchema
from engine.data.user_table import clear_table_cache, load_user_table, parse_count, spreadsheet_safe
from engine.dp.tiers import assign_tiers

from tests.fixtures_tables import SCHEMA, load, rows_csv, fresh_table_cache  # noqa: F401 - an autouse fixture


# ------------------------------------------------------------------------------ reading
def test_a_table_loads_as_a_dataset_with_its_preview(tmp_path):
    t = load(tmp_path, rows_csv())
    ds, pv = t.dataset, t.preview
    assert ds.kind == "tabular" and ds.class_names == ["no", "yes"]
    assert len(ds.y_train) + len(ds.y_test) == 120 == pv.rows and len(ds.y_test) == 24
    assert ds.feature_names == ["color=blue", "color=green", "color=red", "age"]  # sex and eps are not features
    assert ds.default_sensitive == "sex" and set(ds.sensitive_train["sex"]) == {"f", "m"}
    assert pv.encoded_features == 4 and pv.format == "csv" and pv.delimiter == ","
    assert [(c.name, c.train + c.test) for c in pv.classes] == [("no", 60), ("yes", 60)]
    assert {c.name: c.train + c.test for c in pv.groups["sex"]} == {"f": 60, "m": 60}
    assert pv.schema.features == ("age", "color")
    import hashlib
    assert pv.sha256 == hashlib.sha256((tmp_path / "t.csv").read_bytes()).hexdigest()
    assert pv.size_bytes == (tmp_path / "t.csv").stat().st_size


def test_csv_gz_parquet_and_a_sniffed_semicolon_or_tab_give_the_same_dataset(tmp_path):
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    base = load(tmp_path, rows_csv())
    semi = load(tmp_path, rows_csv(sep=";"), name="semi.csv")
    tab = load(tmp_path, rows_csv(sep="\t"), name="tab.tsv")
    gz = load(tmp_path, gzip.compress(rows_csv().encode()), name="t.csv.gz")
    table = pacsv.read_csv(pa.py_buffer(rows_csv().encode()))
    pq.write_table(table, tmp_path / "t.parquet")
    par = load_user_table({**SCHEMA, "file": "t.parquet"}, max_tiers=MAX_TIERS, data_dir=tmp_path, use_cache=False)
    assert (semi.preview.delimiter, tab.preview.delimiter, gz.preview.format, par.preview.format) == (
        ";", "\t", "csv.gz", "parquet")
    for other in (semi, tab, gz, par):
        assert other.dataset.feature_names == base.dataset.feature_names
        assert np.array_equal(other.dataset.x_train.numpy(), base.dataset.x_train.numpy())
        assert np.array_equal(other.dataset.y_test.numpy(), base.dataset.y_test.numpy())
        assert np.array_equal(other.tiers.train, base.tiers.train)


def test_a_relative_path_resolves_in_the_data_folder_then_the_shipped_assets(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "t.csv").write_text(rows_csv())
    assert table_file.resolve_table_path("sub/t.csv", tmp_path) == tmp_path / "sub" / "t.csv"
    assert table_file.resolve_table_path(EXAMPLE_FILE, tmp_path) == (ASSETS_DIR / EXAMPLE_FILE).resolve()
    with pytest.raises(DataError, match="stays inside the data folder"):
        table_file.resolve_table_path("../t.csv", tmp_path / "sub")
    with pytest.raises(DataError, match="no such file"):
        table_file.resolve_table_path("nope.csv", tmp_path)


# ------------------------------------------------------------------------------ the encoding rule
def split_table(test_age: int) -> str:
    lines = ["age,color,sex,y,eps,part"]
    for i in range(40):
        lines.append(f"{20 + i},{('red', 'blue')[i % 2]},f,{i % 2},1,train")
    for i in range(10):
        lines.append(f"{test_age + i},purple,m,{i % 2},1,TEST")
    return "\n".join(lines) + "\n"


def test_numeric_features_are_standardised_with_training_statistics_only(tmp_path):
    a = load(tmp_path, split_table(30), name="a.csv", split="part", attributes=[])
    b = load(tmp_path, split_table(10_000), name="b.csv", split="part", attributes=[])
    age = [n.column for n in a.preview.numeric].index("age")
    assert a.preview.numeric[age] == b.preview.numeric[age]  # test rows do not move the mean or the std
    assert a.preview.numeric[age].mean == pytest.approx(np.mean(np.arange(20, 60)))
    assert a.preview.numeric[age].std == pytest.approx(np.std(np.arange(20, 60)))
    assert np.array_equal(a.dataset.x_train.numpy(), b.dataset.x_train.numpy())
    col = a.dataset.feature_names.index("age")
    x = a.dataset.x_train.numpy()[:, col]
    assert x.mean() == pytest.approx(0, abs=1e-6) and x.std() == pytest.approx(1, abs=1e-6)
    xb = b.dataset.x_test.numpy()[:, col]
    s = b.preview.numeric[age]
    assert np.allclose(xb, (np.arange(10_000, 10_010) - s.mean) / s.std, rtol=1e-6)
    assert a.preview.split == "split column 'part'" and (a.preview.rows_train, a.preview.rows_test) == (40, 10)


def test_categories_come_from_the_training_split_and_an_unseen_test_category_is_all_zeros(tmp_path):
    t = load(tmp_path, split_table(30), split="part", attributes=[])
    assert t.preview.categorical[0].categories == ("blue", "red")  # purple appears in test rows only
    assert t.preview.categorical[0].unseen_test == 10
    cols = [t.dataset.feature_names.index(f"color={c}") for c in ("blue", "red")]
    assert t.dataset.x_test.numpy()[:, cols].sum() == 0
    assert (t.dataset.x_train.numpy()[:, cols].sum(axis=1) == 1).all()
    assert any("category the training split lacks" in n for n in t.preview.notes)


def test_missing_cells_are_the_training_mean_or_their_own_category(tmp_path):
    text = "age,color,y,sex,eps\n" + "".join(
        f"{'' if i % 5 == 0 else 20 + i},{'' if i % 7 == 0 else 'red'},{i % 2},f,1\n" for i in range(100))
    t = load(tmp_path, text)
    assert f"color={MISSING}" in t.dataset.feature_names
    assert t.preview.numeric[0].missing == 20
    col = t.dataset.feature_names.index("age")
    assert np.isfinite(t.dataset.x_train.numpy()).all() and (t.dataset.x_train.numpy()[:, col] == 0).sum() >= 1


def test_class_ids_follow_numeric_order_for_numbers_and_text_order_otherwise(tmp_path):
    text = "x,y,sex,eps\n" + "".join(f"{i},{(2, 10, 1)[i % 3]},f,1\n" for i in range(30))
    assert load(tmp_path, text).dataset.class_names == ["1", "2", "10"]
    text = "x,y,sex,eps\n" + "".join(f"{i},{('b', 'a', 'C')[i % 3]},f,1\n" for i in range(30))
    t = load(tmp_path, text, name="s.csv")
    assert t.dataset.class_names == ["C", "a", "b"]
    assert [c.name for c in t.preview.classes] == t.dataset.class_names


def test_the_stratified_split_is_seeded(tmp_path):
    a = load(tmp_path, rows_csv(), seed=3)
    b = load(tmp_path, rows_csv(), seed=3)
    c = load(tmp_path, rows_csv(), seed=4)
    assert np.array_equal(a.dataset.x_test.numpy(), b.dataset.x_test.numpy())
    assert not np.array_equal(a.dataset.x_test.numpy(), c.dataset.x_test.numpy())
    assert [cl.test for cl in a.preview.classes] == [12, 12]


# ------------------------------------------------------------------------------ budgets → tiers
def test_each_distinct_budget_is_a_tier_in_the_form_assign_tiers_takes(tmp_path):
    t = load(tmp_path, rows_csv())
    assert t.tiers.epsilons == (1.0, 2.0, 4.0) and t.tiers.names == ("ε=1", "ε=2", "ε=4")
    assert np.array_equal(np.asarray(t.tiers.epsilons)[t.tiers.train], t.budgets_train)
    assert [(x.name, x.train + x.test) for x in t.preview.tiers] == [("ε=1", 40), ("ε=2", 40), ("ε=4", 40)]
    assignment, epsilons, names = t.tiers.explicit()
    tiers = TiersConfig(assign="explicit", assignment=assignment,
                        tiers=tuple(TierConfig(epsilon=e, name=n) for e, n in zip(epsilons, names)))
    got = assign_tiers(tiers, t.dataset)
    assert got.epsilons == t.tiers.epsilons and got.sizes == tuple(x.train for x in t.preview.tiers)


def test_bins_give_each_bin_its_smallest_budget():
    budgets = np.array([0.5, 0.9, 1.0, 1.5, 2.0, 3.0, 7.5, 9.0])
    bt = budget_tiers(budgets, np.array([0.7, 2.5, 100.0]), "eps", max_tiers=MAX_TIERS, bins=[1, 2, 4])
    # bins: ≤ 1, (1, 2], (2, 4], > 4
    assert bt.epsilons == (0.5, 1.5, 3.0, 7.5)
    assert bt.train.tolist() == [0, 0, 0, 1, 1, 2, 3, 3]
    assert bt.test.tolist() == [0, 2, 3]
    assert bt.names[0] == "ε=0.5 (budgets 0.5–1)" and bt.names[2] == "ε=3"
    bt = budget_tiers(budgets, np.array([0.5, 0.6]), "eps", max_tiers=MAX_TIERS)
    assert bt.test.tolist() == [0, -1]  # a test budget the training rows do not have: no tier
    for bad in ([], [2, 1], [0, 1], ["a"], "1,2"):
        with pytest.raises(DataError, match="tiers.bins"):
            budget_tiers(budgets, budgets, "eps", max_tiers=MAX_TIERS, bins=bad)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.01, 100), min_size=1, max_size=60),
       st.lists(st.floats(0.05, 50), min_size=1, max_size=6, unique=True))
def test_no_owner_is_ever_trained_at_a_larger_epsilon_than_they_chose(budgets, edges):
    b = np.array(budgets)
    bt = budget_tiers(b, b, "eps", max_tiers=MAX_TIERS, bins=sorted(edges))
    eps = np.asarray(bt.epsilons)[bt.train]
    assert (eps <= b).all()
    assert len(bt.epsilons) == len(set(bt.train.tolist()))  # every tier has owners


# ------------------------------------------------------------------------------ cache, records, escaping
def test_a_second_load_reads_the_cache_and_does_not_parse(tmp_path, monkeypatch):
    monkeypatch.delenv(user_table.CACHE_ENV_VAR, raising=False)  # the default place: the data folder's cache
    (tmp_path / "t.csv").write_text(rows_csv())
    first = load_user_table(SCHEMA, max_tiers=MAX_TIERS, data_dir=tmp_path)
    n = parse_count()
    clear_table_cache()  # a new process would start here: only the cache on disk is left
    second = load_user_table(SCHEMA, max_tiers=MAX_TIERS, data_dir=tmp_path)
    assert parse_count() == n
    assert np.array_equal(first.dataset.x_train.numpy(), second.dataset.x_train.numpy())
    assert first.preview == second.preview
    assert list((tmp_path / "cache" / "tables").iterdir())[0].name.startswith(first.preview.sha256[:32])
    clear_table_cache()  # other bins regroup the cached budgets: no parse either
    binned = load_user_table({**SCHEMA, "bins": [1.5]}, max_tiers=MAX_TIERS, data_dir=tmp_path)
    assert parse_count() == n and binned.tiers.epsilons == (1.0, 2.0)
    clear_table_cache()
    (tmp_path / "t.csv").write_text(rows_csv(n=130))  # new bytes: parsed again
    third = load_user_table(SCHEMA, max_tiers=MAX_TIERS, data_dir=tmp_path)
    assert parse_count() == n + 1 and third.preview.rows == 130
    assert all(p.suffix in (".npy", ".json") for p in (tmp_path / "cache").rglob("*") if p.is_file())


def test_the_cache_drops_its_least_recently_used_entries_and_rebuilds_a_broken_one(tmp_path, monkeypatch):
    monkeypatch.delenv(user_table.CACHE_ENV_VAR, raising=False)
    (tmp_path / "t.csv").write_text(rows_csv())
    entries = tmp_path / "cache" / "tables"
    a = load_user_table(SCHEMA, max_tiers=MAX_TIERS, data_dir=tmp_path)
    monkeypatch.setattr(user_table, "MAX_CACHE_BYTES", 1)
    load_user_table({**SCHEMA, "seed": 1}, max_tiers=MAX_TIERS, data_dir=tmp_path)
    assert len(list(entries.iterdir())) == 1  # the older entry went; the newest always stays
    monkeypatch.setattr(user_table, "MAX_CACHE_BYTES", 1 << 30)
    clear_table_cache()
    load_user_table(SCHEMA, max_tiers=MAX_TIERS, data_dir=tmp_path)
    (folder,) = [p for p in entries.iterdir() if p.name.endswith(user_table._cache_key(a.preview.sha256,
                                                                                       TableSchema(**SCHEMA))[32:])]
    (folder / "x_train.npy").write_bytes(b"not an array")
    clear_table_cache()
    n = parse_count()
    again = load_user_table(SCHEMA, max_tiers=MAX_TIERS, data_dir=tmp_path)
    assert parse_count() == n + 1 and np.array_equal(again.dataset.x_train.numpy(), a.dataset.x_train.numpy())
    clear_table_cache()
    load_user_table(SCHEMA, max_tiers=MAX_TIERS, data_dir=tmp_path)
    assert parse_count() == n + 1  # rebuilt, then read


def test_the_preview_record_round_trips_through_json(tmp_path):
    pv = load(tmp_path, rows_csv(n=200, extra=["30,red,x,yes,1"])).preview
    d = json.loads(json.dumps(pv.to_dict()))
    assert TablePreview.from_dict(d) == pv and TablePreview.from_dict(d).to_dict() == pv.to_dict()
    assert TableSchema.from_dict(pv.schema.to_dict()) == pv.schema
    assert any("tiers from budgets: ε=1" in line for line in pv.lines())
    with pytest.raises(DataError, match="unknown field 'lable'"):
        TableSchema.from_dict({"file": "t.csv", "lable": "y"})


def test_spreadsheet_formula_cells_are_escaped():
    for s in ("=SUM(A1)", "+1", "-2", "@cmd", "\tx", "\rx"):
        assert spreadsheet_safe(s) == "'" + s
    for s in ("Female", "a=b", "", "ε=1"):
        assert spreadsheet_safe(s) == s


# ------------------------------------------------------------------------------ the worked example
def test_the_shipped_example_regenerates_and_loads_with_three_budget_tiers(tmp_path):
    shipped = gzip.decompress((ASSETS_DIR / EXAMPLE_FILE).read_bytes()).decode()
    assert example_csv_text() == shipped
    t = load_user_table(EXAMPLE_SCHEMA, max_tiers=MAX_TIERS, data_dir=tmp_path, use_cache=False)
    assert t.preview.rows == 4000 and t.tiers.epsilons == (1.0, 2.0, 3.0)
    assert [x.train for x in t.preview.tiers] == [288, 1188, 1724]
    assert set(t.preview.groups) == {"sex", "race"} and t.dataset.class_names == ["<=50K", ">50K"]
    assert (ASSETS_DIR / EXAMPLE_FILE).stat().st_size < 100_000


# ------------------------------------------------------------------------------ uploads, reruns, subsamples
def test_an_upload_is_stored_once_under_its_hash_inside_the_data_folder(tmp_path, monkeypatch):
    from engine.data import uploads

    data = rows_csv().encode()
    rel = uploads.store_upload(data, "../../etc/loans.csv", data_dir=tmp_path)
    import hashlib
    assert rel == f"uploads/{hashlib.sha256(data).hexdigest()}.csv"
    assert uploads.store_upload(data, "again.csv", data_dir=tmp_path) == rel
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()] == [rel]
    t = load_user_table({**SCHEMA, "file": rel}, max_tiers=MAX_TIERS, data_dir=tmp_path, use_cache=False)
    assert t.preview.rows == 120
    assert uploads.store_upload(gzip.compress(data), "x.CSV.GZ", data_dir=tmp_path).endswith(".csv.gz")
    for name, blob, what in (("x.xlsx", data, "not a table file"), ("x.csv", b"", "is empty")):
        with pytest.raises(DataError, match=what):
            uploads.store_upload(blob, name, data_dir=tmp_path)
    monkeypatch.setattr(uploads, "MAX_UPLOAD_BYTES", 100)
    with pytest.raises(DataError, match="over the 100-byte cap of an uploaded table"):
        uploads.store_upload(data, "x.csv", data_dir=tmp_path)


def test_a_changed_table_is_said_in_one_line(tmp_path):
    from engine.data.uploads import table_changed

    t = load(tmp_path, rows_csv())
    assert table_changed("t.csv", t.preview.sha256, tmp_path) is None
    (tmp_path / "t.csv").write_text(rows_csv(n=121))
    msg = table_changed("t.csv", t.preview.sha256, tmp_path)
    assert msg.startswith("the run's table t.csv changed since the run") and "\n" not in msg
    (tmp_path / "t.csv").unlink()
    assert table_changed("t.csv", t.preview.sha256, tmp_path).startswith("the run's table is gone")


def test_a_subsample_makes_its_tiers_from_the_owners_it_keeps(tmp_path):
    text = "x,y,sex,eps\n" + "".join(f"{i},{i % 2},f,{9 if i == 7 else 1 + i % 2}\n" for i in range(400))
    t = load(tmp_path, text)
    assert 9.0 in t.tiers.epsilons or 9.0 in t.budgets_test
    sub = t.subsample(50, seed=0)
    assert len(sub.dataset.y_train) == 50 and len(sub.tiers.train) == 50
    assert np.array_equal(np.asarray(sub.tiers.epsilons)[sub.tiers.train], sub.budgets_train)
    assert sub.tiers.epsilons == tuple(sorted(set(sub.budgets_train.tolist())))
    assert t.subsample(None, seed=0) is t and t.subsample(10_000, seed=0) is t


def test_the_cache_can_live_outside_the_data_folder(tmp_path, monkeypatch):
    """$PRIVACY_LAB_TABLE_CACHE (the tests set it: they write only to temporary folders) takes the encoded tables;
    the data folder gets nothing."""
    (tmp_path / "t.csv").write_text(rows_csv())
    monkeypatch.setenv(user_table.CACHE_ENV_VAR, str(tmp_path / "elsewhere"))
    clear_table_cache()
    load_user_table(SCHEMA, max_tiers=MAX_TIERS, data_dir=tmp_path)
    assert any((tmp_path / "elsewhere").iterdir()) and not (tmp_path / "cache").exists()
