"""The export destinations' registry (``trainer/destinations/__init__.py``): the config's URL check, the CLI's
credential line and the uploader all read it, and the CLI reads it without importing the export module."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainer.config.base import DESTINATION_PATTERN, parse_destination
from trainer.destinations import CREDENTIALS, DESTINATIONS, credential_hint, uploader

ROOT = Path(__file__).resolve().parents[1]


def test_each_scheme_parses_and_finds_its_uploader():
    for key, scheme in DESTINATIONS.items():
        url = f"{key}://org/name" if scheme.hub else f"{key}://bucket/prefix/"
        dest = parse_destination(url)
        assert (dest.scheme, dest.hub, str(dest)) == (key, scheme.hub, url.rstrip("/") if scheme.hub else url)
        assert type(uploader(dest)).__name__ == scheme.cls.split(":")[1]
        assert credential_hint(dest, set(scheme.credentials[-1])) is None
        assert credential_hint(dest, set()) is not None
    assert CREDENTIALS == {k: s.credentials for k, s in DESTINATIONS.items()}
    assert DESTINATION_PATTERN.startswith("^((s3|gs|az)://") and "|hf://" in DESTINATION_PATTERN
    with pytest.raises(ValueError, match=r"ftp:// is not an export destination; use s3://BUCKET/PREFIX/, gs://\.\.\."):
        parse_destination("ftp://host/x")


def test_the_cli_names_missing_credentials_from_the_registry_without_the_export_module(tmp_path):
    """``submit``'s check (JobSpec) lists the scheme's variables as the registry has them, and never imports
    ``trainer.storage.export`` (a runtime module: obstore, huggingface_hub) for them."""
    config = tmp_path / "train.yaml"
    config.write_text("data: {train: {path: t.jsonl}}\ntraining: {max_steps: 1}\nexport: {destination: gs://b/p/}\n")
    code = (
        "import sys\n"
        "from operator_cli.errors import CliError\n"
        "from operator_cli.spec import JobSpec\n"
        f"text = open({str(config)!r}).read()\n"
        "try:\n"
        "    JobSpec(name='j', config_text=text)\n"
        "except CliError as e:\n"
        "    print(e.message, '|', e.hint)\n"
        "heavy = ('trainer.storage.export', 'trainer.destinations.store', 'obstore')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    said, imported = out.stdout.strip().splitlines()
    assert "export.destination gs://b/p/ needs credentials in the pods" in said
    assert f"--secret-env {DESTINATIONS['gs'].credentials[0][0]}=SECRET/KEY" in said
    assert imported == "[]"
