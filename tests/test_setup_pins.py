"""scripts/setup.sh: the serve venv's pins against the training environment, and a first install's room.

.venv-serve sees .venv's packages after its own, so a pin there that a .venv package's requirement refuses
is a conflict in that package, and pip printed it as ERROR lines in the middle of the quickstart's set-up.
Read from the installed distributions' own metadata.
"""

from __future__ import annotations

import shutil
import subprocess
from importlib.metadata import distributions

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.helpers import ROOT

# The one conflict .venv-serve exists for: kserve 0.21 needs python-dateutil<3, the CLI's kubernetes 37.0.2 >=3.
ALLOWED = {("colbert-k8s", "kubernetes")}


def pins_of(name: str) -> dict[str, str]:
    """{canonical name: pinned version} of a requirements file of the repository."""
    pins = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def serve_pins() -> dict[str, str]:
    return pins_of("requirements-serve.txt")


def conflicts(pins: dict[str, str]) -> list[str]:
    """Each requirement on a pinned name that the pin does not meet, of the distributions .venv-serve sees from
    .venv: not those it shadows with a pin of its own, nor the test-only models installed without their
    dependencies on purpose (tests/requirements-nodeps.txt)."""
    skipped = set(pins) | set(pins_of("tests/requirements-nodeps.txt"))
    found = []
    for dist in distributions():
        owner = canonicalize_name(dist.metadata["Name"])
        if owner in skipped:
            continue
        for text in dist.requires or []:
            req = Requirement(text)
            name = canonicalize_name(req.name)
            if name not in pins or (owner, name) in ALLOWED:
                continue
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            if not req.specifier.contains(pins[name], prereleases=True):
                found.append(f"{owner} requires {req}, requirements-serve.txt pins {name}=={pins[name]}")
    return sorted(set(found))


def test_every_serve_pin_meets_what_the_training_env_requires():
    assert conflicts(serve_pins()) == []


def test_setuptools_is_pinned_within_torchs_range():
    """`python -m venv` bundles a setuptools older than grpcio-tools' >=77.0.1, so without a pin pip takes the
    newest, past torch's setuptools<82: the ERROR line a fresh clone's quickstart printed."""
    pins = serve_pins()
    assert "setuptools" in pins
    assert conflicts({"setuptools": "84.2.1"}) != []  # what pip took unpinned: the check sees it


def test_setup_refuses_a_full_disk_in_one_line_before_installing(tmp_path):
    """On a full disk pip failed after minutes of downloads with a bare OSError (a CI run did): setup says what
    room it needs, in one line, and installs nothing. Driven with a .venv whose python logs its calls and a df
    that reports 1 GB free."""

    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    calls = tmp_path / "calls.log"
    venv_bin = tmp_path / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    fake_bin = tmp_path / "fake-bin"
    fake_bin.mkdir()
    # no torch in this .venv, no CPU index answers, every other call succeeds (and is logged)
    (venv_bin / "python").write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\ncase "$*" in *"import torch"*|*"index versions"*) exit 1;; esac\n'
    )
    (fake_bin / "df").write_text(
        '#!/bin/sh\necho "Filesystem 1024-blocks Used Available Capacity Mounted on"\n'
        'echo "/dev/vda 264241152 263192576 1048576 100% /"\n'
    )
    for script in (venv_bin / "python", fake_bin / "df"):
        script.chmod(0o755)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        ["bash", "scripts/setup.sh", "train,test"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "setup: 1 GB free on /, torch's CUDA build (about 4.5 GB), the rest and pip's unpacking needs about 10 GB:"
        " free some room and run setup again"
    ]
    assert "pip install --progress-bar off" not in calls.read_text()  # nothing installed
