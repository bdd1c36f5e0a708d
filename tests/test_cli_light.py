"""A command line that answers at once (issue 60): ``--help``, a typo, ``list`` and ``app``'s own checks import no
torch (the commands that train, plan, audit or draw are imported once such a command is parsed), and the small
things a newcomer meets first: every flag says what it does, bad input is one line with exit 2, ``list`` lines up,
``show`` gives the config a field a line, a stopped command names its run."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from engine import cli
from engine.reference import subcommands
from engine.store.db import RunStore
from tests.in_process import cli_here

ROOT = Path(__file__).resolve().parent.parent
# what a fresh process imported, and the CPU seconds it took, after one command line
PROBE = ("import sys, time, json\n"
         "t = time.process_time()\n"
         "from engine.cli import main\n"
         "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
         "print(json.dumps({'torch': 'torch' in sys.modules, 'pandas': 'pandas' in sys.modules, "
         "'cpu': time.process_time() - t}), file=sys.stderr)\n")


def probe(*argv, cwd) -> dict:
    env = {**os.environ, "PRIVACY_LAB_STORE": str(Path(cwd) / "runs.sqlite")}
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=120)
    return json.loads(out.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["--help"], ["plan", "--help"], ["audit", "--help"], ["plna"], ["list"],
                                  ["app", "--port", "0"]])
def test_help_a_typo_and_list_import_no_torch(argv, tmp_path):
    RunStore(tmp_path / "runs.sqlite")  # an empty store for list
    seen = probe(*argv, cwd=tmp_path)
    assert not seen["torch"] and not seen["pandas"], (argv, seen)


def test_a_command_that_trains_still_imports_its_engine(tmp_path):
    """The probe can fail: a command that plans pulls torch in, after the parse."""
    cfg = tmp_path / "c.json"
    cfg.write_text("{}")
    assert probe("plan", str(cfg), cwd=tmp_path)["torch"]


def test_every_option_says_what_it_does():
    silent = [f"{name} {' / '.join(a.option_strings) or a.dest}"
              for name, sub in {"(global)": cli.build_parser(), **subcommands(cli.build_parser())}.items()
              for a in sub._actions  # noqa: SLF001 - argparse keeps its actions nowhere else
              if not a.help and not isinstance(a, cli.argparse._SubParsersAction)]  # noqa: SLF001
    assert silent == []
    export = subcommands(cli.build_parser())["export"].format_help()
    assert "repeat it" in export


@pytest.mark.parametrize("argv, words", [
    (["app", "--port", "99999"], "must be a port number (1-65535), got 99999"),
    (["app", "--port", "http"], "must be a port number"),
    (["plna"], "invalid choice: 'plna'"),
    (["show"], "the following arguments are required: run_id"),
])
def test_a_bad_command_line_is_one_line_and_exit_2(argv, words, tmp_path):
    out = cli_here(*argv, store=tmp_path / "runs.sqlite")
    assert out.returncode == 2 and words in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_busy_port_is_one_line_not_streamlits_traceback(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        out = cli_here("app", "--port", str(port), store=tmp_path / "runs.sqlite")
    assert out.returncode == 2 and out.stderr.strip() == \
        f"error: --port: 127.0.0.1:{port} is in use (another dashboard?): choose another --port"


def test_a_missing_data_dir_is_warned_about(tmp_path):
    RunStore(tmp_path / "runs.sqlite")
    out = cli_here("--data-dir", str(tmp_path / "nope"), "list", store=tmp_path / "runs.sqlite")
    assert out.returncode == 0
    assert out.stderr.startswith("warning: --data-dir:") and "is not a folder" in out.stderr


def test_list_lines_up_every_kind(tmp_path):
    store = RunStore(tmp_path / "runs.sqlite")
    store.create_run({"name": "a"}, kind="train", status="finished", name="short")
    store.create_run({"name": "b"}, kind="one_run", status="cancelled", name="the one-run audit")
    store.create_run({"name": "c"}, kind="audit", status="interrupted", name="an audit")
    out = cli_here("list", store=tmp_path / "runs.sqlite").stdout.splitlines()
    assert len(out) == 4
    # each column starts where its header starts, whatever the width of a kind or a status
    for column in ("algorithm", "status", "progress"):
        start = out[0].index(column)
        assert all(line[start - 1] == " " for line in out[1:]), (column, out)
    names = [line.rstrip()[out[0].index("name"):] for line in out[1:]]
    assert sorted(names) == ["an audit", "short", "the one-run audit"]


def test_show_gives_the_config_a_field_a_line(tmp_path):
    store = RunStore(tmp_path / "runs.sqlite")
    rid = store.create_run({"epochs": 2, "data": {"name": "digits"}}, kind="train", status="finished")
    out = cli_here("show", str(rid), store=tmp_path / "runs.sqlite")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    config = json.loads(text[text.index("config:\n") + len("config:\n"):])
    assert config == store.get_run(rid)["config"]
    assert max(len(line) for line in text.splitlines()) < 120


def test_a_stopped_command_names_its_runs():
    assert cli.stopped_line("terminated", [12]) == \
        "stopped: terminated; run 12 is recorded as cancelled, with what it logged so far"
    assert cli.stopped_line("interrupted", [3, 4]).endswith("runs 3, 4 are recorded as cancelled, with what they "
                                                            "logged so far")
    assert cli.stopped_line("interrupted", None) == "stopped: interrupted"
