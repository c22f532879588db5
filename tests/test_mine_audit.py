"""Mining computes what it says: each silent wrong result an outside audit found (issue 30), checked
against a plain reference or the exact rule, so that planting the bug back fails here.

1. exact MaxSim mining trimmed documents to the largest *count* of scoring tokens, cutting the tail of
   documents with punctuation: mining's scores must equal evaluation's on the same texts;
2. a cross-encoder with two (or three) logits handed every row its neighbours' scores;
3. BM25 handed out documents it scored 0 as negatives;
4. a restarted mining phase reused parts made with another ``query_chunk`` or ``negatives``;
5. a copy of the positive under another id became its own negative;
6. an elastic job without the gather changed its loss with the world size;
7. teacher scores were not the same bits on 1 and 2 ranks.
"""

from __future__ import annotations

import json
import random

import pyarrow.parquet as pq
import pytest
import torch
import yaml

from tests.helpers import write_triplets
from tests.helpers.mining import mining_job, pairs_config, run_trainer
from trainer.config.load import parse_config
from trainer.config.schema import ConfigError
from trainer.env import Layout
from trainer.mine import choose_negatives, load_pairs, mine

PUNCTUATED = [
    "alpha beta gamma delta epsilon zeta eta theta iota kappa",  # 10 words, no punctuation
    "one , two ; three : four . five ! six ? seven , eight ; nine : ten .",  # 10 words + 10 punctuation marks
    "short text",
    "a b c , d e f ; g h i : j k l . m n o",
]


# ---- 1. mining's MaxSim is evaluation's -------------------------------------------------------------------


def test_exact_mining_scores_every_document_as_evaluation_does(tiny_model):
    """The second document's last words lie past the largest count of scoring tokens (the mask drops its
    punctuation): trimming to that count cut them off, and its score changed."""
    from trainer.config.schema import ModelConfig
    from trainer.evaluate import BeirSplit, search
    from trainer.model import build_model
    from trainer.retrieval.exact import ModelRetriever

    torch.manual_seed(0)
    model = build_model(ModelConfig(name_or_path=str(tiny_model), query_length=16, document_length=48), "cpu")
    queries = ["two three seven ten", "alpha kappa", "m n o"]
    retriever = ModelRetriever(model, PUNCTUATED, batch_size=2, device=torch.device("cpu"), show=False)
    found, _ = retriever.search(queries, [set() for _ in queries], k=len(PUNCTUATED))
    split = BeirSplit([str(i) for i in range(len(PUNCTUATED))], PUNCTUATED, ["q0", "q1", "q2"], queries, {})
    reference = search(model, split, batch_size=2)  # evaluation's exact MaxSim, untrimmed, float32
    for qi, cands in enumerate(found):
        mined = {d: s for d, s in cands}
        evaluated = {int(d): s for d, s in reference[f"q{qi}"].items()}
        assert mined.keys() == evaluated.keys()
        for d in mined:  # the corpus is kept in fp16: equal to its rounding, far below a lost token's share
            assert mined[d] == pytest.approx(evaluated[d], abs=2e-3), (qi, d, mined[d], evaluated[d])
    # and every scoring token survives: the kept mask holds as many tokens as the untrimmed one
    from trainer.encode import embed_texts

    _, mask = embed_texts(model, PUNCTUATED, False, 2, model.document_length, torch.device("cpu"))
    kept = torch.cat([m for _, _, m in retriever.chunks])
    assert kept.sum(1).tolist() == mask.sum(1).tolist()


