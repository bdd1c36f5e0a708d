"""The suite's own rules (tests/conftest.py): the privacy-invariant tests listed in tests/invariants.txt stay in the
fast subset, and a listed test that is renamed, merged, deleted or marked slow stops the collection."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import invariant_problems, invariant_tests

TESTS = Path(__file__).resolve().parent


def test_the_list_names_tests_that_exist_and_none_is_marked_slow():
    listed = invariant_tests()
    assert len(listed) > 100
    for module in sorted({name.split("::")[0] for name in listed}):
        source = (TESTS / f"{module}.py").read_text()
        assert "pytestmark = pytest.mark.slow" not in source, module
        defs = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
        for function in sorted(name.split("::")[1] for name in listed if name.startswith(f"{module}::")):
            assert function in defs, f"{module}::{function}"
            assert not any("slow" in ast.unparse(d) for d in defs[function].decorator_list), f"{module}::{function}"


def test_a_listed_test_that_moves_out_or_goes_is_named():
    listed = {"test_a::test_kept", "test_a::test_moved", "test_a::test_renamed", "test_b::test_not_collected"}
    collected = {"test_a::test_kept": False, "test_a::test_moved": True, "test_a::test_new_name": False}
    assert invariant_problems(listed, collected) == ["gone: test_a::test_renamed",
                                                     "marked slow or browser: test_a::test_moved"]
    assert invariant_problems(listed - {"test_a::test_moved", "test_a::test_renamed"}, collected) == []
