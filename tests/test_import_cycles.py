"""No project module takes part in an import circle, imports inside function bodies
counted (a circle hidden in a function still ties the modules together: neither can be
understood, tested or moved without the other). tests/import_graph.py reads the graph with
``ast``; a circle is a strongly connected component of more than one module."""

from __future__ import annotations

from pathlib import Path

from import_graph import a_cycle, cycles, edges

ROOT = Path(__file__).resolve().parents[1]

# Circles kept on purpose, each with why it is not broken (none since NHitsForecaster's
# save/load conveniences went: forecasting.io saves and loads, and only it builds one).
ALLOWED: set[tuple[str, ...]] = set()


def test_no_module_is_in_an_import_circle(report):
    graph = edges(ROOT)
    found = cycles(graph)
    bad = [c for c in found if tuple(c) not in ALLOWED]
    assert not bad, "import circles: " + "; ".join(" -> ".join(a_cycle(graph, c)) for c in bad)
    assert ALLOWED <= {tuple(c) for c in found}, "an allowed circle is gone: drop it from ALLOWED"
    report(
        f"import graph: {len(graph)} modules, {sum(map(len, graph.values()))} edges, "
        f"{len(found)} allowed circle(s): {sorted(ALLOWED)}"
    )


def test_the_graph_sees_imports_in_function_bodies_and_by_name(tmp_path):
    pkg = tmp_path / "autoscaler"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text(
        "import importlib\nMODS = ['autoscaler.a']\ndef load():\n    importlib.import_module(MODS[0])\n"
    )
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n")
    graph = edges(tmp_path)
    assert graph["autoscaler.a"] == {"autoscaler.b"} and graph["autoscaler.b"] == {"autoscaler.a"}
    assert graph["autoscaler.c"] == set()
    assert cycles(graph) == [["autoscaler.a", "autoscaler.b"]]
    assert a_cycle(graph, ["autoscaler.a", "autoscaler.b"]) == ["autoscaler.a", "autoscaler.b", "autoscaler.a"]
