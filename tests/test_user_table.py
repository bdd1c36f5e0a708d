"""A researcher's own table (issue 61, the data layer): reading CSV / .csv.gz / Parquet, the one encoding rule,
owners' budgets → tiers (with bins), the preview record, the cache keyed by the file's sha256, the bad tables'
one-line refusals, the CSV escaping and the shipped worked example."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

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
from engine.data.table_encode import MAX_CATEGORIES, MISSING
from engine.data.table_records import TablePreview, TableSchema
from engine.data.user_table import (MIN_AUDIT_GROUP_ROWS, clear_table_cache, load_user_table, parse_count,
                                    spreadsheet_safe)
from engine.dp.tiers import assign_tiers


def rows_csv(n: int = 120, sep: str = ",", extra=None) -> str:
    """A small valid table: numeric age, categorical color, attribute sex, label y (yes/no), budget eps."""
    lines = [sep.join(["age", "color", "sex", "y", "eps"])]
    for i in range(n):
        lines.append(sep.join([str(20 + i % 50), ("red", "blue", "green")[i % 3], ("f", "m")[i % 2],
                               ("yes", "no")[(i // 2) % 2], str((1, 2, 4)[i % 3])]))
    return "\n".join(lines + (extra or [])) + "\n"


SCHEMA = {"file": "t.csv", "label": "y", "attributes": ["sex"], "budget": "eps"}


@pytest.fixture(autouse=True)
def _fresh():
    clear_table_cache()
    yield
    clear_table_cache()


def load(tmp_path: Path, text: str | bytes, name: str = "t.csv", **schema):
    p = tmp_path / name
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return load_user_table({**SCHEMA, "file": name, **schema}, max_tiers=MAX_TIERS, data_dir=tmp_path,
                           use_cache=False)


def refused(tmp_path, text, **schema) -> str:
    with pytest.raises(DataError) as e:
        load(tmp_path, text, **schema)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


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


# ------------------------------------------------------------------------------ bad tables: one line each
def test_a_missing_label_attribute_or_budget_column_names_the_columns_that_exist(tmp_path):
    for field, value in (("label", "target"), ("attributes", ["race"]), ("budget", "epsilon")):
        msg = refused(tmp_path, rows_csv(), **{field: value})
        missing = value[0] if isinstance(value, list) else value
        assert f"no column {missing!r}" in msg and "its columns: age, color, sex, y, eps" in msg


def test_a_label_with_one_class_is_refused(tmp_path):
    text = "x,y,sex,eps\n" + "".join(f"{i},same,f,1\n" for i in range(10))
    assert "has one class ('same')" in refused(tmp_path, text)


def test_nan_labels_are_refused_with_their_count(tmp_path):
    text = rows_csv(extra=["30,red,f,,1", "31,red,m,NaN,2"])
    assert "label column 'y': 2 rows have no label" in refused(tmp_path, text)


def test_junk_in_a_numeric_column_names_the_column_the_count_and_the_first_value(tmp_path):
    msg = refused(tmp_path, rows_csv(extra=["3O,red,f,yes,1"]))  # a letter O in a number
    assert "column 'age' is numeric but 1 cell is not a number (first: '3O' in data row 121)" in msg
    # a column of categories named as such is not junk
    t = load(tmp_path, rows_csv(extra=["3O,red,f,yes,1"]), categorical=["age"])
    assert "age=3O" in t.dataset.feature_names or "3O" in {c for cc in t.preview.categorical for c in cc.categories}


def test_junk_in_a_later_block_of_a_numeric_column_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(table_file, "BLOCK_BYTES", 1024)  # the file is read in many blocks
    msg = refused(tmp_path, rows_csv(n=400, extra=["3O,red,f,yes,1"]))
    assert "column 'age' is numeric in its first rows but holds '3O' further down" in msg


def test_a_column_whose_type_changes_after_the_first_block_is_still_numeric(tmp_path, monkeypatch):
    monkeypatch.setattr(table_file, "BLOCK_BYTES", 1024)
    lines = ["n,late,y,sex,eps"] + [f"{i},,{i % 2},f,1" for i in range(300)] + [
        f"{i + 0.5},{i},{i % 2},f,1" for i in range(300)]  # n: integers then decimals; late: empty then numbers
    t = load(tmp_path, "\n".join(lines) + "\n")
    assert [n.column for n in t.preview.numeric] == ["n", "late"] and t.preview.numeric[1].missing == 300


def test_a_malformed_row_a_nested_parquet_column_or_a_mistyped_schema_is_one_line(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    assert "is not a well-formed CSV table (delimiter ',')" in refused(tmp_path, rows_csv(extra=["1,2,3,4,5,6,7"]))
    latin1 = (rows_csv() + "30,rouge,f,café,1\n").encode("latin-1")
    assert "t.csv is not UTF-8 text (column 'y'" in refused(tmp_path, latin1)
    pq.write_table(pa.table({"x": [[1, 2], [3]], "y": ["a", "b"], "sex": ["f", "m"], "eps": [1.0, 2.0]}),
                   tmp_path / "n.parquet")
    with pytest.raises(DataError, match=r"^column 'x' holds list<.*> values, which the lab cannot read"):
        load_user_table({**SCHEMA, "file": "n.parquet"}, max_tiers=MAX_TIERS, data_dir=tmp_path, use_cache=False)
    with pytest.raises(DataError, match=r"^data.attributes must be a list, got 'sex'"):
        TableSchema(file="t.csv", label="y", attributes="sex")
    with pytest.raises(DataError, match=r"^data.features names 'age' twice"):
        TableSchema(file="t.csv", label="y", features=["age", "color", "age"])
    with pytest.raises(DataError, match=r"^data.features: 'eps' is the budget column, never a feature"):
        TableSchema(file="t.csv", label="y", budget="eps", features=["age", "eps"])


def test_duplicate_column_names_are_refused(tmp_path):
    assert "duplicate column name 'age' (columns 1 and 3)" in refused(tmp_path, "age,y,age,sex,eps\n1,a,2,f,1\n")


def test_an_empty_or_header_only_file_is_refused(tmp_path):
    assert refused(tmp_path, "").endswith("is empty.")
    assert refused(tmp_path, "\n\n").endswith("is empty.")
    assert "has a header but no rows" in refused(tmp_path, "age,color,sex,y,eps\n")


def test_a_file_over_the_size_cap_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(table_file, "MAX_TABLE_BYTES", 1000)
    assert "over the 1,000-byte cap of a table file" in refused(tmp_path, rows_csv())


def test_a_csv_gz_that_decompresses_over_the_cap_is_stopped(tmp_path, monkeypatch):
    monkeypatch.setattr(table_file, "MAX_TABLE_BYTES", 100_000)
    bomb = gzip.compress(rows_csv().encode() + b"\n" * 1_000_000)
    assert len(bomb) < 100_000
    assert "decompresses to more than the 100,000-byte cap" in refused(tmp_path, bomb, name="b.csv.gz")


def test_a_categorical_feature_over_the_cardinality_cap_names_the_column_and_its_count(tmp_path):
    n = MAX_CATEGORIES + 30
    text = "id,y,sex,eps\n" + "".join(f"c{i},{('a', 'b')[i % 2]},f,1\n" for i in range(n))
    msg = refused(tmp_path, text)
    assert f"categorical column 'id' has {n} distinct values, more than the {MAX_CATEGORIES}" in msg


def test_bad_budgets_are_refused_naming_the_column_and_the_row_count(tmp_path):
    for bad in ("", "0", "-1", "inf", "nan"):
        msg = refused(tmp_path, rows_csv(extra=[f"30,red,f,yes,{bad}", f"31,red,m,no,{bad}"]))
        assert "budget column 'eps': 2 rows have a missing, non-finite or non-positive budget" in msg, (bad, msg)
    assert "budget column 'eps': 1 row is not a number (first: 'high'" in refused(
        tmp_path, rows_csv(extra=["30,red,f,yes,high"]))


def test_too_many_distinct_budgets_say_how_many_and_how_to_bin_them(tmp_path):
    text = "x,y,sex,eps\n" + "".join(f"{i},{i % 2},f,{1 + i / 1000}\n" for i in range(40))
    p = tmp_path / "t.csv"
    p.write_text(text)
    with pytest.raises(DataError) as e:
        load_user_table(SCHEMA, max_tiers=10, data_dir=tmp_path, use_cache=False)
    assert "budget column 'eps' has 32 distinct budgets, more than the 10 tiers" in str(e.value)
    assert "tiers.bins" in str(e.value) and "\n" not in str(e.value)
    t = load_user_table({**SCHEMA, "bins": [1.01, 1.02]}, max_tiers=10, data_dir=tmp_path, use_cache=False)
    assert len(t.tiers.epsilons) == 3


def test_a_small_group_is_a_note_not_a_refusal(tmp_path):
    text = rows_csv(n=200, extra=["30,red,x,yes,1"])  # one row of sex = x
    t = load(tmp_path, text)
    assert any(n.startswith("sex: 1 group(s) with fewer than") and "(x)" in n for n in t.preview.notes)
    assert any(n.startswith("sex: ") for n in t.preview.notes) and MIN_AUDIT_GROUP_ROWS > 1


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
def test_a_second_load_reads_the_cache_and_does_not_parse(tmp_path):
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
