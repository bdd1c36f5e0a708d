"""The engine's packages and the order their imports go in (each package's ``__init__`` says the same).

    data → config → store → models → dp → train → audit → jobs → figures → tools → cli

A module may import from its own package and from packages to its left, never to its right; no two
modules import each other, directly or round a longer cycle; and every internal import sits at the top of
its module (function-local imports are kept for heavy third-party modules only: torch, pandas, sklearn,
plotly, kaleido, streamlit). Every import is read with ``ast``, function-local ones included.
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from engine.jobs.kinds import JOB_KINDS

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "engine"
LAYERS = ["data", "config", "store", "models", "dp", "train", "audit", "jobs", "figures", "tools", "cli"]


def module_files() -> dict[str, Path]:
    out = {}
    for p in sorted(ENGINE.rglob("*.py")):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = module_files()


def layer(module: str) -> int:
    """The layer of a module: its package's place in LAYERS; the top-level modules (cli, __main__) are the top."""
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS):
        return LAYERS.index(parts[1])
    return len(LAYERS) - 1


def resolve(name: str) -> str | None:
    """The engine module an imported dotted name lives in (``engine.dp.step.dp_step`` → ``engine.dp.step``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def engine_imports(module: str) -> list[tuple[str, int, bool]]:
    """(imported engine module, line, at module top) for every import in ``module``, function-local ones too."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(n) for n in tree.body}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                full = ".".join(base + ([node.module] if node.module else []))
            else:
                full = node.module or ""
            names = [f"{full}.{a.name}" for a in node.names] if full.split(".")[0] == "engine" else []
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "engine"]
        else:
            continue
        for name in names:
            target = resolve(name)
            if target is not None and target != module and not module.startswith(target + "."):
                out.append((target, node.lineno, id(node) in top))
    return out


@functools.cache
def import_graph() -> dict:
    """Each engine module's engine imports (module, line, at top): parsed once, when a test first asks (not at
    collection, which every pytest-xdist worker does)."""
    return {m: engine_imports(m) for m in MODULES}


def test_every_package_names_its_place_in_the_order():
    for pkg in LAYERS[:-1]:
        init = ENGINE / pkg / "__init__.py"
        assert init.is_file(), f"engine/{pkg}/ is not a package"
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert "may import" in doc, f"engine/{pkg}/__init__.py's docstring does not say what the package may import"
        assert " → ".join(LAYERS) in " ".join(doc.split()), f"engine/{pkg}/__init__.py's docstring does not write the order"


def test_imports_only_go_down_the_layers():
    wrong = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {t} ({LAYERS[layer(t)]} is above {LAYERS[layer(m)]})"
             for m, imports in import_graph().items() for t, line, _ in imports if layer(t) > layer(m)]
    assert not wrong, "\n".join(wrong)


# The one internal import kept inside a function, and why: the command line parses first and imports the commands
# that need torch, pandas and the audits only then, so --help, a typo, list and app answer in a fraction of a CPU
# second (issue 60; tests/test_cli_light.py checks that they import no torch).
DEFERRED_IMPORTS = {("engine.cli", "engine.commands")}


def test_internal_imports_sit_at_the_top_of_their_module():
    local = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {t} inside a function"
             for m, imports in import_graph().items() for t, line, at_top in imports
             if not at_top and (m, t) not in DEFERRED_IMPORTS]
    assert not local, "\n".join(local)
    deferred = {(m, t) for m, imports in import_graph().items() for t, _, at_top in imports if not at_top}
    assert deferred == DEFERRED_IMPORTS, "a deferred import that is no longer deferred: take it off the list"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), each a cycle of imports."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    graph = {m: {t for t, _, _ in imports} for m, imports in import_graph().items()}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# A branch on a job kind's name (every kind of the registry, so a new kind is covered) outside the registry:
# ``kind == "audit"``, ``run["kind"] != "train"``, ``job.name == "train"``, ``"audit" == kind``, ``kind in ("train", …)``.
_KIND_NAMES = "|".join(re.escape(name) for name in JOB_KINDS)
KIND_BRANCH = re.compile(rf"""(kind["']?\]?\)?|\.name)\s*[!=]=\s*["']({_KIND_NAMES})["']"""
                         rf"""|["']({_KIND_NAMES})["']\s*[!=]=|kind["']?\]?\)?\s+(not\s+)?in\s+[(\[{{]""")


def kind_branches(root: Path, skip: set[Path]) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        if path in skip:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if KIND_BRANCH.search(line.split("#")[0]):
                out.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    return out


def test_no_branch_on_a_job_kind_outside_the_registry():
    """What differs between job kinds is a field of their ``engine.jobs.kinds.JobKind``, never an if."""
    found = kind_branches(ENGINE, {ENGINE / "jobs" / "kinds.py"})
    for ui in ("app_pages", "pages"):
        if (ROOT / ui).is_dir():
            found += kind_branches(ROOT / ui, set())
    assert not found, "\n".join(found)


def test_the_kind_branch_pattern_finds_branches():
    hits = ['if run["kind"] == "audit":', 'x = a if kind != "train" else b', 'if job.name == "train":',
            'if "audit" == kind:', 'if run.get("kind") in ("train", "audit"):', 'if run["kind"] == "one_run":']
    misses = ['store.list_runs(kind="train")', 'submit(configs, kind="audit")', 'g[g.kind == "mean"]']
    assert all(KIND_BRANCH.search(h) for h in hits)
    assert not any(KIND_BRANCH.search(m) for m in misses)


LIFECYCLE_CALL = re.compile(r"\b(store_lifecycle|RunLifecycle)\(|\.(start_run|finish_run|finish_runs)\(")