# ---- 2. a teacher gives one score per pair ------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_logit_cross_encoder(tmp_path_factory, tiny_model):
    """transformers' default sequence-classification head: two logits per pair."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    path = tmp_path_factory.mktemp("ce-2")
    BertForSequenceClassification(BertConfig.from_pretrained(tiny_model, num_labels=2)).save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(path)
    return path


def test_a_cross_encoder_with_two_logits_is_refused_in_one_line(two_logit_cross_encoder):
    from trainer.teacher import TeacherError, teacher_kind

    with pytest.raises(TeacherError) as e:
        teacher_kind(str(two_logit_cross_encoder))
    assert "gives 2 logits per pair" in str(e.value) and "num_labels 1" in str(e.value) and "\n" not in str(e.value)


def test_teacher_scores_are_the_models_own_for_each_pair_and_a_miscount_is_refused(tmp_path, tiny_model):
    """Each row's scores are what the cross-encoder says of that row's pairs, called directly; a model that
    answers with more than one value per pair (a config that lies) is refused, not sliced."""
    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from trainer.config.mine import TeacherConfig
    from trainer.config.schema import ModelConfig
    from trainer.teacher import Teacher, TeacherError

    path = tmp_path / "ce-1"
    BertForSequenceClassification(BertConfig.from_pretrained(tiny_model, num_labels=1)).save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(path)
    teacher = Teacher(TeacherConfig(name_or_path=str(path), batch_size=3), ModelConfig(), torch.device("cpu"))
    queries = ["sort a list", "open a file", "parse json"]
    documents = [["sorted returns a new list", "open files"], ["the open builtin", "json.loads", "x"], ["json"]]
    scores = teacher.score(queries, documents)
    direct = CrossEncoder(str(path), device="cpu", max_length=256)
    for q, docs, got in zip(queries, documents, scores):
        alone = direct.predict([(q, d) for d in docs], activation_fn=torch.nn.Identity())
        assert got == pytest.approx([float(v) for v in alone], abs=1e-5)

    real = teacher.model.predict
    teacher.model.predict = lambda pairs, **kw: torch.zeros(len(pairs), 2)  # two logits behind a 1-label config
    with pytest.raises(TeacherError, match="gave 4 scores for 2 pairs"):
        teacher.score(["q"], [["a", "b"]])
    teacher.model.predict = real


@pytest.mark.slow
def test_a_bi_encoder_teacher_scores_each_pair_by_its_scaled_cosine(tmp_path, tiny_model):
    """Against a plain reference: each row's scores are scale x the cosine of the bi-encoder's own
    normalised embeddings of that row's query and documents, in the row's order (rows of unequal length)."""
    from sentence_transformers import SentenceTransformer, models

    from trainer.config.mine import TeacherConfig
    from trainer.config.schema import ModelConfig
    from trainer.teacher import Teacher, teacher_kind

    path = tmp_path / "bi"
    word = models.Transformer(str(tiny_model))
    SentenceTransformer(modules=[word, models.Pooling(word.get_word_embedding_dimension())]).save(str(path))
    assert teacher_kind(str(path)) == "bi-encoder"
    teacher = Teacher(
        TeacherConfig(name_or_path=str(path), batch_size=2, scale=7.0), ModelConfig(), torch.device("cpu")
    )
    queries = ["sort a list", "open a file", "parse json"]
    documents = [["sorted returns a new list", "open files"], ["the open builtin", "json.loads", "x"], ["json"]]
    scores = teacher.score(queries, documents)
    plain = SentenceTransformer(str(path), device="cpu")
    for q, docs, got in zip(queries, documents, scores):
        qv = plain.encode([q], normalize_embeddings=True)[0]
        want = [7.0 * float((qv * plain.encode([d], normalize_embeddings=True)[0]).sum()) for d in docs]
        assert got == pytest.approx(want, abs=1e-5)
    assert len({round(s, 6) for row in scores for s in row}) > 1  # not one constant
    assert teacher.score([], []) == [] and teacher.score(["q"], [[]]) == [[]]  # a part whose rows all dropped


# ---- 3. BM25: a document it scored 0 is never a negative ----------------------------------------------------


def test_bm25_never_hands_out_a_document_it_scored_zero(tmp_path, caplog):
    """A query sharing its words with only a few documents got the corpus's first documents (score 0, in
    corpus order) as negatives; a query no document matches (CJK is one bm25s token) kept its row."""
    rows = [{"query": f"sorting list number{i}", "positive": f"document{i} about sorting a list"} for i in range(8)]
    rows += [{"query": f"plain text note{i}", "positive": f"plain text {i} of nothing"} for i in range(8)]
    rows.append({"query": "rare zebra", "positive": "a zebra page"})  # one other document shares no word
    rows.append({"query": "日本語のテキスト", "positive": "a Japanese text"})
    cfg = pairs_config(
        tmp_path, rows, retriever="bm25", top_k=10, rank_range=[1, 5], negatives=2, max_score_ratio=1.0, fallback="drop"
    )  # its concern: what BM25 itself hands out
    with caplog.at_level("INFO", logger="trainer"):
        table = pq.read_table(mine(cfg, Layout(), tmp_path / "mined"))
    for scores in table.column("scores").to_pylist():
        assert all(s > 0 for s in scores[1:]), scores  # positive first, then each negative's BM25 score
    kept = set(table.column("query").to_pylist())
    assert "rare zebra" not in kept and "日本語のテキスト" not in kept
    dropped = json.loads((tmp_path / "mined" / "mining.json").read_text())["dropped"]
    assert dropped["unmatched"] == 2, dropped
    assert any("BM25 scored too few documents above 0" in r.getMessage() for r in caplog.records)


# ---- 4. a restart never mixes parts mined from other inputs -----------------------------------------------


def _bm25_rows(tmp_path, name, **mine_kw):
    rows = [
        {"query": f"how to sort list {i} quickly", "positive": f"sorting list {i} with sorted and key"}
        for i in range(21)
    ]
    (tmp_path / name).mkdir()
    return pairs_config(
        tmp_path / name, rows, retriever="bm25", top_k=12, rank_range=[1, 8], max_score_ratio=1.0, **mine_kw
    )


def test_a_restart_with_another_query_chunk_or_negatives_mines_again_never_mixes(tmp_path, caplog):
    """After a query_chunk change 15 rows came out twice and 6 not at all; after a negatives change training
    failed on rows of two widths. The parts now carry what they were mined from."""
    out = tmp_path / "mined"
    first = _bm25_rows(tmp_path, "a", negatives=2, query_chunk=8)
    mine(first, Layout(), out)
    (out / "train.parquet").unlink()  # killed before the join: the parts stay
    for change, name in ((dict(negatives=2, query_chunk=5), "b"), (dict(negatives=3, query_chunk=5), "c")):
        cfg = _bm25_rows(tmp_path, name, **change)
        cfg = cfg.model_copy(update={"data": first.data})  # the same data.train, only mine: changes
        fresh = tmp_path / f"fresh-{name}"
        with caplog.at_level("WARNING", logger="trainer"):
            resumed = pq.read_table(mine(cfg, Layout(), out))
        assert any("mined from other inputs" in r.getMessage() for r in caplog.records)
        alone = pq.read_table(mine(cfg, Layout(), fresh))
        assert resumed.equals(alone)  # what an uninterrupted run with the new settings writes
        rows = resumed.column("row").to_pylist()
        assert len(rows) == len(set(rows)) == 21
        assert {len(n) for n in resumed.column("negatives").to_pylist()} == {change["negatives"]}
        caplog.clear()
    # the same settings again: the parts are trusted, nothing is mined
    again = pq.read_table(mine(cfg, Layout(), out))
    assert again.equals(alone) and not any("other inputs" in r.getMessage() for r in caplog.records)


# ---- 5. a copy of the positive is a positive ---------------------------------------------------------------


def test_a_copy_of_the_positive_under_another_id_is_never_its_negative(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    texts = ["sorting a list with sorted", "a list of files", "sorting a list with sorted", "parsing a list", "zip"]
    corpus.write_text("".join(json.dumps({"_id": str(i), "text": t}) + "\n" for i, t in enumerate(texts)))
    cfg = pairs_config(
        tmp_path,
        [{"query": "sorting a list", "positive": texts[0]}],
        corpus=str(corpus),
        retriever="bm25",
        top_k=4,
        rank_range=[1, 3],
        negatives=1,
        max_score_ratio=1.0,
    )
    assert load_pairs(cfg).positives == [{0, 2}]
    # the copy scores exactly the positive's score: ratio 1.0 (allowed) admitted it; so does a positive at <= 0
    assert choose_negatives([(2, 5.0), (1, 1.0)], {0, 2}, 5.0, cfg.mine, random.Random(0)) == [(1, 1.0)]
    table = pq.read_table(mine(cfg, Layout(), tmp_path / "mined"))
    assert texts[0] not in table.column("negatives")[0].as_py()


# ---- rows_per_query: every positive still counts ------------------------------------------------------------


def test_rows_per_query_keeps_a_sample_of_rows_and_every_positive_still_counts(tmp_path):
    rows = [{"query": "sorting lists", "positive": f"sorting lists way {i}"} for i in range(6)]
    rows += [{"query": f"other {i}", "positive": f"other document {i} sorting lists"} for i in range(6)]
    cfg = pairs_config(
        tmp_path,
        rows,
        retriever="bm25",
        top_k=10,
        rank_range=[1, 6],
        negatives=2,
        max_score_ratio=1.0,
        rows_per_query=2,
    )
    table = pq.read_table(mine(cfg, Layout(), tmp_path / "mined"))
    first = [r for r in table.to_pylist() if r["query"] == "sorting lists"]
    assert len(first) == 2  # 2 of its 6 rows
    positives = {f"sorting lists way {i}" for i in range(6)}
    assert all(not positives & set(r["negatives"]) for r in first)  # no positive of the 4 rows left out
    assert json.loads((tmp_path / "mined" / "mining.json").read_text())["dropped"]["rows_per_query"] == 4


# ---- 6. an elastic contrastive job gathers ---------------------------------------------------------------------


def test_global_batch_without_the_gather_is_refused_for_contrastive_losses():
    base = {
        "data": {"train": {"path": "t"}},
        "training": {"max_steps": 1, "global_batch_size": 8, "gather_across_devices": False},
    }
    with pytest.raises(ConfigError) as e:
        parse_config(base)
    assert "loss changes with the world size" in str(e.value) and "\n" not in str(e.value)
    parse_config({**base, "loss": {"name": "distillation"}})  # its loss is per query: any split is the same


# ---- 7. teacher scores: the same bits on any world size --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["cross-encoder", "bi-encoder"])
def test_teacher_scores_are_the_same_bits_on_one_rank_and_two(tmp_path, tiny_model, kind):
    """More rows (a cross-encoder's unit) and texts (a bi-encoder's) than a block, so both ranks score: dealt
    one by one, a rank's batches held other rows (other padding) than one rank's did."""
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    ce = tmp_path / "ce"
    torch.manual_seed(0)
    if kind == "cross-encoder":
        BertForSequenceClassification(BertConfig.from_pretrained(tiny_model, num_labels=1)).save_pretrained(ce)
        AutoTokenizer.from_pretrained(tiny_model).save_pretrained(ce)
    else:
        word = models.Transformer(str(tiny_model))
        SentenceTransformer(modules=[word, models.Pooling(word.get_word_embedding_dimension())]).save(str(ce))
    data = write_triplets(tmp_path / "t.jsonl", 150)
    tables = []
    for world in (1, 2):
        ws = tmp_path / f"w{world}"
        ws.mkdir()
        config = mining_job(
            ws, tiny_model, data, retriever="bm25", teacher={"name_or_path": str(ce), "batch_size": 5}, query_chunk=1000
        )
        cfg = yaml.safe_load(config.read_text())
        cfg["loss"] = {"name": "distillation"}
        config.write_text(yaml.safe_dump(cfg))
        res = run_trainer(config, ws, world)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
        tables.append(pq.read_table(ws / "out" / "mined" / "round-1" / "train.parquet"))
    assert tables[0].num_rows > 64 and tables[0].equals(tables[1])


def _plain_maxsim(query: torch.Tensor, document: torch.Tensor) -> float:
    """Each query vector's best dot product with the document's own vectors, summed: a loop, no padding."""
    return sum(max(float(q @ d) for d in document) for q in query)


@pytest.mark.slow
def test_a_colbert_teachers_scores_are_each_documents_own_maxsim(tmp_path, tiny_model, monkeypatch):
    """Against a plain reference. The model's own scores of rows of unequal length (each text encoded alone,
    MaxSim in a loop) equal the teacher's, row by row; then, with encoder outputs made to order, a document
    whose best match for a query vector is negative, padded beside a longer one in the same block, keeps that
    negative (PyLate's masked product lifted it to 0)."""
    import trainer.teacher as teacher_module
    from trainer.config.mine import TeacherConfig
    from trainer.config.schema import ModelConfig
    from trainer.model import build_model
    from trainer.teacher import Teacher, teacher_kind

    torch.manual_seed(0)
    lengths = ModelConfig(name_or_path=str(tiny_model), query_length=8, document_length=24)
    path = tmp_path / "colbert"
    build_model(lengths, "cpu").save(str(path))
    assert teacher_kind(str(path)) == "colbert"
    teacher = Teacher(TeacherConfig(name_or_path=str(path), batch_size=2), lengths, torch.device("cpu"))
    queries = ["sort a list", "open a file", "parse json"]
    documents = [["sorted returns a new list of all the numbers", "open"], ["the open builtin", "x", "json"], ["j"]]
    scores = teacher.score(queries, documents)
    model = teacher.model
    for q, docs, got in zip(queries, documents, scores):
        qv = torch.tensor(model.encode([q], is_query=True)[0])
        want = [_plain_maxsim(qv, torch.tensor(model.encode([d], is_query=False)[0])) for d in docs]
        assert got == pytest.approx(want, abs=1e-4)
    assert len({round(x, 4) for row in scores for x in row}) > 3  # not a constant

    # a query vector [1, 0]; document "short" has one vector [-1, 0] (best match -1), padded to "long"'s three
    made = {
        True: (torch.tensor([[[1.0, 0.0]]]), torch.tensor([[True]])),
        False: (
            torch.tensor([[[-1.0, 0.0], [0.0, 0.0], [0.0, 0.0]], [[0.0, 1.0], [0.6, 0.8], [0.8, 0.6]]]),
            torch.tensor([[True, False, False], [True, True, True]]),
        ),
    }
    monkeypatch.setattr(teacher_module, "embed_texts", lambda m, texts, is_query, *a: made[is_query])
    assert teacher.score(["q"], [["short", "long"]]) == [pytest.approx([-1.0, 0.8])]


# ---- what a mined job records as its training data ------------------------------------------------------------


@pytest.mark.slow
def test_a_mined_job_records_its_own_data_train_not_the_mined_rows(tmp_path, tiny_model):
    """Mined rows replace data.train in training; metrics.json (and so the card) still names the user's pairs."""
    data = write_triplets(tmp_path / "t.jsonl", 32)
    config = mining_job(tmp_path, tiny_model, data, retriever="bm25")
    res = run_trainer(config, tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["train_data"] == str(data)


@pytest.mark.slow
def test_changed_mining_settings_under_training_checkpoints_are_refused_before_mining(tmp_path, tiny_model):
    """mine.negatives 2 -> 3 reused the old rows while the scale line said 3; re-mined, the checkpoint would
    go on training on other rows. A round with checkpoints now refuses the change in one line."""
    import shutil

    data = write_triplets(tmp_path / "t.jsonl", 32)
    config = mining_job(tmp_path, tiny_model, data, retriever="bm25")
    assert run_trainer(config, tmp_path).returncode == 0
    out = tmp_path / "out"
    assert list((out / "checkpoints").glob("step-*"))  # every_steps 1: the step-1 checkpoint stays
    (out / "metrics.json").unlink()  # as if killed after that checkpoint
    shutil.rmtree(out / "final-model")
    cfg = yaml.safe_load(config.read_text())
    cfg["mine"]["negatives"] = 3
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(cfg))
    res = run_trainer(changed, tmp_path)
    errors = [line for line in res.stdout.splitlines() if "error:" in line]
    assert res.returncode == 2 and len(errors) == 1, res.stdout[-3000:]
    assert "the mining inputs changed (mine.negatives: 2 -> 3)" in errors[0] and "Traceback" not in res.stdout
    assert "mine: retrieving" not in res.stdout  # refused before any mining
    res = run_trainer(config, tmp_path)  # set back: resumes
    assert res.returncode == 0 and "resumed from" in res.stdout, res.stdout[-3000:]


def test_a_truncated_mined_part_is_mined_again_not_trusted(tmp_path, caplog):
    """A truncated part counted as done, and every restart died in a 40-line ArrowInvalid traceback."""
    out = tmp_path / "mined"
    cfg = _bm25_rows(tmp_path, "a", negatives=2, query_chunk=8)
    whole = pq.read_table(mine(cfg, Layout(), out))
    (out / "train.parquet").unlink()  # killed before the join, with part 1 cut short
    part = out / "part-00001.parquet"
    part.write_bytes(part.read_bytes()[:100])
    with caplog.at_level("WARNING", logger="trainer"):
        again = pq.read_table(mine(cfg, Layout(), out))
    assert again.equals(whole)
    assert any("part-00001.parquet is unreadable" in r.getMessage() for r in caplog.records)


def test_truncated_mined_rows_are_joined_again_from_their_parts_not_refused(tmp_path, caplog):
    """A train.parquet cut short (a full disk, a copy) was "mined rows found", and training refused it in one line
    that no restart could help. Mined rows are derived data: the file is removed and joined again."""
    out = tmp_path / "mined"
    cfg = _bm25_rows(tmp_path, "a", negatives=2, query_chunk=8)
    whole = (mine(cfg, Layout(), out)).read_bytes()
    (out / "train.parquet").write_bytes(whole[: len(whole) // 2])
    caplog.clear()  # only the second pass's lines (the first one's are INFO where an earlier test set the level)
    with caplog.at_level("WARNING", logger="trainer"):
        again = mine(cfg, Layout(), out)
    assert again.read_bytes() == whole
    said = [r.getMessage() for r in caplog.records if "train.parquet" in r.getMessage()]
    assert len(said) == 1 and "is unreadable" in said[0] and "joining it again from its parts" in said[0], said
