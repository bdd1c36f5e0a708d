"""The suite's own rules (tests/conftest.py): the privacy-invariant tests listed in tests/invariants.txt stay in the
fast subset, and a listed test that is renamed, merged, deleted or marked slow stops the collection."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import can_select, defined_tests, invariant_problems, invariant_tests, module_marks

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
            # the mark, not any "slow" (hypothesis' HealthCheck.too_slow in a @settings is no mark)
            assert not any("mark.slow" in ast.unparse(d) for d in defs[function].decorator_list), \
                f"{module}::{function}"


def test_a_listed_test_that_moves_out_or_goes_is_named():
    listed = {"test_a::test_kept", "test_a::test_moved", "test_a::test_renamed", "test_b::test_not_collected"}
    collected = {"test_a::test_kept": False, "test_a::test_moved": True, "test_a::test_new_name": False}
    defined = {"test_a::test_kept", "test_a::test_moved", "test_a::test_new_name"}
    assert invariant_problems(listed, collected, defined) == ["gone: test_a::test_renamed",
                                                              "marked slow or browser: test_a::test_moved"]
    assert invariant_problems(listed - {"test_a::test_moved", "test_a::test_renamed"}, collected, defined) == []
    # one test run by its node id: the module's other listed tests are defined, only not collected this time
    assert invariant_problems(listed - {"test_a::test_moved", "test_a::test_renamed"},
                              {"test_a::test_new_name": False}, defined) == []


def test_the_defined_tests_of_a_module_are_its_test_functions():
    import types

    module = types.ModuleType("test_x")
    module.__file__ = "/somewhere/tests/test_x.py"
    module.test_one = lambda: None
    module.test_two = lambda: None
    module.testing_level = 3  # not callable
    module.helper = lambda: None  # not a test
    assert defined_tests(module) == {"test_x::test_one", "test_x::test_two"}


def test_a_module_is_imported_only_where_one_of_its_tests_can_be_selected():
    for expr in ("not browser and not slow", "not (browser or slow)", "slow and not browser", "not browser"):
        assert not can_select(expr, {"browser"}), expr
    for expr in ("", "browser", "slow", "not slow", "browser or slow", "browser and slow"):
        assert can_select(expr, {"browser"}), expr
    assert not can_select("not browser and not slow", {"slow"}) and can_select("not browser", {"slow"})
    assert can_select("not (browser", {"browser"})  # a malformed -m: collected, and pytest says what is wrong
    assert module_marks(TESTS / "test_browser.py") == {"browser"} and module_marks(TESTS / "test_ray.py") == {"slow"}
    assert module_marks(TESTS / "test_suite.py") == set()


def test_the_longest_groups_come_first_and_every_module_keeps_its_order():
    from types import SimpleNamespace

    from conftest import first_groups_first, xdist_group

    names = ["test_a.py::x", "test_browser_zoom.py::z", "test_ray.py::r1", "test_b.py::y", "test_browser.py::b1",
             "test_browser_ray.py::br", "test_ray.py::r2", "test_browser.py::b2", "test_a.py::x2"]
    items = [SimpleNamespace(path=TESTS / n.split("::")[0], name=n) for n in names]
    first_groups_first(items)
    assert [i.name for i in items] == ["test_browser_zoom.py::z", "test_browser.py::b1", "test_browser.py::b2",
                                       "test_ray.py::r1", "test_browser_ray.py::br", "test_ray.py::r2",
                                       "test_a.py::x", "test_b.py::y", "test_a.py::x2"]
    assert [xdist_group(TESTS / n) for n in ("test_browser_zoom.py", "test_browser_ray.py", "test_ray.py",
                                             "test_a.py")] == ["browser", "ray", "ray", "test_a"]
