"""Tables for tests/test_user_table*.py: a small valid CSV and the helpers that load it from a temporary data
folder (the cache off) or expect its one-line refusal."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.config.run import MAX_TIERS
from engine.data import DataError
from engine.data.user_table import clear_table_cache, load_user_table


def rows_csv(n: int = 120, sep: str = ",", extra=None) -> str:
    """A small valid table: numeric age, categorical color, attribute sex, label y (yes/no), budget eps."""
    lines = [sep.join(["age", "color", "sex", "y", "eps"])]
    for i in range(n):
        lines.append(sep.join([str(20 + i % 50), ("red", "blue", "green")[i % 3], ("f", "m")[i % 2],
                               ("yes", "no")[(i // 2) % 2], str((1, 2, 4)[i % 3])]))
    return "\n".join(lines + (extra or [])) + "\n"


SCHEMA = {"file": "t.csv", "label": "y", "attributes": ["sex"], "budget": "eps"}


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


@pytest.fixture(autouse=True)
def fresh_table_cache():
    """Each test starts and ends with no table held in this process (modules that import it use it for every test)."""
    clear_table_cache()
    yield
    clear_table_cache()

