"""Every search of the retrieval room (trainer/retrieval/) against a plain reference: exact MaxSim as mining
stores it and as evaluation streams it, the base model as a bi-encoder, and their fusion with BM25. A
retriever that ranks wrongly would mine wrong negatives and report wrong figures without a word."""

from __future__ import annotations

import math

import pytest
import torch

CORPUS = [
    "alpha beta gamma delta epsilon zeta eta theta iota kappa",
    "one , two ; three : four . five ! six ? seven , eight ; nine : ten .",
    "short text",
    "a b c , d e f ; g h i : j k l . m n o",
    "sorting a list of numbers in place",
    "the right-hand side of an equation",
    "reading a file line by line",
    "alpha kappa omega and the greek letters",
    "two three seven ten are numbers",
    "m n o p q r s t u v",
    "hash tables map keys to values",
    "a binary tree keeps its keys ordered",
]
QUERIES = ["two three seven ten", "alpha kappa", "m n o", "how to sort numbers", "keys and values"]


def _plain_maxsim(model) -> list[list[float]]:
    """MaxSim of every (query, document) pair from PyLate's own token embeddings, by plain loops."""
    q_embs = model.encode(QUERIES, is_query=True, convert_to_numpy=True)
    d_embs = model.encode(CORPUS, is_query=False, convert_to_numpy=True)
    return [[float(sum(max(float(qt @ dt) for dt in d) for qt in q)) for d in d_embs] for q in q_embs]


def _ranked(scores: list[float], k: int) -> list[int]:
    return [i for _, i in sorted((-s, i) for i, s in enumerate(scores))][:k]


@pytest.fixture(scope="module")
def colbert(tiny_model):
    from trainer.config.schema import ModelConfig
    from trainer.model import build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(name_or_path=str(tiny_model), query_length=16, document_length=32), "cpu")
    return model.eval()


@pytest.mark.parametrize("stored", [True, False], ids=["mining (stored, fp16)", "evaluation (streamed)"])
def test_exact_maxsim_ranks_as_a_plain_loop_does(colbert, stored):
    from trainer.retrieval.exact import ModelRetriever

    reference = _plain_maxsim(colbert)
    retriever = ModelRetriever(colbert, CORPUS, batch_size=3, device=torch.device("cpu"), show=False, stored=stored)
    found, positive_scores = retriever.search(QUERIES, [{0}] * len(QUERIES), k=5)
    tolerance = 2e-2 if stored else 1e-4  # mining keeps the corpus in fp16
    for q, top in enumerate(found):
        assert [d for d, _ in top[:5]] == _ranked(reference[q], 5)
        for d, s in top:
            assert math.isclose(s, reference[q][d], rel_tol=tolerance, abs_tol=tolerance)
        assert math.isclose(positive_scores[q][0], reference[q][0], rel_tol=tolerance, abs_tol=tolerance)


def test_a_documents_score_is_its_own_maxsim_whatever_is_padded_beside_it(colbert):
    """A query token whose best similarity in a short document is negative keeps it: zero padding under a mask
    (PyLate's multiplication) would lift it to 0 in every document but the chunk's longest, and a skipped
    punctuation column scores nothing."""
    from trainer.serve.engine import _StoredCorpus  # the exact retriever over chunks stored with an index

    torch.manual_seed(0)
    lengths, dim = [1, 2, 7, 3], 4
    docs = [torch.nn.functional.normalize(torch.randn(n, dim), dim=-1) for n in lengths]
    docs[0] = torch.tensor([[-1.0, 0.0, 0.0, 0.0]])  # every query token below scores it at most 0
    emb = torch.nn.utils.rnn.pad_sequence(docs, batch_first=True)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones(n, dtype=torch.bool) for n in lengths], batch_first=True)
    mask[2, 3] = False  # a skipped punctuation token inside the longest document
    emb[2, 3] = torch.tensor([9.0, 9.0, 9.0, 9.0])  # which would win every maximum if it were scored
    queries = torch.tensor(
        [[[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]], [[-0.5, 0.5, 0.5, 0.5], [0.0, 0.0, 0.0, 1.0]]]
    )
    retriever = _StoredCorpus(colbert, [(0, emb, mask)], batch_size=2, device=torch.device("cpu"))  # serving's
    found, _ = retriever.search_embedded(queries, [set(), set()], k=4)
    for q, top in enumerate(found):
        for d, score in top:
            scoring = emb[d][mask[d]]
            plain = sum(max(float(qt @ dt) for dt in scoring) for qt in queries[q])
            assert math.isclose(score, plain, abs_tol=1e-5), (q, d, score, plain)
        assert len(top) == len(lengths)


