"""A harder offline benchmark than the quickstart: docstring retrieval over every installed package.

Query: a function's or class's one-line summary. Positive: the rest of its docstring. The documents
come from the source files of the packages installed next to this one (torch, transformers, numpy,
scipy, ...), read with ``ast`` (nothing is imported), so the set holds tens of thousands of
documents. Whole packages are held out for evaluation: the model never sees their style, their
vocabulary or their near-duplicates in training.

Written: ``train.jsonl`` of (query, positive) pairs only (no negatives: mining supplies them),
``corpus.jsonl`` of every training document (what mining searches), and a BEIR split of the held-out
packages. Deterministic for a given set of installed packages.

    python -m trainer.packages_data OUT_DIR [--heldout numpy networkx] [--max-test-queries 1000]
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sysconfig
import warnings
from pathlib import Path

from trainer.quickstart_data import write_beir

__all__ = ["HELDOUT", "build", "collect_package", "main"]

HELDOUT = ["numpy", "networkx"]  # held out whole (about 2,000 documents: one evaluation stays minutes on a CPU)
_SKIP = {"tests", "test", "testing", "_vendor", "vendored", "benchmarks"}


def _packages() -> dict[str, Path]:
    roots = {Path(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")}
    found = {}
    for root in sorted(roots):
        for pkg in sorted(root.iterdir()) if root.is_dir() else []:
            if (pkg / "__init__.py").is_file() and pkg.name.isidentifier() and not pkg.name.startswith("_"):
                found.setdefault(pkg.name, pkg)
    return found


def collect_package(name: str, root: Path) -> list[dict]:
    """(id, summary, body) for each documented function or class in a package's source files."""
    items = []
    for file in sorted(root.rglob("*.py")):
        if _SKIP & set(file.relative_to(root).parts[:-1]) or file.name.startswith("test_"):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tree = ast.parse(file.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError, RecursionError):
            continue
        module = ".".join((name, *file.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            doc = ast.get_docstring(node) or ""
            lines = [line.strip() for line in doc.strip().splitlines()]
            if len(lines) < 3 or node.name.startswith("_"):
                continue
            summary, body = lines[0], " ".join(line for line in lines[1:] if line)
            if len(summary) < 15 or len(body) < 60:
                continue
            items.append(
                {"id": f"{module}.{node.name}:{node.lineno}", "summary": summary, "body": f"{node.name}: {body}"[:1200]}
            )
    return items


def build(
    out: Path,
    heldout: list[str] | None = None,
    max_test_queries: int = 1000,
    seed: int = 0,
    only: list[str] | None = None,
) -> dict:
    """Write the benchmark under ``out``; return its counts and the packages on each side (``only``: just
    these installed packages, for a quick build)."""
    rng = random.Random(seed)
    packages = {k: v for k, v in _packages().items() if only is None or k in only}
    held = [p for p in (heldout or HELDOUT) if p in packages]
    train, test, seen = [], [], set()
    for name, root in packages.items():
        for item in collect_package(name, root):
            if item["summary"] in seen or item["body"] in seen:  # vendored copies, overloads
                continue
            seen |= {item["summary"], item["body"]}
            (test if name in held else train).append(item)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "train.jsonl").open("w", encoding="utf-8") as f:
        for item in train:
            f.write(json.dumps({"query": item["summary"], "positive": item["body"]}) + "\n")
    with (out / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for item in train:
            f.write(json.dumps({"_id": item["id"], "text": item["body"]}) + "\n")
    queries = rng.sample(test, min(max_test_queries, len(test)))
    write_beir(out / "beir", [(i["id"], i["body"]) for i in test], [(i["id"], i["summary"]) for i in queries])
    counts = {
        "train": len(train),
        "test_corpus": len(test),
        "test_queries": len(queries),
        "heldout": held,
        "train_packages": sorted(set(packages) - set(held)),
    }
    (out / "counts.json").write_text(json.dumps(counts, indent=2) + "\n")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--heldout", nargs="+", default=HELDOUT, help="packages held out for evaluation")
    parser.add_argument("--max-test-queries", type=int, default=1000)
    args = parser.parse_args()
    c = build(args.out, args.heldout, args.max_test_queries)
    print(
        f"wrote {c['train']} training pairs from {len(c['train_packages'])} packages and a BEIR split of "
        f"{c['test_queries']} queries over {c['test_corpus']} documents of {', '.join(c['heldout'])} to {args.out}"
    )


if __name__ == "__main__":
    main()
