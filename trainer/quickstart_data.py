"""A real-text retrieval dataset built offline from the Python standard library's docstrings.

Query: an object's one-line summary ("Return the number of items in a deque.").
Positive: the rest of that docstring. Hard negative: the body of another docstring from the *same
module*, so lexical overlap alone does not solve it. Train and test use disjoint modules; the held-out
modules are written in BEIR format (corpus.jsonl, queries.jsonl, qrels/test.tsv and qrels/dev.tsv): one corpus,
a test split of 300 queries, and a dev split of the held-out objects no test query asks for (43 queries), to
choose settings on (``colbert-k8s tune``) without looking at test.

Deterministic for a given Python version: modules, objects and negatives are picked in sorted
order with a fixed seed. ``python -m trainer.quickstart_data OUT_DIR``.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import random
import warnings
from collections.abc import Sequence
from pathlib import Path

__all__ = ["collect", "build", "main", "write_beir"]

TRAIN_MODULES = """
    argparse array ast asyncio base64 bisect bz2 calendar cmd codecs collections concurrent.futures
    configparser contextlib copy csv dataclasses datetime decimal difflib dis email.message enum
    filecmp fnmatch fractions ftplib functools gettext glob gzip hashlib heapq hmac html.parser
    http.client http.cookiejar imaplib inspect io ipaddress itertools json locale logging
    logging.handlers lzma mailbox math mimetypes multiprocessing operator optparse os pathlib pickle
    pkgutil platform plistlib poplib pprint queue random re sched secrets selectors shelve shlex
    shutil signal smtplib socket socketserver sqlite3 ssl statistics string struct
""".split()
TEST_MODULES = """
    subprocess sysconfig tarfile tempfile textwrap threading timeit tokenize trace traceback turtle
    typing unittest urllib.parse urllib.request uuid warnings wave weakref xml.dom.minidom
    xml.etree.ElementTree zipfile zoneinfo
""".split()


def _members(module) -> list[tuple[str, object]]:
    out = []
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(obj):
            out.append((name, obj))
            out += [(f"{name}.{m}", f) for m, f in sorted(vars(obj).items()) if not m.startswith("_") and callable(f)]
        elif callable(obj):
            out.append((name, obj))
    return out


def collect(module_name: str) -> list[dict]:
    """(qualified name, summary, body) for each documented public object of a module."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = importlib.import_module(module_name)
    except Exception:  # a module missing from this Python build (e.g. no _tkinter) is skipped
        return []
    items, seen = [], set()
    for name, obj in _members(module):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            doc = inspect.getdoc(obj) or ""
        lines = doc.strip().splitlines()
        if len(lines) < 3:
            continue
        summary = lines[0].strip()
        body = " ".join(line.strip() for line in lines[1:] if line.strip())
        if len(summary) < 15 or len(body) < 60 or summary in seen:
            continue
        seen.add(summary)
        items.append({"id": f"{module_name}.{name}", "summary": summary, "body": f"{name}: {body}"[:1200]})
    return items


def _triplets(modules: list[str], rng: random.Random) -> list[dict]:
    rows = []
    for mod in modules:
        items = collect(mod)
        if len(items) < 2:
            continue
        for i, item in enumerate(items):
            j = rng.choice([k for k in range(len(items)) if k != i])
            rows.append(
                {"id": item["id"], "query": item["summary"], "positive": item["body"], "negative": items[j]["body"]}
            )
    return rows


def build(out: Path, seed: int = 0, max_test_queries: int = 300, max_dev_queries: int = 100) -> dict[str, int]:
    """Write train.jsonl and a BEIR folder with a test and a dev split under ``out``; return the counts.

    The dev queries are drawn after the test ones, from another generator: train.jsonl, the corpus and the
    test split are the same bytes with or without them (``queries.jsonl`` lists the dev queries after)."""
    rng = random.Random(seed)
    train = _triplets(TRAIN_MODULES, rng)
    test = _triplets(TEST_MODULES, rng)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "train.jsonl").open("w", encoding="utf-8") as f:
        for row in train:
            f.write(json.dumps({k: row[k] for k in ("query", "positive", "negative")}) + "\n")
    queries = rng.sample(test, min(max_test_queries, len(test)))
    asked = {r["id"] for r in queries}
    rest = [r for r in test if r["id"] not in asked]  # documents no test query is about: dev's queries
    dev = random.Random(f"{seed}/dev").sample(rest, min(max_dev_queries, len(rest)))
    # every held-out docstring body is a candidate, not only the queried ones
    write_beir(
        out / "beir",
        [(r["id"], r["positive"]) for r in test],
        [(r["id"], r["query"]) for r in queries],
        dev=[(r["id"], r["query"]) for r in dev],
    )
    return {"train": len(train), "corpus": len(test), "queries": len(queries), "dev_queries": len(dev)}


def write_beir(
    beir: Path,
    documents: list[tuple[str, str]],
    queries: list[tuple[str, str]],
    dev: Sequence[tuple[str, str]] = (),
) -> None:
    """A BEIR folder: ``documents`` as (id, text); each query as (id of its one relevant document, text), in
    ``qrels/test.tsv``, and each of ``dev`` in ``qrels/dev.tsv`` (the ids must differ from the test queries')."""
    (beir / "qrels").mkdir(parents=True, exist_ok=True)
    with (beir / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for doc_id, text in documents:
            f.write(json.dumps({"_id": doc_id, "title": "", "text": text}) + "\n")
    with (beir / "queries.jsonl").open("w", encoding="utf-8") as f:
        for doc_id, text in [*queries, *dev]:
            f.write(json.dumps({"_id": "q:" + doc_id, "text": text}) + "\n")
    for split, judged in (("test", queries), ("dev", dev)):
        if not judged:
            continue
        with (beir / "qrels" / f"{split}.tsv").open("w", encoding="utf-8") as f:
            f.write("query-id\tcorpus-id\tscore\n")
            for doc_id, _ in judged:
                f.write(f"q:{doc_id}\t{doc_id}\t1\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    counts = build(args.out, args.seed)
    print(
        f"wrote {counts['train']} training triplets and BEIR splits of {counts['queries']} test and "
        f"{counts['dev_queries']} dev queries over {counts['corpus']} documents to {args.out}"
    )


if __name__ == "__main__":
    main()
