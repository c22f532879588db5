"""The code's shape, checked: no import cycle among the modules of the trainer and of the CLI (counting imports
inside functions and under ``if TYPE_CHECKING:``), no module over 450 lines, no function over 80 (issue
33). Read with ``ast`` alone: nothing is imported, so this runs in a second."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80
CHECKED = ("trainer", "operator_cli")


def _modules(package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package``."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def module_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``name`` imports, anywhere in it: an import deferred into a function is
    still a dependency (``trainer/cli.py`` imported ``rounds.py`` in ``main``, ``rounds.py`` -> ``train.py`` ->
    ``cli.py`` at the top: a cycle that held only by import order), and so is one under ``if TYPE_CHECKING:``
    (``spec`` <-> ``kube/kinds`` <-> ``podplan`` was closed by type hints alone: the modules still depend on
    each other, and a hint is one refactor away from an import). ``from pkg import mod`` counts as importing
    ``pkg.mod``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in found if m in known and m != name}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle of ``graph`` found by a depth-first walk, each as the path that closes it.

    >>> import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    [['a', 'b', 'c', 'a']]
    >>> import_cycles({"a": {"b"}, "b": set()})
    []
    """
    cycles, done, path = [], set(), []

    def walk(node: str) -> None:
        if node in path:
            cycles.append(path[path.index(node) :] + [node])
            return
        if node in done:
            return
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            walk(nxt)
        path.pop()
        done.add(node)

    for node in sorted(graph):
        walk(node)
    return cycles


def _graph(package: str) -> dict[str, set[str]]:
    modules = _modules(package)
    return {name: module_imports(name, path, set(modules)) for name, path in modules.items()}


def test_the_walk_finds_a_planted_cycle(tmp_path):
    """The checker itself can fail: a cycle closed by an import inside a function is found too."""
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("from c import x\n")
    (tmp_path / "c.py").write_text("def f():\n    from a import y\n")
    (tmp_path / "d.py").write_text("import a\n")
    known = {"a", "b", "c", "d"}
    graph = {n: module_imports(n, tmp_path / f"{n}.py", known) for n in known}
    assert graph == {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c", "a"]]


def test_type_checking_imports_are_dependencies_too(tmp_path):
    """An import a type checker alone reads closes a cycle as any other does, in its ``if`` or its ``else``."""
    (tmp_path / "a.py").write_text("from b import x\n")
    (tmp_path / "b.py").write_text(
        "import typing\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from a import Hint\n"
        "if typing.TYPE_CHECKING:\n    import c\nelse:\n    import d\n"
    )
    known = {"a", "b", "c", "d"}
    graph = {n: module_imports(n, tmp_path / f"{n}.py", known) for n in ("a", "b")}
    assert graph == {"a": {"b"}, "b": {"a", "c", "d"}}
    assert import_cycles(graph) == [["a", "b", "a"]]


def test_the_protocols_that_cut_the_loop_are_met():
    """``operator_cli/jobshape.py`` stands for the specs in the kinds' hints: each names fields the spec has."""
    from operator_cli.jobshape import JobShape, SweepShape
    from operator_cli.spec import JobSpec
    from operator_cli.tune.spec import SweepSpec

    for protocol, spec in ((JobShape, JobSpec), (SweepShape, SweepSpec)):
        members = {n for n in vars(protocol) if not n.startswith("_")}
        assert members and all(hasattr(spec, n) or n in spec.__dataclass_fields__ for n in members), protocol


@pytest.mark.parametrize("package", CHECKED)
def test_no_import_cycle(package):
    assert import_cycles(_graph(package)) == []


def _too_long(package: str) -> list[str]:
    long = []
    for name, path in _modules(package).items():
        text = path.read_text()
        if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
            long.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1  # decorators not counted; the docstring is
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {length} lines")
    return long


@pytest.mark.parametrize("package", CHECKED)
def test_modules_and_functions_are_short(package):
    assert _too_long(package) == [], f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function"


def test_doctests():
    import doctest
    import sys

    assert doctest.testmod(sys.modules[__name__]).failed == 0
