"""A researcher's table (issue 61): every bad table of the issue's point 5 is refused with one DataError line
that names what is wrong (columns that exist, counts, the first bad value); a small group is a note."""
from __future__ import annotations

import gzip

import pytest

from engine.config.run import MAX_TIERS
from engine.data import DataError, table_file
from engine.data.table_encode import MAX_CATEGORIES
from engine.data.table_records import TableSchema
from engine.data.user_table import MIN_AUDIT_GROUP_ROWS, load_user_table

from tests.fixtures_tables import SCHEMA, load, refused, rows_csv, fresh_table_cache  # noqa: F401 - an autouse fixture


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
