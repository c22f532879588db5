"""One exit-code rule (issue 42, item 7): 1-127 fail the job at once, 128-255 and signals restart it, on every
launch path. The rule is written once (``trainer/errors.PERMANENT_EXIT_CODES``); PyTorchJob's
``restartPolicy: ExitCode``, the ``colbert-torch`` runtime's podFailurePolicy (CLI and chart) and ``local``'s
replay of both decide alike, and a traceback is 1 whether or not torchrun started the trainer."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from operator_cli.kube.runtime import RuntimeSpec, render_runtime, runtime_policy
from operator_cli.podplan import operator_policy
from tests.helpers import ROOT
from trainer.errors import EXIT_DIR_ENV, EXIT_PEER, PERMANENT_EXIT_CODES, is_permanent, job_exit_code

CODES = range(-15, 256)  # Popen's negative signals, then every exit status


def test_every_controller_applies_the_trainers_rule_to_every_code():
    """The shipped runtime failed fast on 2 only: a traceback (1) was retried maxRestarts times under a
    TrainJob and failed at once under a PyTorchJob."""
    from tests.helpers.chart import helm_render
    from tests.helpers.schemas import validate_runtime

    assert PERMANENT_EXIT_CODES == (1, 127)  # the Training Operator's fixed ExitCode rule, which is why it is ours
    chart = helm_render({"api": "trainjob", "runtime": {"name": "colbert-torch", "install": True}})
    (chart_runtime,) = [o for o in chart if o["kind"] == "ClusterTrainingRuntime"]
    runtimes = {"CLI runtime": render_runtime(RuntimeSpec()), "chart runtime": chart_runtime}
    for runtime in runtimes.values():
        validate_runtime(runtime)  # the Job API's limits on onExitCodes values too (tests/helpers/schemas.py)
    policies = {name: runtime_policy(rt) for name, rt in runtimes.items()}
    policies["PyTorchJob ExitCode"] = operator_policy("ExitCode", 3)
    for name, policy in policies.items():
        differ = [code for code in CODES if policy.is_permanent(code) != is_permanent(code)]
        assert differ == [], f"{name} decides exit code(s) {differ[:5]} unlike trainer/errors.py"
    assert policies["CLI runtime"].rule == "podFailurePolicy FailJob on exit code(s) 1-127 -> FailJobSet"


def test_a_torchrun_child_whose_exception_escapes_tells_its_launcher_1(monkeypatch, tmp_path):
    """Python exits 1 on an escaped exception, but the child wrote no code, and the launcher read that as a
    lost peer (129, retryable)."""
    import trainer.cli as cli
    import trainer.rounds

    def bug(*args, **kwargs):
        raise ValueError("a bug in the trainer")

    monkeypatch.setattr(trainer.rounds, "run", bug)
    (tmp_path / "t.jsonl").write_text(json.dumps({"query": "q", "positive": "p", "negative": "n"}) + "\n")
    config = tmp_path / "c.yaml"
    config.write_text(
        f"data: {{train: {{path: {tmp_path}/t.jsonl}}}}\ntraining: {{max_steps: 1}}\noutput_dir: {tmp_path}/out\n"
    )
    said = tmp_path / "codes"
    said.mkdir()
    child = {"LOCAL_RANK": "0", "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    for key, value in {**child, EXIT_DIR_ENV: str(said)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="a bug in the trainer"):  # its traceback is printed, as before
        cli.main(["--config", str(config)])
    assert (said / "1.code").read_text() == "1"
    assert job_exit_code(1, [1, EXIT_PEER]) == 1  # rank 0 lost its peer: the cause wins
    with pytest.raises(SystemExit):
        cli.main(["--no-such-flag"])  # argparse's own exit 2
    assert (said / "1.code").read_text() == "2"


_PLANTED_BUG = """
import os
if "LOCAL_RANK" in os.environ or "PET_NNODES" not in os.environ:  # the trainer itself, not a launcher
    import trainer.rounds

    def run(*args, **kwargs):
        raise ValueError("a bug in the trainer (planted by the test)")

    trainer.rounds.run = run
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "launcher",
    [{}, {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "0"}],
    ids=["one-process-pod", "trainjob-torchrun"],
)
def test_the_same_traceback_exits_1_in_a_one_process_pod_and_under_torchrun(tmp_path, tiny_model, launcher):
    """The audit's case: the same traceback exited 1 in a one-process PyTorchJob pod and 129 in a TrainJob's
    pod, where torchrun runs the trainer."""
    from tests.helpers import write_triplets

    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(_PLANTED_BUG)  # every Python the pod starts reads it
    data = write_triplets(tmp_path / "t.jsonl", 8)
    config = tmp_path / "c.yaml"
    config.write_text(
        json.dumps(
            {
                "model": {"name_or_path": str(tiny_model)},
                "data": {"train": {"path": str(data)}},
                "training": {"max_steps": 1},
                "output_dir": str(tmp_path / "out"),
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_") and k not in ("RANK", "WORLD_SIZE")}
    env.update(launcher, PYTHONPATH=f"{hooks}{os.pathsep}{ROOT}", HF_HUB_OFFLINE="1")
    res = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", str(config)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "a bug in the trainer (planted by the test)" in res.stderr, res.stderr[-3000:]
    assert res.returncode == 1, res.stderr[-3000:]
