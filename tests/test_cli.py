"""The CLI surface: start-up imports, bad flags as one line, render -o FORMAT and -d DIR."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from operator_cli.cli import cli
from tests.helpers import ROOT

HEAVY = ("torch", "transformers", "pylate", "sentence_transformers")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--help"], "Usage: colbert-k8s"),
        (["render", "--config", "CFG", "--name", "x"], "kind: PyTorchJob"),
        (["submit", "--dry-run", "--config", "CFG", "--name", "x"], "kind: PyTorchJob"),
    ],
    ids=["help", "render", "submit-dry-run"],
)
def test_cli_never_imports_torch(args, expected, tmp_path):
    """The command succeeds, prints what it should, and never loaded a heavy module (checked at exit)."""
    cfg = tmp_path / "t.yaml"
    cfg.write_text("data: {train: {path: d.jsonl}}\n")
    args = [str(cfg) if a == "CFG" else a for a in args]
    code = (
        "import atexit, sys\n"
        f"atexit.register(lambda: print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
        f"from operator_cli.cli import main\nsys.argv = ['colbert-k8s', *{args!r}]\nmain()\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert expected in res.stdout
    assert res.stdout.strip().splitlines()[-1] == "HEAVY []"


def test_render_prints_the_trainers_scale_line(tmp_path):
    """Global batch counts accumulation; negatives come from one micro-batch across ranks (issue 17)."""
    from trainer.config.load import load_config
    from trainer.scale import job_scale

    cfg = tmp_path / "t.yaml"
    cfg.write_text(
        "data: {train: {path: d.jsonl, columns: {negatives: [n1, n2]}}}\n"
        "training: {per_device_batch_size: 4, gradient_accumulation_steps: 2}\n"
    )
    res = CliRunner().invoke(
        cli, ["render", "--config", str(cfg), "--nodes", "2", "--gpus-per-node", "0", "--pvc-size", "1Gi"]
    )
    assert res.exit_code == 0, res.output
    line = job_scale(load_config(str(cfg)), 2).line()
    assert f"scale: 2 node(s) x 1 CPU process(s); {line}" in res.stderr
    # 2 ranks x 4 x 2 micro-batches; negatives: 4 queries x 2 ranks x 3 docs - the positive
    assert "= global batch 16; in-batch negatives per query 23 (gathered across ranks" in line


BAD_FLAGS = [
    (["--nodes", "0"], "--nodes must be between 1 and 1024"),
    (["--env", "NOEQUALS"], "--env must be KEY=VALUE"),
    (["--env", "HF_TOKEN=hf_supersecret"], "looks like a credential"),
    (["--secret-env", "HF_TOKEN=just-a-value"], "--secret-env must be VAR=SECRET_NAME/KEY"),
    (["--toleration", "gpu=true:Sometimes"], "--toleration must be KEY[=VALUE]:EFFECT"),
    (["--name", "Bad_Name"], "--name must be a DNS-1035 label"),
    (["--memory", "12 GB"], "--memory must be a Kubernetes quantity"),
]


@pytest.mark.parametrize("extra,message", BAD_FLAGS, ids=[f[0][0] + "-" + str(i) for i, f in enumerate(BAD_FLAGS)])
def test_bad_flags_are_one_line(extra, message, tmp_path):
    cfg = tmp_path / "t.yaml"
    cfg.write_text("data: {train: {path: d.jsonl}}\n")
    res = CliRunner().invoke(cli, ["render", "--config", str(cfg), *extra])
    assert res.exit_code == 2
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0]
    assert "hf_supersecret" not in res.output and "just-a-value" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_bad_training_config_is_caught_before_rendering(tmp_path):
    cfg = tmp_path / "t.yaml"
    cfg.write_text("data: {train: {path: d.jsonl}}\ntraining: {per_device_batch: 8}\n")
    res = CliRunner().invoke(cli, ["render", "--config", str(cfg)])
    assert res.exit_code == 2
    assert "unknown key 'training.per_device_batch'" in res.output
    res = CliRunner().invoke(cli, ["render", "--config", str(tmp_path / "missing.yaml")])
    assert res.exit_code == 2 and "config file not found" in res.output


RENDERED = ["configmap-job-config.yaml", "persistentvolumeclaim-job-workspace.yaml", "pytorchjob-job.yaml"]


def _render(tmp_path, *extra: str):
    cfg = tmp_path / "t.yaml"
    cfg.write_text("data: {train: {path: d.jsonl}}\n")
    return CliRunner().invoke(cli, ["render", "--config", str(cfg), "--name", "job", "--pvc-size", "1Gi", *extra])


def test_render_output_dir_writes_one_file_per_object(tmp_path):
    res = _render(tmp_path, "-d", str(tmp_path / "out"))
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == RENDERED
    assert "deprecated" not in res.output


def test_render_output_is_a_format_as_for_status_and_list(tmp_path):
    """-o json prints the same objects as the YAML (a List, as kubectl's); -o table has no meaning for render."""
    import json

    import yaml

    objects = list(yaml.safe_load_all(_render(tmp_path).stdout))
    res = _render(tmp_path, "-o", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {"apiVersion": "v1", "kind": "List", "items": objects}
    assert list(yaml.safe_load_all(_render(tmp_path, "-o", "yaml").stdout)) == objects
    res = _render(tmp_path, "-o", "table")
    assert res.exit_code == 2 and res.output.count("error:") == 1 and "-o must be one of yaml, json" in res.output


def test_render_o_dir_of_0_2_is_refused_as_0_3_promised(tmp_path):
    """0.3 wrote files into ``-o DIR`` with a deprecation line; 0.4 takes -o as a format only (use -d)."""
    res = _render(tmp_path, "-o", str(tmp_path / "old"))
    assert res.exit_code == 2 and res.output.count("error:") == 1 and "-o must be one of yaml, json" in res.output
    assert "-d/--output-dir DIR writes one file per object" in res.output and not (tmp_path / "old").exists()


BLOCK_TRAINER = "import sys\nsys.modules['torch'] = None\nsys.modules['pylate'] = None\n"


def test_local_without_the_train_extra_is_one_line(tmp_path):
    cfg = tmp_path / "t.yaml"
    cfg.write_text("data: {train: {path: d.jsonl}}\n")
    code = BLOCK_TRAINER + f"from operator_cli.cli import cli\ncli(['local', '--config', {str(cfg)!r}])\n"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2 and "torch, pylate is not installed" in res.stderr
    assert "pip install -e '.[train]'" in res.stderr and "Traceback" not in res.stderr


def test_trainer_without_torch_is_one_line(tmp_path):
    """Data that reads (the data checks need no torch): the trainer gets as far as torch and names it."""
    (tmp_path / "d.jsonl").write_text('{"query": "q", "positive": "p", "negative": "n"}\n')
    cfg = tmp_path / "t.yaml"
    cfg.write_text(f"data: {{train: {{path: {tmp_path / 'd.jsonl'}}}}}\n")
    code = BLOCK_TRAINER + f"from trainer.cli import main\nraise SystemExit(main(['--config', {str(cfg)!r}]))\n"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2 and "torch is not installed" in res.stderr and "Traceback" not in res.stderr


def test_text_lines_joins_chunks_split_anywhere():
    """A line cut across chunks (even inside a UTF-8 character) comes out whole; \\r ends a line only when asked."""
    from operator_cli.lines import text_lines

    data = "step 1 ✓\nbar 10%\rbar 20%\nlast".encode()
    chunks = [data[i : i + 3] for i in range(0, len(data), 3)]
    assert list(text_lines(chunks)) == ["step 1 ✓", "bar 10%\rbar 20%", "last"]
    assert list(text_lines(chunks, carriage_return_ends_line=True)) == ["step 1 ✓", "bar 10%", "bar 20%", "last"]
