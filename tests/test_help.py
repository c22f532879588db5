"""Every option says what it does (issue 43): each flag of every `colbert-k8s` command has help text, and
`colbert-train --help` is whole, in plain words."""

from __future__ import annotations

import subprocess
import sys

import click

from operator_cli.cli import cli
from tests.helpers import ROOT


def _options(command: click.Command, path: tuple[str, ...] = ("colbert-k8s",)):
    """(command path, option) for every visible option of every command, groups walked."""
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _options(sub, (*path, name))
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            yield " ".join(path), param


def test_every_option_of_every_command_has_help():
    found = list(_options(cli))
    assert len(found) > 100  # the walk reaches every command's options
    missing = sorted({f"{where} {'/'.join(o.opts)}" for where, o in found if not (o.help or "").strip()})
    assert missing == []


def test_colbert_train_help_is_whole_and_plain():
    res = subprocess.run([sys.executable, "-m", "trainer", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0
    description = " ".join(res.stdout.split("\n\n")[1].split())
    assert "``" not in res.stdout and description.rstrip().endswith(".")  # no reST, no sentence cut at "and"
    assert "stage the data" in description and "--config FILE.yaml" in res.stdout


def test_the_local_lock_file_is_ignored_by_git():
    """The quickstart's --workdir is the checkout: the lock `local` leaves there is not a change to commit."""
    from operator_cli.local.run import LOCK_FILE

    assert LOCK_FILE in (ROOT / ".gitignore").read_text().splitlines()
