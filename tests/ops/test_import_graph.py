"""The shape of the package: no import circle anywhere (module sizes: test_sizes.py).

import-linter checks that the rooms import one way (pyproject.toml), but a
circle inside one room passes its layers. The graph here is grimp's (the
library import-linter reads), with the imports under ``TYPE_CHECKING``
counted: a circle a type checker needs is still a circle a reader walks.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import grimp
import pytest


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return sorted(found)


def describe(graph: grimp.ImportGraph, component: list[str]) -> str:
    """One way round the circle, e.g. ``a -> b -> a``."""
    first, *_ = component
    back = next(m for m in component if m != first)
    there = graph.find_shortest_chain(importer=first, imported=back) or (first, back)
    home = graph.find_shortest_chain(importer=back, imported=first) or (back, first)
    return " -> ".join([*there, *home[1:]])


def test_no_import_circle_in_fairpost() -> None:
    graph = grimp.build_graph("fairpost", include_external_packages=False, cache_dir=None)
    assert "fairpost.mailer.testing.ses_server" in graph.modules  # the graph is the package's
    found = cycles(graph)
    assert not found, "import circles: " + "; ".join(describe(graph, c) for c in found)


def test_a_circle_through_type_checking_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the test above relies on: grimp counts an import under TYPE_CHECKING."""
    package = tmp_path / "circle_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text(
        textwrap.dedent(
            """\
            from typing import TYPE_CHECKING

            if TYPE_CHECKING:
                from circle_probe.server import Server
            """
        )
    )
    (package / "server.py").write_text("from circle_probe.model import *\n")
    (package / "leaf.py").write_text("from circle_probe import server\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    graph = grimp.build_graph("circle_probe", cache_dir=None)

    found = cycles(graph)
    assert found == [["circle_probe.model", "circle_probe.server"]]
    assert describe(graph, found[0]) == "circle_probe.model -> circle_probe.server -> circle_probe.model"
