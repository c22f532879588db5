"""Hard-negative mining: for every (query, positive) row of ``data.train``, retrieve the top-k of a corpus,
drop the query's positives and likely false negatives, and sample ``mine.negatives`` from a rank range.

retrieve (``trainer/retrieval/``: exact MaxSim or PLAID with the corpus sharded over ranks, or BM25 with
the queries sharded over ranks) -> choose (``trainer/negatives.py``: pure, seeded per row, the same
negatives whatever the world size) -> score (``mine.teacher``, optional) -> parts (one Parquet file per
``mine.query_chunk`` queries, written whole by each node's first process, beside a fingerprint of the
inputs) -> ``train.parquet`` (every part, renamed into place last). A killed job redoes only the parts
that are missing on some node; parts mined from other inputs are mined again. The trainer reads the result with
``columns: {query: query, positive: positive, negatives: [negatives]}`` (teacher scores:
``{query, documents, scores}``), and ``mining.json`` counts the rows dropped, by reason.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from trainer import distributed as D
from trainer import labels
from trainer.atomic import replacing, write_text
from trainer.config.schema import Columns, DataSource, TrainConfig
from trainer.data import DataError, document_text, iter_jsonl, load_rows
from trainer.env import Layout
from trainer.errors import JobVerdict
from trainer.negatives import Dropped, choose_negatives, explain_drops, row_negatives
from trainer.reporting.progress import Progress
from trainer.reporting.tracking import flatten
from trainer.retrieval import RETRIEVERS, round_retriever
from trainer.retrieval.search import build_retriever
from trainer.run.preemption import StopRequest
from trainer.teacher import Teacher

__all__ = [
    "MINED_COLUMNS",
    "TAUGHT_COLUMNS",
    "Dropped",
    "MiningError",
    "Pairs",
    "choose_negatives",
    "load_pairs",
    "mine",
    "changed_inputs",
    "mined_source",
    "mining_fingerprint",
]

log = logging.getLogger("trainer")
MINED_COLUMNS = Columns(query="query", positive="positive", negatives=["negatives"])
TAUGHT_COLUMNS = Columns(query="query", documents="documents", scores="scores")  # with mine.teacher
_DROPPED_KEY = "colbert_k8s.dropped"  # a part's metadata: rows it dropped, by reason
_FALLBACK_KEY = "colbert_k8s.fallback"  # and rows it kept with random negatives (mine.fallback), by reason
_FINGERPRINT = "fingerprint.json"  # what the parts beside it were mined from (mining_fingerprint)
LABELS = labels.FILE  # how complete the labels look to the first round's retriever (trainer/labels.py)


class MiningError(DataError, JobVerdict):
    """Bad input to mining, found by every rank alike (they read the same rows): one line, exit 2."""


@dataclass
class Pairs:
    """What is mined for: each distinct query, the corpus, and each row as (query, positive) indices."""

    queries: list[str]
    corpus: list[str]
    rows: list[tuple[int, int]]
    positives: list[set[int]]  # per query: every document some row gives as its positive

    def rows_by_query(self) -> dict[int, list[int]]:
        """Each query's rows, in data.train's order."""
        out: dict[int, list[int]] = {}
        for row, (q, _) in enumerate(self.rows):
            out.setdefault(q, []).append(row)
        return out


def mined_source(path: Path, distillation: bool) -> DataSource:
    """The ``data.train`` that reads mined rows: (query, positive, negatives), or with teacher scores
    (query, documents, scores) for the distillation loss."""
    return DataSource(path=str(path), columns=TAUGHT_COLUMNS if distillation else MINED_COLUMNS)


# ---- input -----------------------------------------------------------------------------------------


def load_pairs(cfg: TrainConfig) -> Pairs:
    """The (query, positive) rows of ``data.train`` (negative columns are ignored) and the corpus."""
    queries, documents, _ = load_rows(cfg.data.train.pairs(), distillation=False, cache_dir=cfg.data.cache_dir).all()
    positives_text = [docs[0] for docs in documents]
    corpus = _read_corpus(cfg.mine.corpus) if cfg.mine.corpus else list(dict.fromkeys(positives_text))
    copies: dict[str, list[int]] = {}  # every index of each text: a copy of a positive is a positive too
    for i, text in enumerate(corpus):
        copies.setdefault(text, []).append(i)
    doc_index = {text: found[0] for text, found in copies.items()}  # the first copy is the row's positive
    missing = [n for n, text in enumerate(positives_text, 1) if text not in doc_index]
    if missing:
        raise DataError(
            f"{len(missing)} of {len(positives_text)} positives of data.train are not in mine.corpus "
            f"{cfg.mine.corpus} (first: row {missing[0]}); add them to the corpus, or leave mine.corpus unset "
            "to mine among the positives"
        )
    query_index: dict[str, int] = {}
    rows, positives = [], []
    for q, p in zip(queries, positives_text):
        qi = query_index.setdefault(q, len(query_index))
        if qi == len(positives):
            positives.append(set())
        positives[qi].update(copies[p])
        rows.append((qi, doc_index[p]))
    return Pairs(list(query_index), corpus, rows, positives)


def _corpus_file(path: str) -> Path:
    """``mine.corpus``'s file: the path itself, or a BEIR directory's corpus.jsonl."""
    return Path(path) / "corpus.jsonl" if Path(path).is_dir() else Path(path)


def _read_corpus(path: str) -> list[str]:
    """Texts of a .jsonl corpus (``text`` and optional ``title`` per line) or a BEIR directory's corpus.jsonl."""
    file = _corpus_file(path)
    if not file.is_file():
        raise DataError(f"mine.corpus: {file} not found; give a .jsonl file or a BEIR directory")
    texts = []
    for where, doc in iter_jsonl(file):
        texts.append(document_text(doc, f"mine.corpus {where}"))
    if not texts:
        raise DataError(f"mine.corpus {file} holds no document")
    return texts


