"""The structure, checked: the core never names a target (each target's knowledge lives in
its backend folder, its templates and its target file), and no module imports, directly or
through others, a module that imports it back: every import statement counts, at the top,
inside functions and under ``if TYPE_CHECKING:`` alike."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mlagen.backends import all_backends, kinds

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "mlagen"


def _target_names() -> dict[str, set[str]]:
    """kind -> the words that name it: the kind and its description files' stems."""
    names = {k: {k} for k in kinds()}
    for b in all_backends():
        names[b.kind].add(Path(b.target_file).stem)
    return names


def test_every_target_has_a_backend_folder_templates_and_a_target_file():
    for b in all_backends():
        assert (PKG / "backends" / b.kind / "backend.py").is_file()
        assert (ROOT / "templates" / b.kind).is_dir()
        assert (ROOT / "targets" / b.target_file).is_file()


def test_no_target_name_outside_its_backend_folder():
    """grep: no kind (nor its description file's name) in any module outside
    mlagen/backends/<kind>/, comments and docstrings included."""
    names = _target_names()
    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        own = rel.parts[1] if rel.parts[0] == "backends" and len(rel.parts) > 2 else None
        text = path.read_text()
        for kind, words in names.items():
            if kind == own:
                continue
            for word in words:
                for m in re.finditer(rf"(?i)\b{re.escape(word)}\b", text):
                    line = text.count("\n", 0, m.start()) + 1
                    found.append(f"mlagen/{rel}:{line}: {word}")
    assert not found, "target named outside its backend folder:\n" + "\n".join(found)


def test_the_check_finds_a_planted_name(tmp_path):
    """The grep above is not vacuous: the pattern matches a name the way code spells it."""
    kind = kinds()[0]
    assert re.search(rf"(?i)\b{kind}\b", f'if schedule.target.name == "{kind.upper()}":')


# ---------------------------------------------------------------- import cycles ----
def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, modules: set[str], root: Path = ROOT) -> set[str]:
    """Every mlagen module this one imports, wherever the statement stands: at the top,
    inside functions (they run on the call) or under ``if TYPE_CHECKING:`` (a reader, and
    a type checker, follows those too)."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:       # `import a.b.c` of a non-module attribute
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _graph() -> dict[str, set[str]]:
    paths = sorted(PKG.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    return {_module_name(p): _imports(p, modules) for p in paths}


def test_no_import_cycle():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_cycle_finder_sees_a_cycle_through_a_function_level_import():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(g) == [["a", "b", "c"]]
    graph = _graph()
    assert "mlagen.backends" in graph["mlagen.schedule.parse"]     # edges are found
    # a function-level import and one under TYPE_CHECKING are edges too
    assert "mlagen.errors" in graph["mlagen.backends.base"]
    assert "mlagen.schedule.plan" in graph["mlagen.backends.base"]


def test_imports_inside_functions_and_type_checking_blocks_are_found(tmp_path):
    pkg = tmp_path / "mlagen"
    pkg.mkdir()
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from . import b\n\ndef f():\n    from .c import x\n")
    modules = {"mlagen", "mlagen.a", "mlagen.b", "mlagen.c"}
    assert _imports(pkg / "a.py", modules, tmp_path) == {"mlagen.b", "mlagen.c"}


# The schedule's records, its resource counts, the checked plan and the target descriptions
# sit below every backend (which subclasses or takes them); they never reach for the
# registry.  A backend is looked up by the checker (rules.check, parse) and then taken from
# the plan.
BELOW_THE_BACKENDS = ("mlagen.schedule.records", "mlagen.schedule.resources",
                      "mlagen.schedule.plan", "mlagen.schedule.located", "mlagen.targets")


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for d in graph[todo.pop()]:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


def test_the_schedule_records_plan_and_targets_do_not_reach_the_backends():
    graph = _graph()
    bad = {m: sorted(d for d in _reach(graph, m) if d.startswith("mlagen.backends"))
           for m in BELOW_THE_BACKENDS}
    assert not any(bad.values()), bad


def test_core_reaches_backends_only_through_the_registry():
    """Outside mlagen/backends/, nothing imports a backend's modules: the registry
    (mlagen.backends) hands out backend objects."""
    graph = _graph()
    bad = [(m, d) for m, deps in graph.items() if not m.startswith("mlagen.backends")
           for d in deps if d.startswith("mlagen.backends.")]
    assert not bad, bad
