"""The docs a newcomer reads stay true: the README stays a five-minute read, the generated references match the
code they are generated from, and every file and link the docs name exists."""
from __future__ import annotations

import re
from pathlib import Path

from engine import reference

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_MAX_LINES = 200
# a backticked name that is a file or folder of the repository (not a config field, a module path or a command)
FILE_NAME = re.compile(r"`([\w./-]+(?:\.py|\.md|\.txt|\.json|/))`")


def test_the_readme_is_a_five_minute_read():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    # the command .ci/run reads from under this heading
    text = "\n".join(lines)
    assert re.search(r"^## Run the tests\n+```bash\npython -m pytest ", text, re.M)


def test_the_generated_references_match_the_code():
    stale = reference.drifted()
    assert stale == [], f"{stale} drifted from the code: run python -m engine.reference --write"


def test_the_cli_reference_holds_every_subcommand_and_flag():
    from engine.cli import build_parser

    text = (DOCS / "CLI.md").read_text(encoding="utf-8")
    for name, sub in reference.subcommands(build_parser()).items():
        assert f"## `privacy-lab {name}`" in text
        for action in sub._actions:  # noqa: SLF001
            for flag in action.option_strings:
                assert flag in text, f"{name} {flag} missing from docs/CLI.md"


def test_the_config_reference_holds_every_field():
    from engine.config.run import RunConfig

    text = (DOCS / "CONFIG.md").read_text(encoding="utf-8")
    for field in ("data.name", "tiers.assign", "algorithm.tail_fraction", "optimizer.lr", "accountant", "delta"):
        assert f"| `{field}` |" in text
    assert RunConfig().to_dict()["batch_size"] == 128 and "| `batch_size` | `int` | `128` |" in text


def test_a_drifted_reference_is_found(tmp_path, monkeypatch):
    """The drift check can fail: a reference whose generated part lost a line is named."""
    for name in reference.GENERATED:
        text = (DOCS / name).read_text(encoding="utf-8")
        (tmp_path / name).write_text(text.replace("\n## ", "\n## x", 1) if name == "CLI.md" else text, encoding="utf-8")
    monkeypatch.setattr(reference, "DOCS", tmp_path)
    assert reference.drifted() == ["CLI.md"]


def _architecture_rows() -> list[tuple[str, str]]:
    rows = []
    for line in (DOCS / "ARCHITECTURE.md").read_text(encoding="utf-8").splitlines():
        cells = line.split(" | ")
        if line.startswith("| `") and len(cells) >= 2:
            rows.append((cells[0], line))
    return rows


def _named_file_exists(name: str, bases: list[Path]) -> bool:
    """A name the architecture gives exists from the repository's root, in one of its row's folders, or (a bare
    file name) somewhere below one of them."""
    if (ROOT / name).exists() or any((b / name).exists() for b in bases):
        return True
    return "/" not in name.rstrip("/") and any(next(b.rglob(name.rstrip("/")), None) is not None for b in bases)


def test_every_file_the_architecture_names_exists():
    rows = _architecture_rows()
    assert len(rows) >= 15
    missing = []
    for first, line in rows:
        named = [ROOT / p for p in re.findall(r"`([\w./-]+)`", first) if (ROOT / p).exists()]
        bases = [p if p.is_dir() else p.parent for p in named] or [ROOT]
        for name in FILE_NAME.findall(line):
            if not _named_file_exists(name, bases):
                missing.append(f"{name} (row {first.strip('| `')})")
    assert missing == [], f"docs/ARCHITECTURE.md names files that do not exist: {missing}"


def test_the_architecture_check_can_fail():
    """A bare file name that moved away from its row's folder (engine/audit/config.py, once) is not found."""
    assert not _named_file_exists("engine/audit/config.py", [ROOT])
    assert not _named_file_exists("no_such_module.py", [ROOT / "engine/audit"])
    assert _named_file_exists("config.py", [ROOT / "engine/audit"])  # below it: pa_alooa/config.py


def test_every_relative_link_in_the_docs_resolves():
    broken = []
    for doc in [ROOT / "README.md", *DOCS.glob("*.md"), ROOT / "bench" / "README.md"]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)} → {target}")
    assert broken == []
