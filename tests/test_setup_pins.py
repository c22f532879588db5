"""requirements-serve.txt against the training environment it is layered on (scripts/setup.sh).

.venv-serve sees .venv's packages after its own, so a pin there that a .venv package's requirement refuses
is a conflict in that package, and pip printed it as ERROR lines in the middle of the quickstart's set-up
(issue 43: "install that talks" without alarms). Read from the installed distributions' own metadata.
"""

from __future__ import annotations

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
