"""The export destinations' registry (``trainer/destinations/__init__.py``): the config's URL check, the CLI's
credential line and the uploader all read it, and the CLI reads it without importing the export module."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.config.base import DESTINATION_FORMS, DESTINATION_PATTERN, parse_destination
from trainer.destinations import CREDENTIALS, DESTINATIONS, Scheme, credential_hint, uploader

ROOT = Path(__file__).resolve().parents[1]


def test_each_scheme_parses_and_finds_its_uploader():
    for key, scheme in DESTINATIONS.items():
        if scheme.kind == "vectors":
            continue  # test_each_vector_database_scheme_parses_and_finds_its_class
        url = f"{key}://org/name" if scheme.hub else f"{key}://bucket/prefix/"
        dest = parse_destination(url)
        assert (dest.scheme, dest.hub, str(dest)) == (key, scheme.hub, url.rstrip("/") if scheme.hub else url)
        assert type(uploader(dest)).__name__ == scheme.cls.split(":")[1]
        for one in scheme.credentials:  # any one set is enough
            assert credential_hint(dest, set(one)) is None
        # a credential-free scheme never misses one; any other names its first set's flags
        hint = credential_hint(dest, set())
        free = not scheme.credentials or () in scheme.credentials  # () or ((),): nothing to set
        assert hint is None if free else f"--secret-env {scheme.credentials[0][0]}=" in hint[1]
        assert re.fullmatch(DESTINATION_PATTERN, url) and f"{key}://" in DESTINATION_FORMS
    assert CREDENTIALS == {k: s.credentials for k, s in DESTINATIONS.items() if s.kind == "files"}
    stores = "|".join(k for k, s in DESTINATIONS.items() if not s.hub and s.kind == "files")
    assert DESTINATION_PATTERN.startswith(f"^(({stores})://") and "|hf://" in DESTINATION_PATTERN


def test_a_credential_free_scheme_has_no_hint():
    """``credentials=()`` (a mounted directory) is accepted and never asks for a ``--secret-env``."""
    assert Scheme("file", (), "local:Directory").hint(set()) is None
    assert Scheme("file", (), "local:Directory").hint({"HF_TOKEN"}) is None
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


def test_each_vector_database_scheme_parses_and_finds_its_class(tmp_path):
    """A vector database is one registry line: each of its URL forms parses back to itself, its class is found
    and opens on the embedded form, and export.destination refuses it, naming vectordb.destination."""
    from trainer.destinations.vectors import VECTOR_FORMS, VECTOR_PATTERN, database, parse_vector_url

    vectors = {k: s for k, s in DESTINATIONS.items() if s.kind == "vectors"}
    assert set(vectors) == {"qdrant", "lancedb", "milvus"} and not set(vectors) & set(CREDENTIALS)
    for key, scheme in vectors.items():
        for form, transport in scheme.forms:
            name = key + (f"+{form}" if form else "")
            if transport in ("https", "http"):
                url = f"{name}://db.example:6333/docs"
            elif transport == "local":
                url = f"{name}://{tmp_path / key}{scheme.suffix}?{scheme.container}=docs"
            else:
                url = f"{name}://bucket/pre/fix?{scheme.container}=docs"
            target = parse_vector_url(url)
            assert (target.db, target.transport, str(target)) == (key, transport, url)
            assert re.fullmatch(VECTOR_PATTERN, url) and f"{name}://" in VECTOR_FORMS
            if transport == "local":
                db = database(target)
                assert type(db).__name__ == scheme.cls.split(":")[1] and db.existing() is False
                db.close()
        with pytest.raises(ValueError, match=rf"{key}:// is a vector database: .*\(vectordb.destination\)"):
            parse_destination(f"{key}://host/docs")