# ---- choice ----------------------------------------------------------------------------------------


# ---- the phase -------------------------------------------------------------------------------------


def mine(
    cfg: TrainConfig,
    layout: Layout,
    out_dir: Path,
    load_model: Callable[[], Any] = lambda: None,
    retriever: str = "",
    progress: Progress | None = None,
    stop: StopRequest | None = None,
) -> Path:
    """Mine ``data.train``'s pairs into ``out_dir/train.parquet`` on every node and return its path.

    ``load_model`` gives the ColBERT model to retrieve with (None: BM25), called only when some part is still to
    be mined. Parts already written on every node are kept if mined from the same inputs (``retriever`` names the
    model that retrieves); the result is renamed into place only once whole. ``progress``: the job's, whose round's
    mining phases this is; ``stop``: its SIGTERM flag, honoured after each part (trainer/run/preemption.py)."""
    progress = progress or Progress(enabled=False)
    final = out_dir / "train.parquet"
    writes = layout.local_rank == 0  # one writer per pod: its /workspace may be its own
    try:
        fingerprint = mining_fingerprint(cfg, retriever)
    except DataError as e:
        raise MiningError(str(e)) from None
    if writes:
        _forget_other_inputs(out_dir, fingerprint)
    D.barrier()  # no writer of a shared volume writes a part before every writer has looked
    if writes:
        write_text(out_dir / _FINGERPRINT, json.dumps(fingerprint, indent=2, sort_keys=True) + "\n")
        _forget_unreadable([final], "joining it again from its parts (mining those that are missing)")
    if all(D.gather_objects(final.is_file() or not writes)):
        log.info("mined rows found: %s", final)
        progress.skip("encode", "search", "teacher")
        return final
    started = time.perf_counter()
    mcfg = cfg.mine
    try:
        pairs = load_pairs(cfg)
    except DataError as e:
        raise MiningError(str(e)) from None
    chunks = [
        range(s, min(s + mcfg.query_chunk, len(pairs.queries))) for s in range(0, len(pairs.queries), mcfg.query_chunk)
    ]
    parts = [out_dir / f"part-{i:05d}.parquet" for i in range(len(chunks))]
    if writes:
        _forget_unreadable(parts)
    todo = [i for i, part in enumerate(parts) if not all(D.gather_objects(part.is_file() or not writes))]
    log.info(
        "mine: %d rows, %d distinct queries, %d documents; %d of %d parts to do",
        len(pairs.rows),
        len(pairs.queries),
        len(pairs.corpus),
        len(todo),
        len(parts),
    )
    if not todo:
        progress.skip("encode", "search", "teacher")
    else:
        key = round_retriever(mcfg.retriever, 2 if retriever.startswith("round") else 1)
        work = [(i, chunks[i], parts[i]) for i in todo]
        first = not retriever.startswith("round")
        _mine_parts(cfg, layout, pairs, work, len(parts), load_model, progress, key, stop or StopRequest(), first)
    shutil.rmtree(out_dir / f".plaid-{layout.rank}", ignore_errors=True)  # also one a killed run left behind
    stats = _join(parts, final) if writes else {}
    if not D.broadcast_object(stats.get("rows") if layout.is_main else None):
        raise MiningError(
            f"mining kept no row: every query had fewer than mine.negatives ({mcfg.negatives}) candidates in "
            f"mine.rank_range below mine.max_score_ratio x its positive's score, or its positive ranked below "
            f"mine.positive_within; widen the range, raise positive_within or add documents"
        )
    if layout.is_main:
        _report(stats, pairs, mcfg, out_dir, final, time.perf_counter() - started)
    return final