def test_a_job_opens_its_lifecycle_in_one_place():
    """Every job — dashboard, CLI, experiments, benches — runs through ``engine.jobs.kinds.execute`` /
    ``run_queued``, the only places a store lifecycle is opened; only the lifecycle starts and finishes rows."""
    allowed = {ENGINE / "jobs" / "kinds.py", ENGINE / "store" / "lifecycle.py", ENGINE / "store" / "db.py"}
    found = []
    for folder in ("engine", "experiments", "bench", "app_pages"):
        for path in sorted((ROOT / folder).rglob("*.py")) if (ROOT / folder).is_dir() else []:
            if path in allowed:
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if LIFECYCLE_CALL.search(line.split("#")[0]):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_two_audits_import_nothing_of_each_other():
    """The audits are packages by concern: engine.audit.pa_alooa and engine.audit.one_run import nothing of each
    other (what both need of a job that trains one RunConfig per algorithm is engine.config.job)."""
    def inside(package):
        return {m for m in MODULES if m == package or m.startswith(package + ".")}

    pa, one = inside("engine.audit.pa_alooa"), inside("engine.audit.one_run")
    assert len(pa) >= 20 and len(one) >= 5, (sorted(pa), sorted(one))
    assert {m for m in MODULES if m.startswith("engine.audit.")} == pa | one  # nothing of the audits outside them
    crossing = [f"{m} imports {t}" for m in pa for t, _, _ in import_graph()[m] if t in one]
    crossing += [f"{m} imports {t}" for m in one for t, _, _ in import_graph()[m] if t in pa]
    assert not crossing, "\n".join(crossing)


# --- the engine's clients: experiments/, bench/ and the pages -------------------------------------------------------
CLIENTS = ("experiments", "bench", "app_pages")


def top_names(module: str) -> set[str]:
    """The names an engine module binds at its top (definitions, assignments, imports; inside a top-level
    ``if`` / ``try`` too), the names its ``__all__`` declares (a package that loads them on first use, PEP 562:
    ``test_every_declared_name_of_a_package_loads`` checks they resolve) and its sub-modules: what ``from module
    import name`` can find."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    names = {m.rpartition(".")[2] for m in MODULES if m.rpartition(".")[0] == module}
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in getattr(node, "targets", [])):
                names.update(ast.literal_eval(node.value))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                     *[s for h in getattr(node, "handlers", []) for s in h.body]]
    return names


def client_imports(path: Path) -> list[tuple[str, str | None, int, bool]]:
    """(engine module, imported name or None, line, at module top) for every engine import of a client file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "engine":
            out += [(node.module, a.name, node.lineno, id(node) in top) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno, id(node) in top) for a in node.names if a.name.split(".")[0] == "engine"]
    return out


def client_files() -> list[Path]:
    return [p for folder in CLIENTS for p in sorted((ROOT / folder).rglob("*.py"))]


def wrong_client_imports(label: str, imports) -> list[str]:
    """What is wrong with a client file's engine imports (``label``: the file, as the messages name it)."""
    wrong = []
    for module, name, line, _ in imports:
        where = f"{label}:{line}"
        if module not in MODULES:
            wrong.append(f"{where} imports {module}: no such engine module")
        elif name is not None and name not in top_names(module):
            wrong.append(f"{where} imports {name} from {module}, which has no such name")
        elif name is not None and name.startswith("_"):
            wrong.append(f"{where} imports {module}.{name}: a module's private name")
    return wrong


def test_every_declared_name_of_a_package_loads():
    """What a package's ``__all__`` declares is there, loaded at once or on first use (engine.data loads its
    torch-backed names lazily so that the store and the command line's light commands start without torch)."""
    import importlib

    for module, path in MODULES.items():
        if path.name != "__init__.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        declared = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)]
        package = importlib.import_module(module)
        for name in (declared[0] if declared else []):
            assert getattr(package, name, None) is not None, f"{module}.__all__ names {name}, which does not load"


def test_the_engines_clients_import_what_the_engine_has():
    """experiments/, bench/ and the pages stand above the engine's top layer (cli): any engine package is below
    them, and what they import of it must be there: a public name of an existing module. A module that moved
    fails here, not hours into an experiment or a bench."""
    files = client_files()
    assert len(files) >= 30
    wrong = [w for p in files for w in wrong_client_imports(str(p.relative_to(ROOT)), client_imports(p))]
    assert not wrong, "\n".join(wrong)


def test_the_client_check_finds_a_moved_module(tmp_path):
    stale = tmp_path / "stale.py"
    stale.write_text("from engine.audit.stats import sample_advantage\nfrom engine.dp.step import dp_step, nothing\n"
                     "from engine.dp.accountants import _RTOL\nfrom engine.audit.pa_alooa.stats import sample_advantage\n"
                     "import engine.dp.nowhere\n")
    assert wrong_client_imports("stale.py", client_imports(stale)) == [
        "stale.py:1 imports engine.audit.stats: no such engine module",
        "stale.py:2 imports nothing from engine.dp.step, which has no such name",
        "stale.py:3 imports engine.dp.accountants._RTOL: a module's private name",
        "stale.py:5 imports engine.dp.nowhere: no such engine module"]


def test_experiments_import_the_engine_at_their_top():
    """An experiment imports the engine at its top, so a broken import stops it before its first run. (Benches
    may import it later, after setting thread counts that must precede torch; pages, to degrade when an optional
    part is missing.)"""
    local = [f"{p.relative_to(ROOT)}:{line} imports {module} inside a function"
             for p in sorted((ROOT / "experiments").rglob("*.py")) for module, _, line, top in client_imports(p)
             if not top]
    assert not local, "\n".join(local)
