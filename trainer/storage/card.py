"""The model card: ``final-model/README.md`` in the Hub's format, so a model found on a bucket a month later
says what it is.

YAML front matter (huggingface_hub's ``ModelCardData``): ``library_name: PyLate``, ``base_model`` (when the
base is a Hub name), ``tags``, ``datasets`` (data with a Hub name) and a ``model-index`` of the measured
metrics. The body: how it was trained (the config's summary, world size, steps, global batch, negatives,
mining rounds, time, device), the evaluation before and after training and through the PLAID index, the
index's footprint (``index.footprint``), the corpus in a vector database (``vectordb:``) and the encoder in
ONNX with its parity (``onnx:``) where asked, and
how to load the model and search with PyLate.

It is made from ``metrics.json`` and the config (and the base model's own card, for its ``license`` when
the config sets none: :func:`license_of`). The config holds no credentials (``trainer/config/``
refuses them), and a staged source is named by the URL it came from (its staging manifest), without user
information. Written into the model's temporary directory before the rename (``train._save_model``), and
again, atomically, once the index figures exist.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from trainer.config.base import hub_repo
from trainer.config.schema import METRICS, TrainConfig
from trainer.retrieval import RETRIEVERS

__all__ = ["dataset_name", "for_job", "license_of", "model_file", "origin", "render", "update"]

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
_ROWS = ("ndcg@10", "mrr@10", "recall@100", "map@100")


def origin(path: str) -> str:
    """Where a source came from: the URL a staged copy was fetched from (its ``.complete`` manifest, see
    ``sources.stage``), else the value itself.

    >>> origin("sentence-transformers/all-MiniLM-L6-v2")
    'sentence-transformers/all-MiniLM-L6-v2'
    """
    p = Path(path)
    for up in (p, *p.parents)[:4]:
        manifest = up / ".complete"
        if manifest.is_file():
            try:
                return json.loads(manifest.read_text())["url"]
            except (OSError, ValueError, KeyError):
                break
    return path


def _hub_name(value: str, datasets: bool = False) -> str | None:
    """The Hub id a value names, if any: ``ORG/NAME`` (not an existing path) or ``hf://[datasets/]ORG/NAME``.

    >>> _hub_name("hf://datasets/BeIR/nfcorpus", datasets=True)
    'BeIR/nfcorpus'
    >>> _hub_name("data/quickstart/train.jsonl") is None
    True
    """
    if (repo := hub_repo(value)) is not None:
        if repo.kind != ("dataset" if datasets else "model"):
            return None
        return "/".join(repo.repo_id.split("/")[:2]) if _HUB_ID.match(repo.repo_id) else None
    if datasets or "://" in value or os.path.exists(value):
        return None
    return value if _HUB_ID.fullmatch(value) else None


_GENERIC = {"beir", "data", "dataset", "datasets", "eval", "evaluation", "test", "dev", "files"}


def dataset_name(path: str) -> str:
    """A BEIR directory's dataset name: its last folder that says more than "beir" or "eval".

    >>> dataset_name("data/quickstart/beir"), dataset_name("s3://bucket/beir/nfcorpus/"), dataset_name("beir")
    ('quickstart', 'nfcorpus', 'beir')
    """
    parts = [p for p in path.replace("\\", "/").split("/") if p and not p.endswith(":")]
    return next((p for p in reversed(parts) if p.lower() not in _GENERIC), parts[-1] if parts else path)


def model_file(name_or_path: str, filename: str) -> Path | None:
    """One file of a model where it is at hand without a download: a local or staged directory, the packaged
    MiniLM, else the Hub cache (for a Hub id); None where none of them has it."""
    from huggingface_hub import try_to_load_from_cache

    from trainer.model import resolve_model_path

    local = Path(resolve_model_path(name_or_path)) / filename
    if local.is_file():
        return local
    hub = _hub_name(name_or_path)
    found = try_to_load_from_cache(hub, filename) if hub else None
    return Path(found) if isinstance(found, str) else None


def license_of(cfg: TrainConfig) -> str | None:
    """The card's ``license``: ``model.license``, else the base model's, from its own card's front matter
    when it is at hand (a local or staged directory, the packaged MiniLM, the Hub cache); else none."""
    if cfg.model.license:
        return cfg.model.license
    from huggingface_hub.repocard import metadata_load

    found = model_file(cfg.model.name_or_path, "README.md")
    try:
        value = (metadata_load(found) or {}).get("license") if found else None
    except (OSError, ValueError):  # an unreadable card: no license rather than no model
        return None
    return value if isinstance(value, str) and value else None


def _metadata(cfg: TrainConfig, metrics: dict, name: str):
    from huggingface_hub import EvalResult, ModelCardData

    base = origin(cfg.model.name_or_path)
    data = [metrics.get("train_data") or origin(cfg.data.train.path)]
    data += [origin(cfg.data.eval_beir)] if cfg.data.eval_beir else []
    datasets = sorted({d for d in (_hub_name(v, datasets=True) for v in data) if d})
    eval_name = dataset_name(origin(cfg.data.eval_beir)) if cfg.data.eval_beir else None
    results = [
        EvalResult(
            task_type="retrieval",
            task_name="Retrieval",
            dataset_type=_hub_name(origin(cfg.data.eval_beir), datasets=True) or eval_name,
            dataset_name=eval_name,
            dataset_split=cfg.data.eval_split,
            metric_type=key.replace("@", "_at_"),
            metric_name=f"{METRICS[key]} (exact MaxSim)",
            metric_value=round(value, 4),
        )
        for key, value in (metrics.get("after") or {}).items()
        if key in METRICS and eval_name
    ]
    return ModelCardData(
        license=license_of(cfg),
        library_name="PyLate",
        base_model=_hub_name(base),
        tags=["ColBERT", "PyLate", "sentence-transformers", "colbert-k8s", "late-interaction", "retrieval"],
        datasets=datasets or None,
        pipeline_tag="sentence-similarity",
        model_name=name,
        eval_results=results or None,
    )


def _training_table(cfg: TrainConfig, metrics: dict) -> str:
    t, m = cfg.training, cfg.mine
    rows = [
        ("base model", f"`{origin(cfg.model.name_or_path)}`"),
        ("training data", f"`{metrics.get('train_data') or origin(cfg.data.train.path)}`"),
        ("loss", _loss(cfg)),
        ("steps", f"{metrics.get('steps')} optimizer steps, global batch {metrics.get('global_batch')}"),
        ("world size", _where_trained(metrics)),
        ("learning rate", f"{t.learning_rate:g} ({t.lr_scheduler}, warm-up {t.warmup_ratio:g})"),
        ("lengths", _lengths(cfg, metrics)),
    ]
    if m is not None:
        model = f"`{origin(m.model)}`" if m.model else "the base model"  # a staged one by the URL it came from
        by = f"{model} ({m.retriever})" if RETRIEVERS[m.retriever].needs_model else m.retriever
        rows.append(
            (
                "negatives",
                f"{m.negatives} mined per row by {by}, ranks {m.rank_range[0]}-{m.rank_range[1]}, "
                f"{m.rounds} round(s)" + (", teacher-scored" if m.teacher else ""),
            )
        )
    else:
        rows.append(("negatives", "as given in the training data, plus in-batch"))
    if hard := metrics.get("hardness"):  # trainer/losses/hardness.py: did the negatives stay hard?
        first, last = hard["first"], hard["last"]
        stale = f"; most rows easy from step {hard['stale_at']}" if hard.get("stale_at") else ""
        rows.append(
            (
                "negatives' hardness",
                f"rows with a near-zero loss {100 * first['easy_share']:.0f}% at step "
                f"{first['step']}, {100 * last['easy_share']:.0f}% at step {last['step']} (so "
                f"{100 * (1 - last['easy_share']):.0f}% of rows still teaching at the end); positive-to-hardest "
                f"margin {first['margin']:.2f} -> {last['margin']:.2f}{stale}",
            )
        )
    if metrics.get("train_seconds") is not None:
        rows.append(("training time", f"{metrics['train_seconds']:.0f} s"))
    return "| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def _lengths(cfg: TrainConfig, metrics: dict) -> str:
    """Query and document lengths; the query's with what ``auto`` chose it from (trainer/query_length.py)."""
    why = (metrics.get("auto") or {}).get("query_length")
    line = f"queries {cfg.model.query_length}, documents {cfg.model.document_length} tokens"
    return f"{line}; {why}" if why else line