def test_evaluation_searches_through_the_exact_retriever(colbert):
    """evaluate.search (the figures in metrics.json) is exact MaxSim over the whole corpus, top 100."""
    from trainer.evaluate import BeirSplit, search

    reference = _plain_maxsim(colbert)
    split = BeirSplit(
        [f"d{i}" for i in range(len(CORPUS))], CORPUS, [f"q{i}" for i in range(len(QUERIES))], QUERIES, {}
    )
    run = search(colbert, split, batch_size=4)
    for q in range(len(QUERIES)):
        got = run[f"q{q}"]
        assert len(got) == len(CORPUS)
        assert [d for d, _ in sorted(got.items(), key=lambda kv: (-kv[1], int(kv[0][1:])))][:10] == [
            f"d{i}" for i in _ranked(reference[q], 10)
        ]
        for d, s in got.items():
            assert math.isclose(s, reference[q][int(d[1:])], rel_tol=1e-4, abs_tol=1e-4)


def test_the_dense_retriever_is_the_bi_encoders_cosine(tiny_model):
    """The base model as a bi-encoder (its own pooling): candidates and scores equal plain cosines."""
    from trainer.retrieval.dense import DenseRetriever, load_bi_encoder

    encoder = load_bi_encoder(str(tiny_model), "cpu")
    q = encoder.encode(QUERIES, convert_to_tensor=True, normalize_embeddings=True)
    d = encoder.encode(CORPUS, convert_to_tensor=True, normalize_embeddings=True)
    reference = [[float(torch.dot(qi, dj)) for dj in d] for qi in q]
    found, positive_scores = DenseRetriever(encoder, CORPUS, batch_size=5, show=False).search(
        QUERIES, [{2}] * len(QUERIES), k=4
    )
    for qi, top in enumerate(found):
        assert [doc for doc, _ in top[:4]] == _ranked(reference[qi], 4)
        assert all(math.isclose(s, reference[qi][doc], abs_tol=1e-5) for doc, s in top)
        assert math.isclose(positive_scores[qi][2], reference[qi][2], abs_tol=1e-5)


def test_hybrid_fuses_bm25_and_dense_by_reciprocal_rank(tiny_model):
    from trainer.retrieval.bm25 import Bm25Retriever
    from trainer.retrieval.dense import DenseRetriever, load_bi_encoder
    from trainer.retrieval.hybrid import RRF_K, HybridRetriever

    dense = DenseRetriever(load_bi_encoder(str(tiny_model), "cpu"), CORPUS, batch_size=5, show=False)
    bm25 = Bm25Retriever(CORPUS, show=False)
    found, positive_scores = HybridRetriever(bm25, dense).search(QUERIES, [{4}] * len(QUERIES), k=3)
    lexical, _ = bm25.search(QUERIES, [{4}] * len(QUERIES), 6)
    semantic, _ = dense.search(QUERIES, [{4}] * len(QUERIES), 6)
    for qi, top in enumerate(found):
        fused: dict[int, float] = {}
        for ranked in ([] if lexical[qi] is None else lexical[qi], semantic[qi]):
            for rank, (doc, _) in enumerate(ranked, 1):
                fused[doc] = fused.get(doc, 0.0) + 1 / (RRF_K + rank)
        want = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[: len(top)]
        assert top == want
        assert positive_scores[qi][4] == fused.get(4, 0.0)
