"""docs/results.md and every generated block come from the research record (lab/), so a figure lives in one place:
the page is current, no plot under docs/ goes unlinked, no headline figure is typed again by hand, and the record
keeps every run's per-query figures through a merge."""

from __future__ import annotations

import json
import re

import pytest

import lab.results as results
from lab import plots, record
from tests.helpers import ROOT

PRODUCT_PAGES = [ROOT / "README.md", *sorted((ROOT / "recipes").glob("*")), *sorted((ROOT / "docs").glob("*.md"))]


def test_the_results_page_and_every_block_are_what_the_record_makes():
    stale = [p.relative_to(ROOT) for p, text in results.generated().items() if p.read_text() != text]
    assert not stale, f"stale: {stale}; run python -m lab.results"


def test_check_fails_on_a_stale_page_and_names_it(tmp_path, monkeypatch, capsys):
    page = tmp_path / "results.md"
    page.write_text(results.page())
    monkeypatch.setattr(results, "PAGE", page)
    monkeypatch.setattr(results, "targets", lambda: [])
    assert results.main(["--check"]) == 0
    page.write_text(page.read_text().replace("0.3322", "0.3323", 1))  # one figure edited by hand
    assert results.main(["--check"]) == 1
    assert "results.md is stale: run python -m lab.results" in capsys.readouterr().err


def _linked(pages) -> set[str]:
    return {
        m.split("/")[-1] for p in pages if p.suffix == ".md" for m in re.findall(r"\]\(([^)\s]+\.png)\)", p.read_text())
    }


def test_every_plot_under_docs_is_linked_from_a_page():
    """A PNG nobody links is dead weight in every clone: commit only what a page shows."""
    pngs = {p.name for p in (ROOT / "docs").rglob("*.png")}
    assert pngs, "no plots at all: the glob is wrong"
    unlinked = pngs - _linked(PRODUCT_PAGES)
    assert not unlinked, f"docs/ holds plots no page links: {sorted(unlinked)}; delete them or link them"


def test_the_plots_the_record_draws_are_the_ones_the_pages_link():
    drawn = set(plots.PLOTS)
    assert drawn <= _linked(PRODUCT_PAGES), sorted(drawn - _linked(PRODUCT_PAGES))


def _headline_figures() -> set[str]:
    """The shipped recipe's NFCorpus test means and the quickstart's trained nDCG@10, as the page prints them."""
    cells = record.nfcorpus_runs(results.study("nfcorpus-recipe"))
    figures = set()
    for (_, split, _), arms in cells.items():
        if split == "test" and results.SHIPPED_ARM in arms:
            runs = arms[results.SHIPPED_ARM].values()
            figures.add(f"{sum(r['ndcg@10'] for r in runs) / len(runs):.4f}")
    quickstart = record.named(results.study("quickstart"))["quickstart"]
    return figures | {f"{quickstart['after']['ndcg@10']:.4f}"}


def test_no_page_restates_a_headline_figure_outside_a_generated_block():
    figures = _headline_figures()
    measured = [
        c
        for c, arms in record.nfcorpus_runs(results.study("nfcorpus-recipe")).items()
        if c[1] == "test" and results.SHIPPED_ARM in arms
    ]
    assert measured and len(figures) == len(measured) + 1  # each NFCorpus test cell the recipe ran in, the quickstart
    found = []
    for page in PRODUCT_PAGES:
        if page == results.PAGE or not page.is_file():
            continue
        text = results.MARKER.sub("", page.read_text())  # what a block holds is generated
        found += [f"{page.relative_to(ROOT)}: {f}" for f in sorted(figures) if f in text]
    assert not found, f"figures typed by hand (link docs/results.md or use a results block instead): {found}"


def _figures_of_record() -> set[str]:
    """docs/tune.md's sweep (each trial's dev and test figures) and the serving targets' ratios, as pages print them."""
    name, line = record.TUNE_SWEEP
    sweep = record.named(results.study(name))[line]
    figures = {f"{t['metric']:.4f}" for t in sweep["trials"]}
    figures |= {f"{v:.4f}" for t in sweep["trials"] for k, v in t.get("test", {}).items() if k != "note"}
    return figures | {x for t in record.bench("serving")["targets"] for x in re.findall(r"\d+\.\d+x", t["measured"])}


def test_no_page_restates_the_sweeps_or_the_serving_figures_outside_a_generated_block():
    figures = _figures_of_record()
    assert len(figures) > 10 and "0.2997" in figures
    found = []
    for page in PRODUCT_PAGES:
        if page == results.PAGE or not page.is_file():
            continue
        text = results.MARKER.sub("", page.read_text())
        found += [
            f"{page.relative_to(ROOT)}: {f}" for f in sorted(figures) if re.search(rf"(?<![\d.]){re.escape(f)}", text)
        ]
    assert not found, f"figures typed by hand (point at the generated block or docs/results.md): {found}"