def _report(stats: dict, pairs: Pairs, mcfg, out_dir: Path, final: Path, seconds: float) -> None:
    """What mining did, on rank 0: mining.json (rows kept, dropped and drawn at random, by reason), one line, and
    a line per reason rows were dropped or drawn."""
    stats.update(rows_in=len(pairs.rows), seconds=round(seconds, 1))
    if (out_dir / LABELS).is_file():
        stats["labels"] = json.loads((out_dir / LABELS).read_text())
        log.info("mine: %s", labels.describe_line(stats["labels"]))
    write_text(out_dir / "mining.json", json.dumps(stats, indent=2) + "\n")
    log.info("mine: %d of %d rows kept in %.1fs: %s", stats["rows"], len(pairs.rows), stats["seconds"], final)
    explain_drops(stats["dropped"], len(pairs.rows), len(pairs.corpus), mcfg)
    if drawn := sum(stats["random_negatives"].values()):
        log.info(
            "mine: %d of %d rows kept with random negatives: the retriever left them too few candidates "
            "(mine.fallback: drop drops them instead)",
            drawn,
            len(pairs.rows),
        )


def _mine_parts(
    cfg: TrainConfig,
    layout: Layout,
    pairs: Pairs,
    todo: list,
    total: int,
    load_model,
    progress,
    key: str,
    stop: StopRequest,
    first_round: bool = True,
) -> None:
    """Retrieve, choose and (with ``mine.teacher``) score each of ``todo``'s (part number, queries, path);
    each node's first process writes the part whole, then every rank honours a SIGTERM (a restart mines only
    the parts not written). The model is loaded here, only when some part is to do; ``key`` names the
    retriever (trainer/retrieval/). In the first round, before any part, how complete the labels look
    (trainer/labels.py) is written beside the parts."""
    mcfg, show, writes = cfg.mine, layout.is_main, layout.local_rank == 0
    plaid_dir = todo[0][2].parent / f".plaid-{layout.rank}"  # this rank's index of its share (retriever: plaid)
    before = total - len(todo)  # parts an earlier run wrote
    progress.begin("encode")
    on_chunk = lambda: progress.advance("encode")
    retriever = build_retriever(key, load_model(), pairs.corpus, mcfg, show, plaid_dir, on_chunk)
    progress.advance("encode", None)
    rows_of = pairs.rows_by_query()
    if first_round:
        structure = labels.measure(retriever, pairs, rows_of, cfg.training.seed, mcfg.top_k)
        if writes:
            write_text(todo[0][2].parent / LABELS, json.dumps(structure, indent=2) + "\n")
    teacher = Teacher(mcfg.teacher, cfg.model, D.device_for(layout)) if mcfg.teacher else None
    with tqdm(todo, desc="mine: queries", disable=not show, unit="part") as bar:  # closed on every way out
        for i, queries, part in bar:
            qs = list(queries)
            progress.begin("search", items=total, done=before)
            cands, pos_scores = retriever.search(
                [pairs.queries[q] for q in qs], [pairs.positives[q] for q in qs], mcfg.top_k
            )
            table = _part_table(pairs, qs, cands, pos_scores, rows_of, cfg)
            progress.advance("search")
            if teacher is not None:
                progress.begin("teacher", items=total, done=before)
                table = _taught(table, teacher)
                progress.advance("teacher")
            if writes:
                with replacing(part, table.nbytes) as tmp:
                    pq.write_table(table, tmp)
            stop.honour(f"after writing mined part {part} ({i + 1} of {total})")