def _loss(cfg: TrainConfig) -> str:
    """The loss and its temperature; ``auto`` as the job chose it (trainer/labels.py: the first round's labels.json).

    >>> from trainer.config.schema import TrainConfig
    >>> loss = {"name": "contrastive", "temperature": 0.25}
    >>> _loss(TrainConfig.model_validate({"data": {"train": {"path": "t.jsonl"}}, "loss": loss}))
    'contrastive, temperature 0.25'
    """
    temperature = getattr(cfg.loss, "temperature", None)
    if temperature is None:
        return cfg.loss.name
    if temperature != "auto":
        return f"{cfg.loss.name}, temperature {temperature:g}"
    from trainer import labels

    try:
        structure = json.loads((Path(cfg.output_dir) / "mined" / "round-1" / labels.FILE).read_text())
    except (OSError, ValueError):
        return f"{cfg.loss.name}, temperature auto (not recorded)"
    return f"{cfg.loss.name}, {labels.explain(structure)}"


def _where_trained(metrics: dict) -> str:
    """This run's world size, device and precision, and each change a resized or moved job went through.

    >>> _where_trained({"world_size": 1, "device": "CPU", "precision": "fp32", "history": [
    ...     {"step": 0, "world_size": 2, "device": "CPU", "precision": "fp32"},
    ...     {"step": 6, "world_size": 1, "device": "CPU", "precision": "fp32"}]})
    '1 process(es) on CPU, fp32 (world size 2 -> 1 at step 6)'
    """
    now = f"{metrics.get('world_size')} process(es) on {metrics.get('device', 'unknown device')}, "
    now += f"{metrics.get('precision')}"
    history = metrics.get("history") or []
    changes = []
    for before, after in zip(history, history[1:]):
        changed = [key for key in ("world_size", "device", "precision") if before.get(key) != after.get(key)]
        what = [f"{key.replace('_', ' ')} {before.get(key)} -> {after.get(key)}" for key in changed]
        changes.append(f"{', '.join(what)} at step {after.get('step')}")
    return f"{now} ({'; '.join(changes)})" if changes else now


