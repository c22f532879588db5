"""README.md and docs/ as a newcomer meets them: a page, not a reference; its command table and code map are the
CLI's and the tree's; every relative link lands; the image tag is the release's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS, ROOT / "recipes" / "README.md"]
ROOMS = ("operator_cli", "trainer")  # the packages whose rooms the code map names

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose(text: str) -> str:
    """The text without code blocks and inline code, where a bracket is not a link."""
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def _section(text: str, heading: str) -> str:
    """The body under the level-2 heading ``heading``, up to the next level-2 heading."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"README.md has no '## {heading}' section"
    return match.group(1)


def _table(body: str, header: str) -> list[list[str]]:
    """The rows (cells stripped) of the markdown table whose header row starts with ``header``."""
    lines = body.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(header)), None)
    assert start is not None, f"no table headed {header!r}"
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens.

    >>> slug("Get the model without object storage: `fetch`")
    'get-the-model-without-object-storage-fetch'
    >>> slug("The `serve` extra and `.venv-serve`")
    'the-serve-extra-and-venv-serve'
    """
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    out = set()
    for line in _FENCE.sub("", path.read_text()).splitlines():
        match = re.match(r"^#{1,6} (.+?)\s*#*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def broken_links(page: Path) -> list[str]:
    """Relative links of ``page`` whose file is missing, or whose ``#anchor`` is no heading of a markdown target."""
    broken = []
    for target in _LINK.findall(_prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            where = dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest.name
            broken.append(f"{target} (no heading with that anchor in {where})")
    return broken


def help_commands() -> set[str]:
    """The commands `colbert-k8s --help` lists."""
    from operator_cli.cli import cli

    result = CliRunner().invoke(cli, ["--help"], prog_name="colbert-k8s")
    assert result.exit_code == 0, result.output
    names = set(re.findall(r"^  ([a-z][a-z-]*)(?:\s{2,}|$)", result.output, re.M))
    assert names == set(cli.commands), "help lists other commands than the group has"
    return names


def code_map_paths(text: str) -> list[str]:
    """Every path the README's code map names, a bare file name read beside the cell's last full path."""
    paths = []
    for row in _table(_section(text, "Development"), "| where | what |"):
        base = ""
        for token in re.findall(r"`([^`]+)`", row[0]):
            if "/" in token:
                paths.append(token)
                base = token if token.endswith("/") else token.rsplit("/", 1)[0] + "/"
            else:
                paths.append(base + token)
    return paths


def rooms() -> set[str]:
    """The top-level rooms (folders) of the packages, as ``package/room/``."""
    return {
        f"{package}/{d.name}/"
        for package in ROOMS
        for d in (ROOT / package).iterdir()
        if d.is_dir() and not d.name.startswith((".", "__"))
    }


def test_readme_is_a_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 150, f"README.md has {len(text.splitlines())} lines: move reference to docs/"
    assert len(text) <= 10_500, f"README.md has {len(text)} characters: move reference to docs/"


def test_the_two_commands_come_first():
    """The first code block is the two commands a fresh machine runs, exactly."""
    block = re.search(r"^```bash\n(.*?)^```", README.read_text(), re.S | re.M).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    assert commands == ["bash scripts/quickstart.sh", "bash scripts/test.sh"]
    for script in ("scripts/quickstart.sh", "scripts/test.sh"):
        assert (ROOT / script).is_file()


def test_the_quickstart_table_is_one_generated_block():
    text = README.read_text()
    assert text.count("<!-- results:quickstart -->") == 1 and text.count("<!-- /results:quickstart -->") == 1
    block = text.split("<!-- results:quickstart -->")[1].split("<!-- /results:quickstart -->")[0]
    assert re.search(r"^\| .*nDCG@10", block, re.M), "the block holds the quickstart's result table"


def test_command_table_is_the_clis():
    """Every command `colbert-k8s --help` lists is in README's command table, and nothing else is."""
    rows = _table(_section(README.read_text(), "Commands"), "| task |")
    named = [c for row in rows for c in re.findall(r"`([a-z][a-z-]*)`", row[1])]
    assert len(named) == len(set(named)), f"a command is listed twice: {named}"
    cli = help_commands()
    assert not cli - set(named), f"README's command table lacks {sorted(cli - set(named))}"
    assert not set(named) - cli, f"README's command table names {sorted(set(named) - cli)}, which the CLI lacks"


def test_code_map_is_the_tree():
    """The code map names every room of operator_cli/ and trainer/, and every path it names exists."""
    paths = code_map_paths(README.read_text())
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"README's code map names paths that do not exist: {missing}"
    named = {p for p in paths if p.endswith("/") and p.split("/")[0] in ROOMS and p.count("/") == 2}
    assert not rooms() - named, f"README's code map lacks the rooms {sorted(rooms() - named)}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    assert broken_links(page) == []


def test_image_tags_are_the_release():
    """Every `colbert-train:TAG` in README and docs is the version pyproject.toml releases."""
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    for page in PAGES:
        tags = set(re.findall(r"colbert-train:(\d+\.\d+\.\d+)", page.read_text()))
        assert tags <= {version}, f"{page.relative_to(ROOT)} tags the image {sorted(tags)}, not {version}"


def test_mining_doc_is_user_documentation():
    """docs/mining.md: at most 250 lines, and a row for every key of the `mine:` section."""
    from trainer.config.mine import MineConfig

    text = (ROOT / "docs" / "mining.md").read_text()
    assert len(text.splitlines()) <= 250
    rows = set(re.findall(r"^\| `mine\.([a-z_]+)` \|", text, re.M))
    fields = set(MineConfig.model_fields)
    assert rows == fields, f"docs/mining.md's knobs table: missing {fields - rows}, not in the schema {rows - fields}"


def test_the_checkers_catch_what_they_guard(tmp_path):
    """A broken link, a missing anchor and a room left out of a code map are each caught."""
    page = "# Title\n\n## Second: `x`\n\n[ok](#second-x) [gone](b.md) [bad](#nope)\n`[no](c.md)`\n"
    (tmp_path / "a.md").write_text(page)
    assert broken_links(tmp_path / "a.md") == ["b.md (no such file)", "#nope (no heading with that anchor in a.md)"]
    text = "## Development\n\n| where | what |\n|---|---|\n| `trainer/run/`, `state.py` | x |\n"
    assert code_map_paths(text) == ["trainer/run/", "trainer/run/state.py"]
