"""The code's shape, checked: no import cycle among the modules of the trainer and of the CLI (counting imports
inside functions and under ``if TYPE_CHECKING:``, and the package ``__init__`` each import runs first), every
module of the CLI and every torch-free module of the trainer importable first in a fresh interpreter, no module
over 450 lines, no function over 80, both measured as ``ruff format`` writes the code once every ``# fmt: skip``
is gone (a limit met by hand-packed lines hides the second concept it exists to show), and at most 5
``# fmt: skip``, each with its reason beside it. Read with ``ast`` and one ``ruff format`` of a copy; only the
fresh-interpreter check imports, one interpreter per module."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80
CHECKED = ("trainer", "operator_cli")
MAX_FMT_SKIPS = 5  # in CHECKED, each as ``# fmt: skip # <why the formatter's layout is worse here>``
FMT_SKIP = re.compile(r"\s*# fmt: skip\b(?:\s*#\s*(?P<why>.*))?$")


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


def with_package_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` with the imports Python makes on its own: importing ``a.b.c`` first runs ``a/__init__.py``
    and ``a/b/__init__.py``, so an edge to a module is also an edge to each package of ``graph`` above it,
    except the packages above the importer itself (they ran before it did). ``operator_cli.render`` ->
    ``operator_cli.kube.kinds`` once closed a loop through ``operator_cli/kube/__init__.py``, which imported
    ``cluster`` and through it ``render``, and a graph of the ``import`` lines alone did not show it.

    >>> graph = {"r": {"k.kinds"}, "k": {"k.cluster"}, "k.cluster": {"r", "k.kinds"}, "k.kinds": set()}
    >>> graph = with_package_edges(graph)
    >>> sorted(graph["r"]), sorted(graph["k.cluster"])  # render reaches k's __init__; k.cluster is inside k
    (['k', 'k.kinds'], ['k.kinds', 'r'])
    >>> import_cycles(graph)
    [['k', 'k.cluster', 'r', 'k']]
    """
    out = {}
    for name, targets in graph.items():
        edges = set(targets)
        for target in targets:
            parts = target.split(".")
            for n in range(1, len(parts)):
                package = ".".join(parts[:n])
                if package in graph and package != name and not name.startswith(package + "."):
                    edges.add(package)
        out[name] = edges
    return out


def _graph(package: str) -> dict[str, set[str]]:
    modules = _modules(package)
    return with_package_edges({name: module_imports(name, path, set(modules)) for name, path in modules.items()})


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


def _bound_at_top(tree: ast.Module) -> set[str]:
    """The names a module binds when it loads (definitions, assignments, imports), not through ``__getattr__``."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        else:
            names.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
    return names


def through_lazy_faces(modules: dict[str, Path]) -> list[str]:
    """``module: package.name`` for each name a module of ``modules`` takes from a package face that hands it
    out through ``__getattr__``: the face imports nothing, so the graph would not see the module that defines
    the name. The project's own modules import from that module; the lazy face is for library users."""
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in modules.items()}
    lazy = {
        name: _bound_at_top(tree)
        for name, tree in trees.items()
        if modules[name].name == "__init__.py" and "__getattr__" in _bound_at_top(tree)
    }
    found = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in lazy and node.module != name:
                for alias in node.names:
                    if f"{node.module}.{alias.name}" not in modules and alias.name not in lazy[node.module]:
                        found.append(f"{name}: {node.module}.{alias.name}")
    return found


def test_the_project_imports_past_its_lazy_faces(tmp_path):
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "__init__.py").write_text("X = 1\ndef __getattr__(name):\n    import k.c\n    return k.c.C\n")
    (tmp_path / "k" / "c.py").write_text("C = 1\n")
    (tmp_path / "r.py").write_text("from k import C, X, c\nfrom k.c import C\n")
    paths = {"k": tmp_path / "k" / "__init__.py", "k.c": tmp_path / "k" / "c.py", "r": tmp_path / "r.py"}
    assert through_lazy_faces(paths) == ["r: k.C"]
    assert through_lazy_faces(_checked()) == []


# Libraries that load torch when imported: a module whose import reaches one is not torch-free.
TORCH = ("torch", "transformers", "sentence_transformers", "pylate", "accelerate", "safetensors.torch")