def _evaluation_table(cfg: TrainConfig, metrics: dict) -> str:
    base = metrics.get("base")
    columns = [
        ("base model as it ships", base if base != metrics.get("before") else None),
        ("before training", metrics.get("before")),
        ("after training", metrics.get("after")),
        ("through the PLAID index", metrics.get("index")),
    ]
    columns = [(label, figures) for label, figures in columns if figures]
    if not columns:
        return "No evaluation was asked for (set `data.eval_beir`)."
    head = "| metric | " + " | ".join(label for label, _ in columns) + " |\n|---|" + "---|" * len(columns)
    lines = []
    for key in _ROWS:
        if any(key in figures for _, figures in columns):
            cells = [f"{figures[key]:.4f}" if key in figures else "" for _, figures in columns]
            lines.append(f"| {METRICS[key]} | " + " | ".join(cells) + " |")
    where = dataset_name(origin(cfg.data.eval_beir))
    return f"On `{where}` ({cfg.data.eval_split} split), exact MaxSim over the whole corpus unless noted.\n\n" + (
        head + "\n" + "\n".join(lines)
    )


def _vectordb_section(metrics: dict) -> str:
    """Where the encoded corpus went (``vectordb:``) and how the database's search compares with exact MaxSim."""
    v = metrics.get("vectordb")
    if not v:
        return ""
    db, _, rest = v["destination"].partition("://")
    local = "local" in db or v["destination"].startswith("lancedb:///")  # a path of the job's machine: not shown
    where = f"`{db}` ({v['destination'].rsplit('=', 1)[-1]})" if local else f"`{v['destination']}`"
    text = (
        f"\n## In a vector database\n\nThe corpus, {v['documents']} documents encoded by this model at pool factor "
        f"{v['pool_factor']} ({v['tokens_per_document']} token vectors and {v['vector_bytes_per_document']:,} bytes "
        f"of float32 a document on average), was written to {where}.\n"
    )
    p = v.get("parity")
    if not p:
        return text
    rows = [
        ("nDCG@10", f"{p['ndcg@10_database']:.4f}", f"{p['ndcg@10_exact']:.4f}"),
        ("top 10 shared with exact MaxSim", f"{p['overlap@10']:.1%}", "100%"),
        ("queries answered in the same order", f"{p['same_order']:.1%}", "100%"),
    ]
    table = "| | the database's search | exact MaxSim |\n|---|---|---|\n" + "\n".join(
        f"| {a} | {b} | {c} |" for a, b, c in rows
    )
    return (
        f"{text}\nIts search of the {p['queries']} held-out queries against exact MaxSim over the same vectors "
        f"(largest score difference {p['max_score_difference']:g}):\n\n{table}\n"
    )


