"""The code's shape, checked: no import cycle among the modules of the trainer and of the CLI (counting imports
inside functions and under ``if TYPE_CHECKING:``), no module over 450 lines, no function over 80 (issue
33), both measured as ``ruff format`` writes the code once every ``# fmt: skip`` is gone (issue 44: a limit met
by hand-packed lines hides the second concept it exists to show), and at most 5 ``# fmt: skip``, each with its
reason beside it. Read with ``ast`` and one ``ruff format`` of a copy: nothing is imported, so this runs in
seconds."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80
CHECKED = ("trainer", "operator_cli")
MAX_FMT_SKIPS = 5  # in CHECKED, each as ``# fmt: skip # <why the formatter's layout is worse here>``
FMT_SKIP = re.compile(r"\s*# fmt: skip\b(?:\s*#\s*(?P<why>.*))?$")
# Modules another branch of issue 44 splits or unpacks (its owner alone edits them): each must still need it,
# so that the entry goes when the module is fixed.
PENDING = {
    "operator_cli.commands.job": "i44a: the runtime workflow",
    "operator_cli.doctor": "i44a: the runtime workflow",
    "operator_cli.kube.fetch": "i43: fetch",
    "operator_cli.options": "i43: the option table",
}


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


def _ruff() -> str:
    """The ruff of this interpreter's environment (a test extra), else the one on PATH."""
    here = Path(sys.executable).with_name("ruff")
    return str(here) if here.is_file() else shutil.which("ruff") or "ruff"


def formatted(paths: dict[str, Path]) -> dict[str, str]:
    """Each module's text as ``ruff format`` (the project's settings) writes it once every ``# fmt: skip``
    is removed: the length the code has when no line is packed by hand. One ruff run over a copy."""
    with tempfile.TemporaryDirectory() as tmp:
        copies = {name: Path(tmp) / f"{name}.py" for name in paths}
        for name, path in paths.items():
            lines = (FMT_SKIP.sub("", line) for line in path.read_text().splitlines())
            copies[name].write_text("\n".join(lines) + "\n")
        config = ROOT / "pyproject.toml"
        subprocess.run([_ruff(), "format", "-q", "--config", str(config), tmp], check=True, capture_output=True)
        return {name: copy.read_text() for name, copy in copies.items()}


def too_long(texts: dict[str, str]) -> list[str]:
    """The modules over MAX_MODULE_LINES and the functions over MAX_FUNCTION_LINES among ``texts``."""
    long = []
    for name, text in texts.items():
        if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
            long.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1  # decorators not counted; the docstring is
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {length} lines")
    return long


def fmt_skips(paths: dict[str, Path]) -> list[tuple[str, int, str]]:
    """Every ``# fmt: skip`` of ``paths``: (module, line, the reason written beside it, or "")."""
    found = []
    for name, path in paths.items():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if match := FMT_SKIP.search(line):
                found.append((name, n, (match["why"] or "").strip()))
    return found


def _checked() -> dict[str, Path]:
    return {name: path for package in CHECKED for name, path in _modules(package).items()}


def test_lengths_are_measured_unpacked(tmp_path):
    """The measure can fail: a call packed onto one line by ``# fmt: skip`` counts the lines the formatter
    gives it, and a marker with no reason is found as such."""
    args = ", ".join(f"argument_number_{i}" for i in range(12))
    packed = tmp_path / "packed.py"
    packed.write_text(f"call({args})  # fmt: skip\nx = [1,2]  # fmt: skip # a table\n")
    assert len(formatted({"packed": packed})["packed"].splitlines()) == 2 + 12 + 1
    assert fmt_skips({"packed": packed}) == [("packed", 1, ""), ("packed", 2, "a table")]
    texts = {"long": "\n".join(f"x{i} = {i}" for i in range(MAX_MODULE_LINES + 1)) + "\n"}
    assert too_long(texts) == [f"long: {MAX_MODULE_LINES + 1} lines"]


@pytest.mark.parametrize("package", CHECKED)
def test_modules_and_functions_are_short(package):
    texts = formatted({n: p for n, p in _modules(package).items() if n not in PENDING})
    assert too_long(texts) == [], f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function"


def test_fmt_skip_is_rare_and_says_why():
    found = [s for s in fmt_skips(_checked()) if s[0] not in PENDING]
    assert [f"{m}:{n}" for m, n, why in found if not why] == [], "give each `# fmt: skip` a `# why` beside it"
    assert len(found) <= MAX_FMT_SKIPS, found


def test_pending_modules_still_need_their_fix():
    """An entry of PENDING goes once its module is short and unpacked: the test says which to remove."""
    paths = {n: p for n, p in _checked().items() if n in PENDING}
    assert set(paths) == set(PENDING), "a PENDING module no longer exists"
    texts = formatted(paths)
    need = {m for m, _, why in fmt_skips(paths) if not why} | {n for n in texts if too_long({n: texts[n]})}
    assert set(PENDING) - need == set(), "remove these from PENDING in tests/test_layout.py: fixed"


def test_imports_between_test_modules(tmp_path):
    """A test module imports shared helpers from ``tests/helpers/`` (or takes a fixture from conftest), never
    from another test module: 7 files once imported 9 private helpers from each other (issue 44)."""
    (tmp_path / "test_a.py").write_text("def f():\n    from tests.test_b import _helper\n")
    (tmp_path / "test_c.py").write_text("from tests.helpers.chart import CHART\nimport tests.test_b\n")
    assert imports_of_test_modules(tmp_path) == ["test_a.py: tests.test_b", "test_c.py: tests.test_b"]
    assert imports_of_test_modules(ROOT / "tests") == []


def imports_of_test_modules(tests: Path) -> list[str]:
    """``file: module`` for each import of a ``tests.test_*`` module (or a relative ``.test_*``) under ``tests``."""
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")]
            found += [f"{path.relative_to(tests)}: {n}" for n in names if re.match(r"(tests)?\.test_", n)]
    return found