def _loads_torch(module: str) -> bool:
    return any(module == t or module.startswith(t + ".") for t in TORCH)  # torch.nn, not torchx


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def load_time_imports(body: list[ast.stmt]) -> set[str]:
    """The modules a module imports when it loads: its imports at the top, in ``if``, ``try``, ``with`` and
    class bodies too; not those inside functions, nor those only a type checker reads.

    >>> code = "import a\\nif TYPE_CHECKING:\\n    import b\\nelse:\\n    from c import d\\ndef f():\\n    import e"
    >>> sorted(load_time_imports(ast.parse(code).body))
    ['a', 'c', 'c.d']
    """
    found: set[str] = set()
    for node in body:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.If):
            found |= load_time_imports(node.orelse if _is_type_checking(node.test) else node.body + node.orelse)
        elif isinstance(node, ast.Try):
            handlers = [s for h in node.handlers for s in h.body]
            found |= load_time_imports(node.body + handlers + node.orelse + node.finalbody)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            found |= load_time_imports(node.body)
    return found


def torch_free(modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that load no torch when imported first: neither they, the packages above
    them, nor anything those import when they load reaches a library of ``TORCH``."""
    direct = {name: load_time_imports(ast.parse(path.read_text(), str(path)).body) for name, path in modules.items()}
    graph = with_package_edges({name: {m for m in found if m in modules} for name, found in direct.items()})
    heavy = {
        name for name, found in direct.items() if any(m == t or m.startswith(t + ".") for m in found for t in TORCH)
    }
    free = set()
    for name in modules:
        parts = name.split(".")
        seen, todo = set(), [".".join(parts[:n]) for n in range(1, len(parts) + 1)]
        while todo:
            if (module := todo.pop()) in modules and module not in seen:
                seen.add(module)
                todo.extend(graph[module])
        if not seen & heavy:
            free.add(name)
    return free


def import_alone(module: str) -> str | None:
    """Import ``module`` first, in a fresh interpreter: None if it imports, else the error's last line (or
    what it loaded that it should not have)."""
    probe = "import importlib, sys; importlib.import_module(sys.argv[1]); print('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", probe, module], cwd=ROOT, capture_output=True, text=True)
    if run.returncode != 0:
        return (run.stderr.strip().splitlines() or [f"exit {run.returncode}"])[-1]
    return "loaded torch: add the library that loads it to TORCH" if run.stdout.strip() == "True" else None


def test_the_static_torch_check_follows_package_faces(tmp_path):
    """A module is as heavy as the package face above it: ``p/light.py`` imports nothing, but ``p/__init__.py``
    imports torch, so importing ``p.light`` first loads torch."""
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "__init__.py").write_text("import torch\n")
    (tmp_path / "p" / "light.py").write_text("def f():\n    import torch\n")
    (tmp_path / "q.py").write_text("from p import light\n")
    (tmp_path / "r.py").write_text("import json\n")
    paths = {"p": tmp_path / "p" / "__init__.py", "p.light": tmp_path / "p" / "light.py"}
    paths |= {"q": tmp_path / "q.py", "r": tmp_path / "r.py"}
    assert torch_free(paths) == {"r"}


@pytest.mark.parametrize("package", CHECKED)
def test_every_module_imports_alone(package):
    """Each module of the CLI and each torch-free module of the trainer imports when it is the first import of
    a fresh interpreter, as a library user's script meets it (the suite's own imports hide an import loop
    that only one entry point closes). ``__main__`` modules are left out: importing one runs the program.
    One interpreter per module, as many at a time as there are cores."""
    modules = {name: path for name, path in _modules(package).items() if not name.endswith("__main__")}
    chosen = sorted(modules if package == "operator_cli" else torch_free(modules))
    assert len(chosen) > 20, chosen  # the choice itself can go wrong
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        errors = dict(zip(chosen, pool.map(import_alone, chosen)))
    assert {m: e for m, e in errors.items() if e} == {}


# Trainer modules that report a bad config, a bad data row or a model's kind before any model is built: they
# must stay torch-free, so that the fresh-interpreter check above keeps choosing (and importing) them.
LIGHT = ("trainer.cli", "trainer.config", "trainer.data", "trainer.data.rows", "trainer.evaluate")
LIGHT += ("trainer.baseline", "trainer.model_kind")


def test_the_light_trainer_modules_stay_torch_free():
    assert sorted(set(LIGHT) - torch_free(_modules("trainer"))) == []


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
    texts = formatted(_modules(package))
    assert too_long(texts) == [], f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function"


def test_fmt_skip_is_rare_and_says_why():
    found = fmt_skips(_checked())
    assert [f"{m}:{n}" for m, n, why in found if not why] == [], "give each `# fmt: skip` a `# why` beside it"
    assert len(found) <= MAX_FMT_SKIPS, found


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