def _footprint_section(metrics: dict) -> str:
    """``index.footprint``: bytes and tokens a document against quality, for pooling and each stored form."""
    f = metrics.get("footprint")
    if not f:
        return ""
    chosen = f["chosen"]
    rows = "\n".join(
        f"| {p['pool_factor']} | {p['storage']} | {p['tokens_per_document']:.1f} | {p['bytes_per_document']:,} | "
        f"{p['ndcg@10']:.4f} | {p['recall@100']:.4f} |"
        for p in f["points"]
    )
    lines = "".join(f"- {line}\n" for line in f["lines"])
    disk = max((p["disk_bytes_per_document"] / p["bytes_per_document"] for p in f["points"]), default=1)
    if disk > 1.05:  # fast-plaid's float16 copy under 1,000 documents, and its merged chunks
        lines += (
            f"- on disk, fast-plaid keeps up to {disk:.1f} times a PLAID index's bytes here (a float16 copy of the "
            "vectors while an index has under 1,000 documents, and a merged copy of its chunks): `metrics.json`'s "
            "`disk_bytes_per_document`\n"
        )
    picture = f"\n![nDCG@10 against bytes per document]({f['png']})\n" if f.get("png") else ""
    return (
        f"\n## Index footprint\n\nOn the held-out split ({f['documents']} documents, {f['queries']} queries): what a "
        "document costs against what search finds, for token pooling and the form the vectors are stored in "
        "(float32 as a vector database holds them, searched by exact MaxSim; PLAID's compressed codes, with its "
        "centroids and inverted lists). The final index is at pool factor "
        f"{chosen['pool_factor']}, {chosen['storage']}.\n\n"
        "| pool factor | stored as | tokens a document | bytes a document | nDCG@10 | Recall@100 |\n"
        f"|---|---|---|---|---|---|\n{rows}\n\n{lines}{picture}"
    )


def _onnx_section(metrics: dict) -> str:
    """``onnx:``: the encoder in ONNX beside the model, and how close each form is to the PyTorch model."""
    o = metrics.get("onnx")
    if not o:
        return ""
    forms = [
        ("PyTorch", "torch", None),
        ("ONNX float32", "fp32", "model.onnx"),
        ("ONNX int8", "int8", "model_int8.onnx"),
    ]
    rows = "\n".join(
        f"| {name} | {f'`onnx/{file}`' if file else 'the model'} | "
        f"{'' if key == 'torch' else format(o[f'max_token_error_{key}'], '.2g')} | "
        f"{format(o[f'ndcg@10_{key}'], '.4f') if f'ndcg@10_{key}' in o else 'not measured'} |"
        for name, key, file in forms
    )
    if "int8_loss" not in o:
        verdict = "int8's nDCG@10 was not measured (no held-out split): `serve --onnx int8` needs --allow-int8-loss."
    elif o["int8_ok"]:
        verdict = f"int8 loses {o['int8_loss']:.4f} nDCG@10, within the {o['max_int8_loss']} allowed."
    else:
        verdict = (
            f"**int8 loses {o['int8_loss']:.4f} nDCG@10, more than the {o['max_int8_loss']} allowed**: "
            "`serve --onnx int8` refuses it without --allow-int8-loss; float32 serves as the PyTorch model does."
        )
    return (
        "\n## ONNX\n\nThe query and document encoder in ONNX, for ONNX Runtime on a CPU (`colbert-k8s serve --onnx`), "
        f"checked against the PyTorch model: the largest difference of any token embedding over {o['sample']} "
        "texts, and nDCG@10 on the held-out split by exact MaxSim.\n\n"
        f"| encoder | file | largest token error | nDCG@10 |\n|---|---|---|---|\n{rows}\n\n{verdict}\n"
    )


