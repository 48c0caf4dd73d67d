"""The import graph runs one way: specs -> clusters -> cost_model | kernels -> trials -> tuner
(the CLI at the top). `lint-imports` (pyproject `[tool.importlinter]`) checks the layers in CI;
this test reads every import statement with `ast`, function-local ones included (import-linter
sees those too, but this test also fails on module cycles inside one package)."""
from __future__ import annotations

import ast
import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("specs", "clusters", "cost_model", "kernels", "trials", "tuner")
# Lower index = lower layer. cost_model and kernels share a layer and must not import each other.
LAYER = {"specs": 0, "clusters": 1, "cost_model": 2, "kernels": 2, "trials": 3, "tuner": 4}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            out[_module_name(f)] = f
    return out


def _resolve(name: str, modules: dict) -> str | None:
    """The project module an import names (the longest prefix that is a module)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and getattr(node.test, "id", "") == "TYPE_CHECKING" for n in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            for n in names:
                target = _resolve(n, modules)
                # a package's own __init__ is reached implicitly by its submodules: not an edge
                if target and target != mod and not mod.startswith(target + "."):
                    graph[mod].add(target)
    return graph


def _sccs(graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
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
            out.append(comp)

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_package_imports_upward():
    bad = []
    for mod, targets in import_graph().items():
        a = mod.split(".")[0]
        for t in targets:
            b = t.split(".")[0]
            if a != b and LAYER[b] >= LAYER[a]:
                bad.append(f"{mod} -> {t}")
    assert not bad, "imports against the layering:\n" + "\n".join(sorted(bad))


def test_no_module_cycles():
    cycles = [sorted(c) for c in _sccs(import_graph()) if len(c) > 1]
    assert not cycles, f"module import cycles: {cycles}"


def test_library_code_never_imports_the_cli():
    bad = [f"{m} -> {t}" for m, ts in import_graph().items() for t in ts
           if not m.startswith(("tuner.cli", "tuner.commands")) and t.startswith(("tuner.cli", "tuner.commands"))]
    assert not bad, bad


def test_no_code_reads_outside_the_repository():
    """Nothing under the packages, tests or bench names the shared folder beside the checkout."""
    sibling = ROOT.parent / "shared"  # derived here, so this file names no machine path itself
    needles = (os.path.join(os.pardir, sibling.name), str(sibling))
    files = [f for d in PACKAGES + ("tests", "bench", "docs") for f in (ROOT / d).rglob("*")
             if f.is_file() and f.suffix in (".py", ".md", ".sh", ".json", ".yaml")] + [ROOT / "README.md"]
    hits = [f"{f.relative_to(ROOT)}: {n}" for f in files for n in needles if n in f.read_text(errors="ignore")]
    # committed results carry no machine paths (a temporary folder, a home, this checkout's location)
    machine = {str(ROOT.parent), tempfile.gettempdir(), str(Path.home())}
    hits += [f"{f.relative_to(ROOT)}: machine path" for f in (ROOT / "bench" / "results").rglob("*")
             if f.is_file() and f.suffix in (".md", ".json", ".csv")
             and any(m + "/" in f.read_text(errors="ignore") for m in machine)]
    assert not hits, hits


# Inside tuner/, the plan's path (pyproject's third import-linter contract says the same): a module
# imports only from its own stage or the stages below it.
TUNER_STAGE = {"conventions": 0, "space": 1, "emit": 2, "rank": 3, "design": 3, "study": 4, "commands": 5, "cli": 6}


def test_tuner_stages_import_downward_only():
    bad = []
    for mod, targets in import_graph().items():
        if not mod.startswith("tuner."):
            continue
        a = mod.split(".")[1]
        for t in targets:
            if not t.startswith("tuner.") or t.split(".")[1] == a:
                continue
            b = t.split(".")[1]
            if TUNER_STAGE[b] >= TUNER_STAGE[a]:
                bad.append(f"{mod} -> {t}")
    assert not bad, "tuner stages imported upward or sideways:\n" + "\n".join(sorted(bad))
    assert {p.name for p in (ROOT / "tuner").iterdir() if p.is_dir() and (p / "__init__.py").exists()} \
        | {p.stem for p in (ROOT / "tuner").glob("*.py") if p.stem != "__init__"} == set(TUNER_STAGE)


CLI_CALLS = {"print", "add_argument", "add_argument_group", "add_mutually_exclusive_group", "add_parser",
             "add_subparsers", "ArgumentParser"}


def cli_calls(tree) -> list[str]:
    """Calls that parse flags or print, by name (`print(...)`, `p.add_argument(...)`,
    `sys.stdout.write(...)`)."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        if name in CLI_CALLS:
            out.append(f"{name}:{node.lineno}")
        elif name == "write" and isinstance(f.value, ast.Attribute) and f.value.attr in ("stdout", "stderr"):
            out.append(f"{f.value.attr}.write:{node.lineno}")
    return out


def test_only_the_cli_parses_flags_or_prints():
    bad = []
    for f in sorted((ROOT / "tuner").rglob("*.py")):
        rel = f.relative_to(ROOT).as_posix()
        if rel == "tuner/cli.py" or rel.startswith("tuner/commands/"):
            continue
        bad += [f"{rel}: {c}" for c in cli_calls(ast.parse(f.read_text()))]
    assert not bad, "flags or prints outside tuner/commands:\n" + "\n".join(bad)


def test_the_flags_and_prints_check_can_fail():
    assert cli_calls(ast.parse("import sys\nprint(1)\np.add_argument('--x')\nsys.stdout.write('y')\n")) == [
        "print:2", "add_argument:3", "stdout.write:4"]