def test_a_block_fills_between_its_markers_and_an_unknown_one_is_refused():
    text = "a\n<!-- results:quickstart -->\nold\n<!-- /results:quickstart -->\nb\n"
    filled = results.fill(text, ROOT / "README.md")
    assert filled.startswith("a\n<!-- results:quickstart -->\n`bash scripts/quickstart.sh`") and filled.endswith("b\n")
    assert "| after training, exact MaxSim over the corpus | **0.7276** |" in filled and "old" not in filled
    assert results.fill(filled, ROOT / "README.md") == filled  # filling twice changes nothing
    with pytest.raises(record.RecordError, match="README.md: no block 'nope'; name one of quickstart, recipes"):
        results.fill("<!-- results:nope -->\n<!-- /results:nope -->", ROOT / "README.md")


def _result(runs: dict, **settings) -> dict:
    base = {"commit": "abc1234", "labels": "sparse", "split": "test", "steps": 48}
    base |= {"batch": 16, "lr": 5e-05, "document_length": 128, "rows_per_query": 4}
    return {**base, **settings, "runs": runs}


def test_a_merge_keeps_per_query_figures_replaces_a_rerun_and_refuses_other_settings(tmp_path):
    path = tmp_path / "results.jsonl"
    first = {"q2": 0.5, "q1": 0.123456, "q3": 0.0}
    run = {"ndcg@10": 0.2078, "wall_seconds": 10.0, "rows": 3, "per_query": first}
    assert record.put_nfcorpus(path, _result({"a": {"1": run}, "b": {"1": {**run, "ndcg@10": 0.1}}})) == 2
    got = record.nfcorpus_runs(path)[("sparse", "test", 48)]
    assert got["a"][1]["per_query"] == {"q1": 0.1235, "q2": 0.5, "q3": 0}  # 4 digits, every query
    rows = list(record.long_rows(path))
    assert ("sparse", "test", 48, "a", 1, "q1", 0.1235) in rows and len(rows) == 6
    # the same run again, timed again, at a later commit: one run, its first commit, both times kept
    assert record.put_nfcorpus(path, _result({"a": {1: {**run, "wall_seconds": 12.0}}}, commit="def5678")) == 1
    again = record.nfcorpus_runs(path)[("sparse", "test", 48)]["a"][1]
    assert again["commit"] == "abc1234" and again["wall_seconds"] == 12.0 and again["earlier_wall_seconds"] == [10.0]
    # another result for the key: replaced (git keeps the earlier line)
    record.put_nfcorpus(path, _result({"a": {1: {**run, "ndcg@10": 0.3, "per_query": {**first, "q3": 1.0}}}}))
    assert record.nfcorpus_runs(path)[("sparse", "test", 48)]["a"][1]["per_query"]["q3"] == 1
    before = path.read_text()
    with pytest.raises(record.RecordError, match="this study ran at .* the results at {'batch': 32}"):
        record.put_nfcorpus(path, _result({"a": {1: run}}, batch=32))
    with pytest.raises(record.RecordError, match="its test queries are not the study's"):
        record.put_nfcorpus(path, _result({"c": {1: {**run, "per_query": {"other": 1.0}}}}))
    assert path.read_text() == before  # nothing half-written