def _sweep_section(metrics: dict) -> str:
    """Which sweep chose this model (``colbert-k8s tune``): the trial, its values, and the space they came from."""
    sweep = metrics.get("sweep")
    if not sweep:
        return ""
    rows = [
        (
            "sweep",
            f"`{sweep['name']}`: {sweep['trials']} trial(s), {sweep['succeeded']} succeeded "
            f"({sweep['engine']}, {sweep['algorithm']} search)",
        ),
        (
            "chosen trial",
            f"`{sweep['trial']}`, the best {METRICS.get(sweep['metric'], sweep['metric'])} "
            f"({sweep['goal']}) on the {sweep['split']} split: {sweep['value']:.4f}",
        ),
        *((f"`{key}`", f"{sweep['values'].get(key)} from {space}") for key, space in sweep["space"].items()),
    ]
    return "\n## Sweep\n\n| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows) + "\n"


_USAGE = """```python
from pylate import indexes, models, retrieve
{fetch}
model = models.ColBERT(model_name_or_path="{where}"{revision})
index = indexes.PLAID(index_folder="my-index", index_name="docs", override=True)
documents = {{"d1": "ColBERT scores a query against every document token.", "d2": "Another document."}}
index.add_documents(
    documents_ids=list(documents),
    documents_embeddings=model.encode(list(documents.values()), is_query=False),
)
retriever = retrieve.ColBERT(index=index)
hits = retriever.retrieve(queries_embeddings=model.encode(["how does ColBERT score?"], is_query=True), k=10)
```"""


def render(
    cfg: TrainConfig,
    metrics: dict,
    name: str | None = None,
    revision: str | None = None,
    load_from: str | None = None,
    fetch_from: str = "",
) -> str:
    """The card's text. ``name``: the Hub id when exported there (how a user loads it), from the branch
    ``revision`` when it is not the default one; else ``load_from``, the path the snippet loads, copied
    first from ``fetch_from`` (the object-store prefix it was exported to) when given."""
    from huggingface_hub import ModelCard

    from trainer import __version__

    where = name or load_from or "path/to/final-model"
    fetch = f"\n# exported to {fetch_from}: copy that prefix to {where}/ first (rclone, or the store's CLI)"
    fetch = fetch if fetch_from else ""
    data = _metadata(cfg, metrics, name or cfg.tracking.run_name or Path(cfg.output_dir).name)
    body = f"""
# {data.model_name}

A [PyLate](https://github.com/lightonai/pylate) ColBERT (late-interaction) retrieval model, fine-tuned from
`{origin(cfg.model.name_or_path)}` with [colbert-k8s](https://github.com/colbert-k8s/colbert-k8s) {__version__}.

## Training

{_training_table(cfg, metrics)}

## Evaluation

{_evaluation_table(cfg, metrics)}
{_footprint_section(metrics)}{_vectordb_section(metrics)}{_onnx_section(metrics)}{_sweep_section(metrics)}

## Use

{_USAGE.format(where=where, revision=f', revision="{revision}"' if revision else "", fetch=fetch)}
"""
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n{body}"))


def for_job(cfg: TrainConfig, metrics: dict) -> str:
    """The card of ``cfg``'s final model, named as users will load it: the Hub id when exported there; the
    exported prefix, copied to ``final-model/``, on an object store; else ``output_dir/final-model`` (relative
    to the job's volume as the config gives it: no absolute local path goes into a card)."""
    if cfg.export is not None and (repo := hub_repo(cfg.export.destination)) is not None:
        return render(cfg, metrics, repo.repo_id, cfg.export.revision)
    if cfg.export is not None:
        return render(cfg, metrics, load_from="final-model", fetch_from=cfg.export.destination)
    local = Path(cfg.output_dir) / "final-model"
    return render(cfg, metrics, load_from=None if local.is_absolute() else local.as_posix())


def update(model_dir: Path, cfg: TrainConfig, metrics: dict) -> None:
    """The card again, with figures that came after the model (the index's), and the model's manifest with it.
    Killed between the two, the model fails its manifest and is saved again from the last checkpoint."""
    from trainer.atomic import whole_or_absent, write_text
    from trainer.run.checkpoint import write_manifest

    write_text(model_dir / "README.md", for_job(cfg, metrics))
    with whole_or_absent(model_dir / "manifest.json"):  # one cut short is none: the model is saved again
        write_manifest(model_dir)
