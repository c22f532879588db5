"""The product's prose says what the software is and does: no project history ("session 12", "issue 39", "#39")
in README.md, docs/, recipes/, trainer/, operator_cli/ or charts/, comments and docstrings included. Version notes
a user needs (reading a checkpoint 0.3 wrote) are compatibility notes and stay; the research record lives apart."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("README.md", "docs", "recipes", "trainer", "operator_cli", "charts")
TEXT = {".md", ".py", ".yaml", ".yml", ".j2", ".tpl", ".txt", ".json", ".toml", ".sh"}

# "session 3", "sessions 6-9", "issue 39", "issue #39", and a bare "#39" (not "kubeflow/trainer#3828", upstream's
# own tracker a user can follow, nor an HTML entity such as "&#39;").
HISTORY = re.compile(r"\bsessions? \d|\bissue #?\d|(?<![\w/&])#\d+\b", re.IGNORECASE)


def product_files(root: Path = ROOT) -> list[Path]:
    """Every text file of the product's paths under ``root``."""
    files = []
    for name in PRODUCT:
        path = root / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += [
                p for p in sorted(path.rglob("*")) if p.is_file() and p.suffix in TEXT and "__pycache__" not in p.parts
            ]
    return files


def history(root: Path = ROOT) -> list[str]:
    """``path:line: text`` for every line of the product's prose that cites project history."""
    found = []
    for path in product_files(root):
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if HISTORY.search(line):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def test_the_product_prose_cites_no_history():
    found = history()
    assert not found, "say what the code does, not which session or issue it came from:\n" + "\n".join(found)


def test_the_check_sees_each_form(tmp_path):
    """Each form is caught in each kind of file; upstream references and compatibility notes are not."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "trainer" / "sub").mkdir(parents=True)
    (tmp_path / "README.md").write_text("ok\nAs Session 24 found\n")
    (tmp_path / "docs" / "a.md").write_text("sessions 6-9 measured it\nfixed in #39.\n")
    (tmp_path / "trainer" / "sub" / "m.py").write_text('"""Why (issue 39)."""\n# see Issue #4\n')
    (tmp_path / "trainer" / "ok.py").write_text(
        '"""kubeflow/trainer#3828; a checkpoint 0.3 wrote; &#39; an HTTP session cookie"""\n'
    )
    assert [line.split(": ", 1)[0] for line in history(tmp_path)] == [
        "README.md:2",
        "docs/a.md:1",
        "docs/a.md:2",
        "trainer/sub/m.py:1",
        "trainer/sub/m.py:2",
    ]