def test_put_from_the_command_line_says_what_is_wrong_in_one_line(tmp_path, capsys):
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "results.jsonl").write_text(json.dumps({"kind": "benchmarks"}) + "\n")
    bad = tmp_path / "out.json"
    bad.write_text("{not json")
    assert results.main(["--put", str(folder), str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("not a results file (JSONDecodeError); give a bench script's --out") and "\n" not in err
    bad.write_text(json.dumps({"commit": "abc", "x": 1}))
    assert results.main(["--put", str(folder), str(bad)]) == 2
    assert "give --name" in capsys.readouterr().err
    assert results.main(["--put", str(folder), str(bad), "--name", "speed"]) == 0
    assert record.named(folder / "results.jsonl") == {"speed": {"commit": "abc", "x": 1}}
    assert results.main(["--put", str(tmp_path / "nowhere"), str(bad)]) == 2
    assert "no results.jsonl; name a study folder of lab/" in capsys.readouterr().err


def test_the_budget_curve_averages_the_same_seeds_at_every_budget():
    """A point is the mean of exactly the seeds asked for, and an arm that lacks one of them at a budget has no
    point there (a mean over other seeds would draw a flip that is only noise)."""
    run = lambda v: {"ndcg@10": v}  # noqa: E731
    cells = {
        48: {"recipe": {1: run(0.25), 2: run(0.75), 3: run(0.0)}, "reference": {1: run(0.5)}},
        240: {"recipe": {1: run(0.5), 2: run(1.0)}, "dense": {1: run(0.25), 2: run(0.25)}},
    }
    assert plots.curves(cells, [1, 2]) == {"recipe": {48: 0.5, 240: 0.75}, "dense": {240: 0.25}}


def test_equal_compute_pairs_the_recipes_short_runs_with_the_scripts_long_ones_at_their_fastest():
    """The row pairs the shipped recipe's short-budget seeds with the script's long-budget seeds, query by query
    (checked against a plain mean of differences), and gives each arm's fastest run; a protocol without both is
    left out."""
    run = lambda q, wall: {"ndcg@10": sum(q.values()) / len(q), "per_query": q, "wall_seconds": wall}  # noqa: E731
    cells = {
        ("sparse", "test", results.SHORT): {
            results.SHIPPED_ARM: {1: run({"a": 0.5, "b": 0.7}, 900.0), 2: run({"a": 0.6, "b": 0.4}, 700.0)},
        },
        ("sparse", "test", results.LONG): {
            "reference": {1: run({"a": 0.4, "b": 0.6}, 1000.0), 2: run({"a": 0.5, "b": 0.3}, 1200.0)},
        },
        ("full", "test", results.SHORT): {
            results.SHIPPED_ARM: {1: run({"a": 0.5}, 1.0)}
        },  # no script at the long budget
    }
    rows = results.equal_compute(cells).splitlines()[2:]
    assert rows == [
        "| one positive per query | **0.5500** (2 seeds) | 700 | 0.4500 (2 seeds) | 1,000 | +0.100 [+0.100, +0.100] |"
    ]


def test_the_records_examples_run():
    """lab/ is not under pytest's doctest paths (it is not the product); its ``>>>`` examples run here."""
    import doctest

    import lab.plots

    for module in (record, results, lab.plots):
        failed, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert tried and not failed, module.__name__


@pytest.mark.parametrize(
    "run, header, row",
    [
        pytest.param(
            {"recall@100": 0.3, "rows_trained_on": 9, "per_query": {"q": 0.5, "r": 0.7}},
            "| over base (worst seed) [95% interval] | Recall@100 |",
            "| +0.1000 (+0.1000) [+0.1000, +0.1000] | 0.300 | 9 |",
            id="recall and per-query figures",
        ),
        pytest.param(
            {"rows_trained_on": 9},
            "| over base (worst seed) | Recall@100 |",
            "| +0.1000 (+0.1000) | - | 9 |",
            id="neither (the docstring benchmark)",
        ),
    ],
)
def test_one_arm_table_for_every_study_shows_only_the_figures_its_runs_have(tmp_path, run, header, row):
    """The NFCorpus studies and the docstring benchmark share one table: a figure a run lacks is ``-``, never a
    0 it did not score, and the 95% interval is named only where per-query figures make one."""
    base = {k: (v if k != "per_query" else {q: s - 0.1 for q, s in v.items()}) for k, v in run.items()}
    lines = [
        {"kind": "mining-quality"},
        {"protocol": "p", "commit": "c", "baselines": ["base"], "data": "d", "limit": None, "steps": 1},
        {"protocol": "p", "arm": "base", "seed": 1, "ndcg@10": 0.5, "wall_seconds": 1.0, **base},
        {"protocol": "p", "arm": "new", "seed": 1, "ndcg@10": 0.6, "wall_seconds": 1.0, **run},
    ]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (_, runs), *_ = record.mining_quality_runs(tmp_path / "results.jsonl").values()
    text = record.table(record.summarize(runs, ("base",)), ("base",))
    assert header in text and f"| new | 1 | 0.6000 ± 0.0000 {row}" in text


def test_corpus_sizes_measured_apart_each_name_their_load_and_commit(monkeypatch):
    """bench/corpus_scale.py records each size's load: sizes measured in separate runs keep their own."""
    import lab.results

    served = [{"clients": 1, "qps": 1.0, "p50_ms": 10.0, "p99_ms": 20.0, "ok": 10, "requests": 10}]
    run = {"build_seconds": 1.0, "peak_rss_mb": 2, "rss_before_mb": 1, "index_mb": 1.0}
    run |= {"index_bytes_per_document": 9, "in_process": {"p50_ms": 1.0, "p99_ms": 2.0}, "served": served}
    header = {"date": "d", "commit": "c2", "machine": "m", "load": "9.0 to 9.0", "corpus": "synthetic"}
    header |= {"encoder": "tiny", "chunk": 10, "rate": 1.0, "duration": 1.0}
    record = header | {
        "runs": [
            {"documents": 10, **run, "load": "4.1 to 5.2", "commit": "c1"},
            {"documents": 100, **run, "load": "2.0 to 2.2", "commit": "c2"},
            {"documents": 1000, "skipped": True, "projected_minutes": 9.0, "projected_peak_gib": 1.0},
        ]
    }
    monkeypatch.setattr(lab.results, "bench", lambda name: record)
    table = lab.results.corpus_scale_table()
    assert "each size's load average in its row" in table and "9.0 to 9.0" not in table
    rows = [line for line in table.splitlines() if line.startswith("| 1")]
    assert rows[0].endswith("| 4.1 to 5.2 (`c1`) |") and rows[1].endswith("| 2.0 to 2.2 (`c2`) |")
    assert all(line.count("|") == rows[0].count("|") for line in rows)
    del record["runs"][0]["load"], record["runs"][1]["load"]  # one run measured every size: one load
    assert "load average 9.0 to 9.0" in lab.results.corpus_scale_table()


def _tune_study(tmp_path, monkeypatch, edit=lambda line: line) -> dict:
    """docs/tune.md's sweep read from a copy of its record, passed through ``edit`` first."""
    name, line = record.TUNE_SWEEP
    header, *rest = record.read(record.study(name))
    copy = tmp_path / name / "results.jsonl"
    copy.parent.mkdir()
    record.write(copy, [header, *[edit(r) if r["name"] == line else r for r in rest]])
    real = results.study
    monkeypatch.setattr(results, "study", lambda n: copy if n == name else real(n))
    return record.named(copy)[line]


def test_the_tune_block_is_its_sweeps_record_and_goes_stale_when_the_record_changes(tmp_path, monkeypatch, capsys):
    """docs/tune.md's table is the sweep's line: its rows, the best trial the record makes best, and a figure
    edited in the record makes the page stale (the figure lives in the record, not in the page)."""
    sweep = _tune_study(tmp_path, monkeypatch)
    table = results.tune_table()
    rows = [line for line in table.splitlines() if line.startswith("| `") or line.startswith("| **")]
    assert len(rows) == len(sweep["trials"]) == 8
    best = max(sweep["trials"], key=lambda t: t["metric"])
    assert [r for r in rows if "(best)" in r] == [r for r in rows if r.startswith(f"| **`{best['name']}`**")]
    assert f"| {best['metric']:.4f} | {best['test']['ndcg@10']:.4f} |" in table
    cell = (sweep["labels"], sweep["split"], sweep["max_steps"])  # what a seed moves: the sweep's recipe, its cell
    seeds = [r["ndcg@10"] for r in record.nfcorpus_runs(results.study("nfcorpus-recipe"))[cell][sweep["arm"]].values()]
    assert len(seeds) >= 2 and f"spans {min(seeds):.4f} to {max(seeds):.4f}" in table
    assert results.main(["--check"]) == 0

    def raised(line: dict) -> dict:  # nf-t3's dev figure edited above the best: it becomes the best
        trials = [{**t, "metric": 0.3001} if t["name"] == "nf-t3" else t for t in line["trials"]]
        return {**line, "trials": trials}

    (tmp_path / "edited").mkdir()
    _tune_study(tmp_path / "edited", monkeypatch, raised)
    assert "| **`nf-t3`** (best) | 0.000101 | 0.000636 | 1 | 0.3001 | - |" in results.tune_table()
    assert results.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "docs/tune.md is stale: run python -m lab.results" in err and "docs/results.md is stale" in err


def test_a_tune_line_without_its_runs_facts_is_one_line(tmp_path, monkeypatch, capsys):
    """A line put straight from ``tune status -o json`` lacks what the block names: refused in one line."""
    _tune_study(tmp_path, monkeypatch, lambda line: {k: v for k, v in line.items() if k not in ("machine", "date")})
    assert results.main(["--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "lab.results: lab/tune-nfcorpus: its 'nf' line lacks date, machine; add them (lab/README.md)"


def test_lab_readme_names_every_block():
    """lab/README.md's list of block names is the one ``fill`` takes: a block left out is one a reader cannot find."""
    text = (ROOT / "lab" / "README.md").read_text()
    listed = re.search(r"\(`NAME` is one of (.*?)\)", text, re.S)
    assert listed, "lab/README.md no longer lists the block names"
    assert set(re.findall(r"`([\w-]+)`", listed.group(1))) == set(results.BLOCKS)
