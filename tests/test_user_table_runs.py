"""A researcher's own table through the config, the loaders, the audits and the CLI (issue 61): real runs on small
tables in a temporary data folder, the privacy-lab command in this process (tests/in_process.py)."""
import json

import pytest
from in_process import cli_here

from engine.config.run import RunConfig
from engine.config.schema import ConfigError
from tests.fixtures_tables import rows_csv

DATA = {"file": "t.csv", "label": "y", "attributes": ["sex"]}
COLUMN = {"assign": "column", "column": "eps"}


@pytest.fixture
def folder(tmp_path):
    """A data folder holding t.csv (240 rows: owners' budgets 1, 2 and 4 in the column eps) and the store's path."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "t.csv").write_text(rows_csv(240))
    return data


def run_config(tmp_path, **fields) -> str:
    cfg = {"data": DATA, "tiers": COLUMN, "epochs": 2, "batch_size": 32, "model": {"name": "lr"},
           "algorithm": {"name": "idp_sample"}, "individual_epsilon": False, **fields}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def one_line(out) -> str:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, (out.returncode, out.stderr)
    return lines[0]


@pytest.mark.parametrize("model,algorithm", [("lr", "idp_sample"), ("mlp", "idp_scale")])
def test_run_trains_on_a_user_csv_with_one_tier_per_distinct_budget(tmp_path, folder, model, algorithm):
    store = tmp_path / "runs.sqlite"
    cfg = run_config(tmp_path, model={"name": model, "hidden": [8]}, algorithm={"name": algorithm},
                     individual_epsilon=model == "mlp")
    out = cli_here("--data-dir", folder, "run", cfg, "--json", store=store)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert [t["epsilon"] for t in summary["tiers"]] == [1.0, 2.0, 4.0]
    shown = json.loads(cli_here("show", "1", "--json", store=store).stdout)
    plan = shown["plan"]
    assert shown["status"] == "finished" and shown["config"]["data"]["name"] == "table"
    assert plan["tier_names"] == ["ε=1", "ε=2", "ε=4"] and plan["target_epsilons"] == [1.0, 2.0, 4.0]
    assert all(e <= t * (1 + 1e-6) for e, t in zip(plan["epsilons"], plan["target_epsilons"]))
    assert sum(plan["tier_sizes"]) == 192  # the 80 % training split of 240 rows
    # the run records the bytes it trained on: their sha256, size and the schema it read them with
    import hashlib
    raw = (folder / "t.csv").read_bytes()
    assert plan["table"]["sha256"] == hashlib.sha256(raw).hexdigest() and plan["table"]["size_bytes"] == len(raw)
    assert plan["table"]["schema"]["label"] == "y" and plan["table"]["schema"]["budget"] == "eps"
    if model == "mlp":  # the individual-ε panel groups by the table's tiers and its attribute too
        assert {"tier", "sex"} <= set(shown["individual_epsilon"] or {})


def test_bins_group_the_budgets_each_tier_at_its_smallest(tmp_path, folder):
    from engine.train.loop import preview
    cfg = RunConfig.from_dict({"data": {**DATA, "data_dir": str(folder)}, "tiers": {**COLUMN, "bins": [2]},
                               "model": {"name": "lr"}, "algorithm": {"name": "idp_scale"}, "accountant": "prv",
                               "epochs": 1, "batch_size": 32})
    p = preview(cfg)
    assert p.target_epsilons == (1.0, 4.0) and sum(p.tier_sizes) == 192 and p.mode == "scale"
    # data.max_train keeps a stratified subsample of the owners: the tiers are made again from those kept
    small = preview(cfg.replace(**{"data.max_train": 60, "tiers.bins": None}))
    assert small.target_epsilons == (1.0, 2.0, 4.0) and sum(small.tier_sizes) == 60


def test_plan_of_a_table_config_plans_the_tables_tiers(tmp_path, folder):
    out = cli_here("--data-dir", folder, "plan", run_config(tmp_path))
    assert out.returncode == 0, out.stderr
    assert all(f"ε={e}" in out.stdout for e in (1, 2, 4))


@pytest.mark.parametrize("fields,field", [
    ({"data": {"file": "t.csv"}}, "data.label"),
    ({"data": {"label": "y"}}, "data.label"),
    ({"data": {**DATA, "attributes": ["y"]}}, "data"),
    ({"data": {"name": "table"}, "tiers": {}}, "data.file"),
    ({"data": {"name": "digits"}, "tiers": COLUMN}, "tiers.assign"),
    ({"tiers": {"assign": "column"}}, "tiers.column"),
    ({"tiers": {**COLUMN, "bins": [2, 1]}}, "tiers.bins[1]"),
    ({"tiers": {**COLUMN, "bins": [0]}}, "tiers.bins[0]"),
    ({"tiers": {**COLUMN, "column": "sex"}}, "tiers.column"),
    ({"tiers": {"assign": "class", "column": "eps"}}, "tiers.column"),
])
def test_every_table_field_is_checked_naming_it(fields, field):
    d = {"data": DATA, "tiers": COLUMN, **fields}
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict(d).validate()
    assert e.value.field == field, e.value


def test_a_config_without_a_table_keeps_its_json():
    assert "file" not in RunConfig().to_dict()["data"] and "column" not in RunConfig().to_dict()["tiers"]
    cfg = RunConfig.from_dict({"data": DATA, "tiers": COLUMN}).validate()
    assert RunConfig.from_json(cfg.to_json()) == cfg and cfg.tiers.tiers == ()
    # the file decides: a table run's data.name is "table" (an audit merges its data over a preset's "adult")
    assert RunConfig.from_dict({"data": {**DATA, "name": "adult"}}).data.name == "table"


def test_too_many_budgets_for_the_tiers_is_one_line_naming_the_count(tmp_path, folder):
    from engine.config.limits import MAX_TIERS
    lines = ["age,color,sex,y,eps"] + [f"{i},red,{'fm'[i % 2]},{'ab'[i % 2]},{1 + i / 10}" for i in range(2 * MAX_TIERS)]
    (folder / "t.csv").write_text("\n".join(lines) + "\n")
    out = cli_here("--data-dir", folder, "run", run_config(tmp_path), store=tmp_path / "runs.sqlite")
    line = one_line(out)
    assert "distinct budgets" in line and "tiers.bins" in line


def test_cli_dry_run_prints_the_preview_and_a_bad_table_is_one_line(tmp_path, folder):
    out = cli_here("--data-dir", folder, "data", "t.csv", "--label", "y", "--attributes", "sex",
                   "--budget-column", "eps")
    assert out.returncode == 0, out.stderr
    assert "240" in out.stdout and "ε=1" in out.stdout and "sex" in out.stdout
    js = cli_here("--data-dir", folder, "data", "t.csv", "--label", "y", "--budget-column", "eps", "--bins", "2",
                  "--json")
    preview = json.loads(js.stdout)
    assert [t["epsilon"] for t in preview["tiers"]] == [1.0, 4.0] and preview["rows"] == 240
    line = one_line(cli_here("--data-dir", folder, "data", "t.csv", "--label", "nope"))
    assert "nope" in line and "age" in line  # names the columns that exist
    (folder / "empty.csv").write_text("")
    one_line(cli_here("--data-dir", folder, "data", "empty.csv", "--label", "y"))


def test_rerun_of_a_changed_table_stops_with_one_line_unless_accepted(tmp_path, folder):
    store = tmp_path / "runs.sqlite"
    cfg = run_config(tmp_path, epochs=1)
    assert cli_here("--data-dir", folder, "run", cfg, "--json", store=store).returncode == 0
    assert cli_here("--data-dir", folder, "rerun", "1", "--json", store=store).returncode == 0  # unchanged: runs
    (folder / "t.csv").write_text(rows_csv(200))
    line = one_line(cli_here("--data-dir", folder, "rerun", "1", store=store))
    assert "changed" in line and "--accept-changed-data" in line
    assert len(json.loads(cli_here("list", "--json", store=store).stdout)) == 2  # nothing started
    out = cli_here("--data-dir", folder, "rerun", "1", "--accept-changed-data", "--json", store=store)
    assert out.returncode == 0, out.stderr
    shown = json.loads(cli_here("show", "3", "--json", store=store).stdout)
    assert sum(shown["plan"]["tier_sizes"]) == 160  # trained on the new content, recorded as such
    assert shown["plan"]["table"]["size_bytes"] == len(rows_csv(200).encode())


def test_audit_groups_by_one_of_the_tables_attributes(tmp_path, folder):
    from engine.audit.pa_alooa.config import AuditConfig
    from engine.audit.pa_alooa.setup import prepare_audit
    run = {"data": {**DATA, "attributes": ["sex", "color"], "features": ["age"], "data_dir": str(folder)},
           "tiers": COLUMN, "epochs": 1, "batch_size": 16, "model": {"name": "lr"}, "device": "cpu"}
    cfg = AuditConfig.from_dict({"run": run, "algorithms": [{"name": "idp_sample"}], "R": 2,
                                 "group_by": "attribute", "group_attribute": "color"})
    setup = prepare_audit(cfg)
    assert setup.group_names == ["blue", "green", "red"] and list(setup.tiers.epsilons) == [1.0, 2.0, 4.0]
    assert [float(e) for e in setup.algos[0].claimed] == pytest.approx([1.0, 2.0, 4.0], rel=1e-6)
    with pytest.raises(ConfigError):
        prepare_audit(cfg.replace(group_attribute="nope"))
    with pytest.raises(ConfigError) as e:  # a budget column the table lacks: named where the audit's config has it
        prepare_audit(cfg.replace(**{"run.tiers.column": "age"}))
    assert e.value.field.startswith("run.")


@pytest.mark.slow
def test_audit_cli_on_a_table_reports_per_attribute_group(tmp_path, folder):
    run = {"data": {**DATA, "data_dir": str(folder)}, "tiers": COLUMN, "epochs": 1, "batch_size": 16,
           "model": {"name": "lr"}, "device": "cpu"}
    cfg = tmp_path / "a.json"
    cfg.write_text(json.dumps({"run": run, "algorithms": [{"name": "idp_sample"}], "R": 2, "group_by": "attribute",
                               "group_attribute": "sex"}))
    out = cli_here("audit", cfg, "--json", store=tmp_path / "runs.sqlite")
    assert out.returncode == 0, out.stderr
    assert {"f", "m"} <= set(out.stdout.replace('"', " ").split())


@pytest.mark.slow
def test_one_run_audit_on_a_table_checks_each_budget_tier(tmp_path, folder):
    run = {"data": {**DATA, "data_dir": str(folder)}, "tiers": COLUMN, "epochs": 1, "batch_size": 16,
           "model": {"name": "lr"}, "device": "cpu", "individual_epsilon": False}
    cfg = tmp_path / "o.json"
    cfg.write_text(json.dumps({"run": run, "algorithms": [{"name": "idp_sample"}], "canaries": 20,
                               "input_canaries": 5}))
    out = cli_here("one-run-audit", cfg, "--json", store=tmp_path / "runs.sqlite")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    white = [r for r in report["rows"] if r["kind"] == "white"]
    assert [r["tier"] for r in white] == ["ε=1", "ε=2", "ε=4"]
    assert [r["epsilon"] for r in white] == pytest.approx([1.0, 2.0, 4.0], rel=1e-6)  # each tier's claim: its budget
    assert all(r["epsilon"] <= b for r, b in zip(white, (1.0, 2.0, 4.0)))


def test_tiers_written_beside_a_budget_column_never_replace_the_owners_budgets(folder):
    """A config's own tiers with assign "column" could plan another ε than the owners chose: refused, naming it."""
    from engine.train.loop import preview
    cfg = RunConfig.from_dict({"data": {**DATA, "data_dir": str(folder)}, "model": {"name": "lr"},
                               "tiers": {**COLUMN, "tiers": [{"epsilon": 8}, {"epsilon": 8}, {"epsilon": 8}]},
                               "algorithm": {"name": "idp_sample"}, "epochs": 1, "batch_size": 32})
    with pytest.raises(ConfigError) as e:
        preview(cfg)
    assert e.value.field == "tiers.tiers" and "ε = 1, 2, 4" in e.value.message
