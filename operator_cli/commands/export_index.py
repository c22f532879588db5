"""``export-index``: a model already exported, its corpus encoded into the vector database users search with.

    colbert-k8s export-index s3://models/run-1/ --corpus data/beir --to qdrant://qdrant.search:6333/docs
    colbert-k8s export-index output/ --corpus data/beir --to "lancedb:///srv/lance?table=docs" [--replace]
    colbert-k8s export-index output/ --corpus data/beir --to milvus://milvus.search:19530/docs

What a job's ``vectordb:`` section does after training (``trainer/vectordb.py``), for a model that exists: a
local model directory, a job's ``output_dir``, or an export on ``s3://``/``gs://``/``az://`` (checked against
its manifest). The corpus is streamed in chunks, each document written once (a rerun resumes), into a
collection this tool made or none (``--replace`` replaces another's), and the database's top 10 for the judged
queries (``--queries``, or the corpus's own BEIR directory) is compared with exact MaxSim's. It runs here, in
this process, and needs the trainer's packages (torch, PyLate) and the databases' clients: ``pip install
'colbert-k8s[train,vectordb]'``. Importing this module imports neither.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from operator_cli.commands.base import Command, missing_modules, trainer_log_to_stderr
from operator_cli.errors import CliError
from trainer.destinations import DESTINATIONS

__all__ = ["export_index_cmd"]

_EXTRA = "pip install 'colbert-k8s[train,vectordb]'"
_SCHEMES = ", ".join(f"{key}://" for key, scheme in DESTINATIONS.items() if scheme.kind == "vectors")


def _target(to: str):
    """``--to`` checked before anything loads: a bad URL is one line, whether or not torch is installed."""
    from trainer.destinations.vectors import VECTOR_FORMS, parse_vector_url

    try:
        return parse_vector_url(to)
    except ValueError as e:
        shown = to.split("://", 1)[0] + "://..." if "://" in to else "the value"
        hint = f"use {VECTOR_FORMS}" if "is not a vector database" in str(e) else None
        raise CliError(f"--to {shown}: {e}", hint=hint) from None


@click.command("export-index", cls=Command)
@click.argument("model", metavar="MODEL_DIR|URI")
@click.option(
    "--corpus", required=True, metavar="PATH", help="A BEIR directory (its corpus.jsonl) or a corpus.jsonl file."
)
@click.option("--to", "to", required=True, metavar="URL", help=f"The vector database's collection ({_SCHEMES}).")
@click.option(
    "--queries",
    metavar="BEIR_DIR",
    help="Judged queries to check the database's search against exact MaxSim (default: the corpus's directory "
    "when it holds queries.jsonl and qrels/).",
)
@click.option("--split", default="test", show_default=True, help="The qrels of the check (qrels/SPLIT.tsv).")
@click.option(
    "--pool-factor",
    type=click.IntRange(1, 8),
    help="Token pooling (default: the job's index.pool_factor from its metrics.json, else 1).",
)
@click.option("--replace", is_flag=True, help="Replace a collection this export did not write.")
@click.option("--chunk-size", type=click.IntRange(1, 65536), default=512, show_default=True, help="Documents at once.")
@click.option("--batch-size", type=click.IntRange(1, 4096), default=32, show_default=True, help="Encoder batch.")
@click.option("--device", help="Where the model encodes (default: a GPU if there is one).")
@click.option("--cache-dir", default=".cache/colbert-k8s", show_default=True, help="Where an s3:// export is staged.")
def export_index_cmd(model: str, corpus: str, to: str, queries: str | None, **o) -> None:
    """Encode a corpus with an exported model and write it into a vector database (--to: its collection)."""
    target = _target(to)
    missing = missing_modules("torch", "pylate")
    if missing:
        raise CliError(f"export-index encodes with the model here and needs {', '.join(missing)}", hint=_EXTRA)
    from trainer.config.schema import ConfigError
    from trainer.destinations.base import ExportFailed
    from trainer.vectordb import export_index

    try:
        with trainer_log_to_stderr():
            result = export_index(
                model, Path(corpus), to, queries=Path(queries) if queries else None, device=o.pop("device"), **o
            )
    except ConfigError as e:  # a refused collection, a bad corpus row, a model that is not one
        raise CliError(str(e)) from None
    except ExportFailed as e:  # the database did not answer: running it again resumes
        raise CliError(str(e), hint="run the same command again: what was written is kept", exit_code=1) from None
    parity = result.get("parity")
    said = f"{result['documents']} documents in {target} ({result['written']} written, {result['state']})"
    if parity:
        said += (
            f"; top 10 shared with exact MaxSim {parity['overlap@10']:.1%}, nDCG@10 "
            f"{parity['ndcg@10_database']:.4f} (exact {parity['ndcg@10_exact']:.4f})"
        )
    click.echo(said)
    click.echo(json.dumps(result, indent=2), err=True)
