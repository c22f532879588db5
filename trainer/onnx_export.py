"""A faster CPU encoder: the model's query and document encoder exported to ONNX, run by ONNX Runtime, checked.

:func:`export` writes ``onnx/`` beside a PyLate model directory (whole or absent: built under a temporary name,
its manifest last, then renamed):

* ``model.onnx``: the encoder in float32, the PyLate model's own modules (the transformer and its projection)
  and the L2 normalisation PyLate's ``encode`` applies, inputs ``input_ids``, ``attention_mask`` (and
  ``token_type_ids`` where the transformer takes them), output ``output`` ``(batch, tokens, dim)``;
* ``model_int8.onnx``: the same, its weights dynamically quantised to int8 (ONNX Runtime's ``quantize_dynamic``);
* the tokenizer and ``colbert.json``, the settings PyLate's ``tokenize`` and ``encode`` apply (prefix token ids,
  query and document lengths, [MASK] query expansion, whether expansion tokens are attended, the skiplist);
* ``parity.json``: the largest token-embedding error of each form against the PyTorch model on a fixed sample,
  and nDCG@10 of each on the held-out split by the evaluation's own exact search (``trainer/evaluate.py``). int8
  may lose at most ``max_int8_loss`` (:data:`MAX_INT8_LOSS` unless the config says otherwise); ``int8_ok`` says
  whether it did not, and ``serve --onnx int8`` refuses it otherwise without ``--allow-int8-loss``.

:class:`OnnxEncoder` tokenizes as PyLate does and runs a form in ONNX Runtime: the project's encode functions
(``trainer/encode.py``, the evaluation's and serving's searches) take it where they take the PyTorch model.

The export is ``torch.onnx.export`` and ``onnxruntime.quantization``, what ``pylate-onnx-export`` 0.1.0 runs,
written here because that tool, read at 0.1.0, records ``do_query_expansion: false`` (it loads the model with
expansion off, so a reader of its settings drops the [MASK] tokens every query of this trainer carries), writes
``config_sentence_transformers.json`` (a PyLate model's own file) into its output folder, keeps an existing
``model.onnx`` unless forced (not whole or absent), and exports only the first projection layer (``[1].linear``).
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from trainer.config.outputs import MAX_INT8_LOSS  # the reason for its value is there

__all__ = [
    "FORMS",
    "MAX_INT8_LOSS",
    "ONNX_DIR",
    "PARITY",
    "OnnxEncoder",
    "export",
    "largest_difference",
    "measure",
    "parity_sample",
    "token_embeddings",
]

log = logging.getLogger("trainer")

ONNX_DIR = "onnx"  # beside the model's weights: final-model/onnx/, exported with the model
FORMS = {"fp32": "model.onnx", "int8": "model_int8.onnx"}
SETTINGS = "colbert.json"
PARITY = "parity.json"
SAMPLE = 32  # held-out queries and documents whose every token embedding is compared
_FIXED_SAMPLE = [  # without a held-out split: texts enough to touch the prefixes, expansion and the skiplist
    "how does late interaction score a query against a document?",
    "ColBERT keeps one vector per token; MaxSim sums, over the query's tokens, each one's best match.",
    "A PLAID index compresses token vectors to centroids and residuals, searched in milliseconds.",
    "what is int8 quantization?",
]


class OnnxEncoder:
    """One exported form of the encoder in ONNX Runtime, tokenizing as PyLate's ``tokenize`` does.

    Takes the PyTorch model's place in ``trainer/encode.py`` (``tokenize``, a call that gives
    ``token_embeddings``, ``skiplist``, the lengths) and in serving (``encode``, PyLate's signature)."""

    def __init__(self, onnx_dir: Path, form: str = "fp32", threads: int | None = None):
        import onnxruntime as ort
        from transformers import AutoTokenizer

        settings = json.loads((Path(onnx_dir) / SETTINGS).read_text())
        self.settings, self.form = settings, form
        self.query_length, self.document_length = settings["query_length"], settings["document_length"]
        self.skiplist: list[int] = settings["skiplist"]
        self.tokenizer = AutoTokenizer.from_pretrained(str(onnx_dir))
        self.tokenizer.pad_token_id = settings["pad_token_id"]  # PyLate pads with [MASK]: the query expansion
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        path = str(Path(onnx_dir) / FORMS[form])
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]

    def eval(self) -> OnnxEncoder:
        return self

    def tokenize(self, texts: list[str], is_query: bool = True) -> dict[str, torch.Tensor]:
        """PyLate's ``tokenize``: stripped (and lower-cased where the model's tokenizer is), truncated to the length
        less the prefix, the prefix token after the first, queries padded with [MASK] to the query length."""
        s = self.settings
        length = s["query_length"] if is_query else s["document_length"]
        prefix = s["query_prefix_id"] if is_query else s["document_prefix_id"]
        texts = [str(t).strip().lower() if s["do_lower_case"] else str(t).strip() for t in texts]
        pad = "max_length" if is_query and s["do_query_expansion"] else True
        limit = length - 1 if prefix is not None else length
        out = self.tokenizer(texts, padding=pad, truncation="longest_first", max_length=limit, return_tensors="pt")
        features = {k: out[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in out}
        if prefix is not None:
            for key, value in (("input_ids", prefix), ("attention_mask", 1), ("token_type_ids", 0)):
                if key in features:
                    t = features[key]  # (n, tokens)
                    features[key] = torch.cat([t[:, :1], torch.full_like(t[:, :1], value), t[:, 1:]], dim=1)
        if is_query and s["attend_to_expansion_tokens"]:
            features["attention_mask"].fill_(1)
        return features

    def __call__(self, features: dict) -> dict[str, torch.Tensor]:
        """The token embeddings ``(n, tokens, dim)``, L2-normalised, of a tokenized batch."""
        feed = {name: np.ascontiguousarray(features[name].cpu().numpy(), dtype=np.int64) for name in self.inputs}
        (out,) = self.session.run(["output"], feed)
        return {**features, "token_embeddings": torch.from_numpy(out).to(features["input_ids"].device)}

    def encode(self, texts: list[str], is_query: bool, batch_size: int = 32, **_) -> list[np.ndarray]:
        """PyLate's ``encode``: each text's token embeddings ``(tokens, dim)``, float32; a document's padding and
        skiplist tokens dropped, a query's every token kept when it is expanded (its padding dropped if not).
        Texts are encoded longest first, so short ones are not padded to long ones."""
        order = np.argsort([-len(t) for t in texts], kind="stable")
        found: list = [None] * len(texts)
        skip = torch.tensor(self.skiplist, dtype=torch.long)
        for start in range(0, len(texts), batch_size):
            at = order[start : start + batch_size]
            features = self.tokenize([texts[i] for i in at], is_query=is_query)
            emb = self(features)["token_embeddings"]  # (batch, tokens, dim)
            if not is_query:
                mask = features["attention_mask"].bool() & ~torch.isin(features["input_ids"], skip)
            elif self.settings["do_query_expansion"]:
                mask = torch.ones(emb.shape[:2], dtype=torch.bool)
            else:
                mask = features["attention_mask"].bool()
            for i, e, m in zip(at, emb, mask):
                found[i] = e[m].numpy()
        return found


def _settings(model) -> dict:
    """What PyLate's ``tokenize`` and ``encode`` read off the model, for :class:`OnnxEncoder`."""
    return {
        "query_prefix_id": model.query_prefix_id,
        "document_prefix_id": model.document_prefix_id,
        "query_length": model.query_length,
        "document_length": model.document_length,
        "do_query_expansion": bool(model.do_query_expansion),
        "attend_to_expansion_tokens": bool(model.attend_to_expansion_tokens),
        "skiplist": [int(i) for i in model.skiplist],
        "pad_token_id": int(model.tokenizer.pad_token_id),
        "do_lower_case": bool(getattr(model[0], "do_lower_case", False)),
    }


class _Graph(torch.nn.Module):
    """The exported graph: the PyLate model's modules in order, then L2 normalisation, as its ``encode``."""

    def __init__(self, model, names: list[str]):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        out = self.model(dict(zip(self.names, inputs)))
        return torch.nn.functional.normalize(out["token_embeddings"], p=2, dim=-1)  # (batch, tokens, dim)


def _write_graphs(model, folder: Path) -> None:
    """``model.onnx`` (float32) and ``model_int8.onnx`` (dynamic int8 weights) of ``model``, on the CPU."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    example = model.tokenize(_FIXED_SAMPLE[:2], is_query=False)
    takes = getattr(model[0], "model_forward_params", None) or {"input_ids", "attention_mask", "token_type_ids"}
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in example and n in takes]
    axes = {n: {0: "batch", 1: "tokens"} for n in [*names, "output"]}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on Python control flow the traced shapes do not take
        # TorchScript's exporter: the dynamo one needs onnxscript, a further dependency, for the same graph here
        torch.onnx.export(
            _Graph(model, names).eval(),
            tuple(example[n] for n in names),
            str(folder / FORMS["fp32"]),
            input_names=names,
            output_names=["output"],
            dynamic_axes=axes,
            opset_version=17,
            do_constant_folding=True,
            dynamo=False,
        )
    logging.getLogger().disabled, was = True, logging.getLogger().disabled  # its pre-processing advice
    try:
        quantize_dynamic(str(folder / FORMS["fp32"]), str(folder / FORMS["int8"]), weight_type=QuantType.QInt8)
    finally:
        logging.getLogger().disabled = was


def parity_sample(split=None) -> tuple[list[str], list[str]]:
    """The queries and documents a parity compares: the first :data:`SAMPLE` of a held-out ``split``'s, else a
    few fixed texts."""
    return (split.queries[:SAMPLE], split.corpus[:SAMPLE]) if split else (_FIXED_SAMPLE, _FIXED_SAMPLE)


def token_embeddings(
    encoder, sample: tuple[list[str], list[str]], model, batch_size: int = 32, device: str | torch.device = "cpu"
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``encoder``'s token embeddings ``(n, length, dim)`` and masks of the sample's queries, then its documents,
    by the evaluation's encode, padded to ``model``'s query and document lengths."""
    from trainer.encode import embed_texts

    lengths = (model.query_length, model.document_length)
    return [
        embed_texts(encoder, texts, is_query, batch_size, length, device)
        for texts, is_query, length in zip(sample, (True, False), lengths)
    ]


def largest_difference(embedded: list, reference: list) -> float:
    """The largest absolute difference of any scoring token embedding (the ``reference``'s mask) between two
    encoders' :func:`token_embeddings` of one sample: 0.0 for the same encoder."""
    return max(
        float((emb - ref)[ref_mask].abs().max()) if ref_mask.any() else 0.0
        for (emb, _), (ref, ref_mask) in zip(embedded, reference)
    )


def measure(model, folder: Path, split=None, max_int8_loss: float = MAX_INT8_LOSS, batch_size: int = 32) -> dict:
    """Each ONNX form against ``model``: the largest token-embedding difference on a fixed sample (the first
    :data:`SAMPLE` held-out queries and documents, else a few fixed texts), and, given a held-out ``split``,
    nDCG@10 by the evaluation's exact search with each encoder, and the seconds each search took."""
    from trainer.evaluate import TOP_K, retrieval_metrics, run_of
    from trainer.retrieval.exact import ModelRetriever

    sample = parity_sample(split)
    encoders = {"torch": model, **{form: OnnxEncoder(folder, form) for form in FORMS}}
    result: dict = {"max_int8_loss": max_int8_loss, "sample": len(sample[0]) + len(sample[1])}
    reference = token_embeddings(model, sample, model, batch_size)
    for form in FORMS:
        result[f"max_token_error_{form}"] = largest_difference(
            token_embeddings(encoders[form], sample, model, batch_size), reference
        )
    if split is not None:
        judged = {q: split.qrels[q] for q in split.query_ids}
        for name, encoder in encoders.items():
            started = time.perf_counter()
            retriever = ModelRetriever(encoder, split.corpus, batch_size, "cpu", show=False, stored=False)
            found, _ = retriever.search(split.queries, [set() for _ in split.queries], TOP_K)
            result[f"seconds_{name}"] = round(time.perf_counter() - started, 2)
            result[f"ndcg@10_{name}"] = round(retrieval_metrics(run_of(split, found), judged)["ndcg@10"], 4)
        result.update(queries=len(split.queries), documents=len(split.corpus))
        result["int8_loss"] = round(result["ndcg@10_torch"] - result["ndcg@10_int8"], 4)
    result["int8_ok"] = split is not None and result["int8_loss"] <= max_int8_loss
    return result


def export(model_dir: Path, split=None, max_int8_loss: float = MAX_INT8_LOSS, batch_size: int = 32) -> dict:
    """``model_dir/onnx/`` written whole (replacing an older one only once the new one is complete), and its
    parity (see :func:`measure`); ``split``: the held-out BEIR split, or None for the token check only."""
    from pylate import models

    from trainer.atomic import replace_dir, whole_or_absent, write_text
    from trainer.run.checkpoint import write_manifest

    model_dir = Path(model_dir)
    model = models.ColBERT(str(model_dir), device="cpu")
    model.eval()
    tmp = model_dir / f".tmp-{ONNX_DIR}-{os.getpid()}"
    with whole_or_absent(tmp, model_dir / ONNX_DIR):
        tmp.mkdir()
        _write_graphs(model, tmp)
        model.tokenizer.save_pretrained(str(tmp))
        write_text(tmp / SETTINGS, json.dumps(_settings(model), indent=2) + "\n")
        parity = measure(model, tmp, split, max_int8_loss, batch_size)
        write_text(tmp / PARITY, json.dumps(parity, indent=2) + "\n")
        write_manifest(tmp)
        replace_dir(tmp, model_dir / ONNX_DIR)
    log.info("onnx: %s written; parity %s", model_dir / ONNX_DIR, json.dumps(parity))
    return parity
