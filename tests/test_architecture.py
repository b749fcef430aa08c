"""The structure issue 9 asks for, checked: the core never names a target (each target's
knowledge lives in its backend folder, its templates and its target file), and no module
imports, directly or through others, a module that imports it back."""

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
def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Every mlagen module this one imports, at the top or inside functions (they run on
    every call); ``if TYPE_CHECKING:`` blocks never run and are left out."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
            and _is_type_checking(node) for b in node.body for n in ast.walk(b)}
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
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


def test_core_reaches_backends_only_through_the_registry():
    """Outside mlagen/backends/, nothing imports a backend's modules: the registry
    (mlagen.backends) hands out backend objects."""
    graph = _graph()
    bad = [(m, d) for m, deps in graph.items() if not m.startswith("mlagen.backends")
           for d in deps if d.startswith("mlagen.backends.")]
    assert not bad, bad