def mining_fingerprint(cfg: TrainConfig, retriever: str) -> dict:
    """Everything the mined rows are a function of: data.train's rows (their content, columns and limit),
    the ``mine:`` section (but ``rounds``, which only adds rounds after), the model's settings, the seed
    that samples the negatives, and the model that retrieves."""
    rows = load_rows(cfg.data.train.pairs(), distillation=False, cache_dir=cfg.data.cache_dir)
    # encoding batch sizes change no row (lowering one after an out-of-memory keeps the parts done)
    mine_cfg = cfg.mine.model_dump(mode="json", exclude={"rounds", "batch_size"})
    if isinstance(mine_cfg.get("teacher"), dict):
        mine_cfg["teacher"].pop("batch_size", None)
    corpus = None
    if cfg.mine.corpus:
        file = _corpus_file(cfg.mine.corpus)
        corpus = [file.stat().st_size, file.stat().st_mtime_ns] if file.is_file() else None
    uses_model = RETRIEVERS[cfg.mine.retriever].needs_model or (retriever or "").startswith("round")
    return {
        "format": 1,
        "data.train": rows.sampled_identity(),  # 0.3's (64 rows): its fingerprints lack the next key
        "data.train rows": rows.identity(),  # every row's content: one positive edited is mined again
        "mine": mine_cfg,
        "mine.corpus file": corpus,  # size and time: a corpus edited in place is mined again
        # how training starts a new projection changes no mined row (the miner builds its model without it)
        "model": cfg.model.model_dump(mode="json", exclude={"projection_init"}) if uses_model else None,
        "training.seed": cfg.training.seed,
        "retriever": retriever or cfg.mine.model or cfg.mine.retriever,
    }


def _mined_files(out_dir: Path) -> list[Path]:
    """The parts and the joined rows a mining pass wrote in ``out_dir``."""
    return [p for p in (*out_dir.glob("part-*.parquet"), out_dir / "train.parquet") if p.is_file()]


def changed_inputs(out_dir: Path, fingerprint: dict) -> str | None:
    """Which inputs changed since the rows in ``out_dir`` were mined ("mine.negatives: 2 -> 3"), or None
    when nothing was mined there yet or nothing changed."""
    if not _mined_files(out_dir):
        return None
    try:
        before = json.loads((out_dir / _FINGERPRINT).read_text())
    except FileNotFoundError:  # mined by a release before fingerprints: trusted as it is, once, with a word
        log.warning("mine: %s holds rows mined before fingerprints existed; kept as they are", out_dir)
        return None
    except (OSError, ValueError):
        before = {"fingerprint.json": "unreadable"}
    if before == fingerprint:
        return None
    old, new = flatten(before), flatten(fingerprint)
    # a key the old fingerprint lacks is a setting a later release added: not a change of the user's
    changed = sorted(k for k in old.keys() if old.get(k) != new.get(k))
    if not changed:
        return None
    return ", ".join(f"{k}: {old.get(k, 'unknown')!s:.60} -> {new.get(k)!s:.60}" for k in changed[:3])


def _forget_other_inputs(out_dir: Path, fingerprint: dict) -> None:
    """Remove mined parts (and the joined rows) made from other inputs than ``fingerprint``'s, saying which
    setting changed: a restart with another ``query_chunk`` once trained some rows twice and others never."""
    what = changed_inputs(out_dir, fingerprint)
    if what is None:
        return
    found = _mined_files(out_dir)
    log.warning("mine: the rows in %s were mined from other inputs (%s); mining them again", out_dir, what)
    for p in found:
        p.unlink(missing_ok=True)  # a pod sharing the volume may have removed it first
    (out_dir / "mining.json").unlink(missing_ok=True)
    (out_dir / LABELS).unlink(missing_ok=True)


def _forget_unreadable(files: list[Path], again: str = "mining it again") -> None:
    """A part, or the joined rows, that Parquet cannot read (truncated by a full disk or a copy) is removed, so
    it is made again (``again`` says how): mined rows are derived data. Counted as done, a part failed every
    restart with ArrowInvalid, and the joined rows failed training in one line that no restart could help."""
    for file in files:
        if not file.is_file():
            continue
        try:
            pq.read_metadata(file)
        except (OSError, pa.ArrowInvalid) as e:
            if not file.is_file():  # a pod sharing the volume removed it meanwhile
                continue
            log.warning("mine: %s is unreadable (%s); removed, %s", file, str(e).splitlines()[0][:120], again)
            file.unlink(missing_ok=True)


