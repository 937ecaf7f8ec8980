"""The project's module import graph, read with ``ast``: every import statement counts,
those inside function bodies too (a circle hidden in a function is still a circle; only
``if TYPE_CHECKING:`` blocks are left out, they never run). Used by test_import_cycles.py."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGES = ("faro_serve", "autoscaler", "forecasting", "deployments")


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the project's packages."""
    out = {}
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def _type_checking(node: ast.AST) -> bool:
    t = node.test if isinstance(node, ast.If) else None
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST):
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _dynamic(tree: ast.AST, mods) -> set[str]:
    """A module that calls ``import_module``/``__import__`` imports the project modules it
    names in string literals (a list of plug-in or command modules): edges too."""
    calls = any(
        isinstance(n, ast.Call)
        and (
            getattr(n.func, "attr", None) == "import_module"
            or getattr(n.func, "id", None) in ("import_module", "__import__")
        )
        for n in ast.walk(tree)
    )
    if not calls:
        return set()
    return {
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in mods
    }


def edges(root: Path) -> dict[str, set[str]]:
    """module -> the project modules it imports (relative imports resolved; ``from pkg
    import name`` points at ``pkg.name`` when that is a module, else at ``pkg``; modules
    named to ``importlib.import_module``)."""
    mods = modules(root)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        graph[mod] |= _dynamic(tree, mods) - {mod}
        for node in _imports(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                while t and t not in mods:  # import a.b.c of a module a.b.c's attribute
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    graph[mod].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
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
    return sorted(out)


def a_cycle(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """One concrete circle through a component, a -> b -> ... -> a, for the message."""
    members, start = set(comp), comp[0]
    path, seen = [start], {start}
    prev = {start: None}
    frontier = [start]
    while frontier:  # breadth-first back to start within the component
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    chain = [v]
                    while prev[chain[-1]] is not None:
                        chain.append(prev[chain[-1]])
                    return list(reversed(chain)) + [start]
                if w not in seen:
                    seen.add(w)
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return path