def _part_table(pairs, qs, cands, pos_scores, rows_of, cfg: TrainConfig) -> pa.Table:
    """The mined rows of one chunk of queries, in data.train's row order."""
    out: list[tuple[int, str, str, list[str], list[float | None]]] = []
    dropped = dict.fromkeys((d.value for d in Dropped), 0)
    fallback = dict.fromkeys((d.value for d in Dropped), 0)  # rows kept with random negatives, by why
    n = len(pairs.corpus)
    for q, found, scores in zip(qs, cands, pos_scores):
        # the retriever returned fewer than it was asked for (BM25 scores 0 for documents sharing no word)
        short = found is not None and len(found) < min(cfg.mine.top_k + len(pairs.positives[q]), n)
        rows = rows_of[q]
        if cfg.mine.rows_per_query is not None and len(rows) > cfg.mine.rows_per_query:
            rows = sorted(random.Random(f"rows-{cfg.training.seed}-{q}").sample(rows, cfg.mine.rows_per_query))
            dropped[Dropped.ROWS_PER_QUERY.value] += len(rows_of[q]) - len(rows)
        for row in rows:
            positive = pairs.rows[row][1]
            rng = random.Random(cfg.training.seed * 1_000_003 + row)  # per row: the same on any world size
            chosen, why = row_negatives(found, pairs.positives[q], scores.get(positive, 0.0), short, n, cfg.mine, rng)
            if chosen is None:
                dropped[why.value] += 1
                continue
            if why is not None:
                fallback[why.value] += 1
            out.append(
                (
                    row,
                    pairs.queries[q],
                    pairs.corpus[positive],
                    [pairs.corpus[d] for d, _ in chosen],
                    [scores.get(positive, 0.0)] + [s for _, s in chosen],
                )
            )
    out.sort()
    return pa.table(
        {
            "row": pa.array([r[0] for r in out], pa.int64()),
            "query": pa.array([r[1] for r in out], pa.string()),
            "positive": pa.array([r[2] for r in out], pa.string()),
            "negatives": pa.array([r[3] for r in out], pa.list_(pa.string())),
            "scores": pa.array([r[4] for r in out], pa.list_(pa.float32())),
        },
        # so a resumed job still counts the parts done before
        metadata={_DROPPED_KEY: json.dumps(dropped), _FALLBACK_KEY: json.dumps(fallback)},
    )


def _taught(table: pa.Table, teacher: Teacher) -> pa.Table:
    """The rows with ``documents`` = [positive, *negatives] and ``scores`` = the teacher's scores of them."""
    documents = [[p, *n] for p, n in zip(table.column("positive").to_pylist(), table.column("negatives").to_pylist())]
    scores = teacher.score(table.column("query").to_pylist(), documents)
    table = table.drop_columns(["scores"])
    table = table.append_column("documents", pa.array(documents, pa.list_(pa.string())))
    return table.append_column("scores", pa.array(scores, pa.list_(pa.float32())))


def _join(parts: list[Path], final: Path) -> dict:
    """Every part, in data.train's row order, into one file renamed into place last (none when empty), and
    the rows kept, dropped and kept with random negatives (by reason) over all parts."""
    tables = [pq.read_table(p) for p in parts]
    counts = {key: dict.fromkeys((d.value for d in Dropped), 0) for key in (_DROPPED_KEY, _FALLBACK_KEY)}
    for t in tables:
        for key, total in counts.items():
            for reason, n in json.loads((t.schema.metadata or {}).get(key.encode(), b"{}")).items():
                total[reason] = total.get(reason, 0) + n
    table = pa.concat_tables([t.replace_schema_metadata(None) for t in tables]).sort_by("row")
    if table.num_rows:
        with replacing(final, table.nbytes) as tmp:
            pq.write_table(table, tmp)
    dropped, fallback = counts[_DROPPED_KEY], counts[_FALLBACK_KEY]
    return {"rows": table.num_rows, "parts": len(parts), "dropped": dropped, "random_negatives": fallback}
