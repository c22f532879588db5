"""`colbert-k8s local` end to end: options -> manifest -> operator env -> trainer -> checkpoints -> model."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from operator_cli.local import plan_replicas
from operator_cli.render import render
from operator_cli.spec import JobSpec
from tests.helpers import ROOT
from tests.helpers.local import local_workdir, run_job

CLI = [sys.executable, "-m", "operator_cli.cli"]


def _local(workdir: Path, *extra: str, name: str = "tiny"):
    cmd = [
        *CLI,
        "local",
        "--config",
        str(workdir / "train.yaml"),
        "--name",
        name,
        "--nodes",
        "2",
        "--gpus-per-node",
        "0",
        "--workdir",
        str(workdir),
        *(() if {"--pvc", "--pvc-size"} & set(extra) else ("--pod-local-storage",)),
        *extra,
    ]
    return cmd


def test_replica_env_matches_the_operator(tmp_path):
    spec = JobSpec(
        name="job", config_text="data: {train: {path: x}}\n", nodes=3, gpus_per_node=0, env={"FOO": "bar"}, pvc="ws"
    )
    reps = plan_replicas(render(spec), tmp_path / "ws", tmp_path / "cfg", "127.0.0.1", 23456)
    assert [r.replica for r in reps] == ["master-0", "worker-0", "worker-1"]
    for i, r in enumerate(reps):
        assert r.env["RANK"] == r.env["PET_NODE_RANK"] == str(i)
        assert r.env["WORLD_SIZE"] == "3" and r.env["PET_NNODES"] == "3" and r.env["PET_NPROC_PER_NODE"] == "1"
        assert r.env["MASTER_ADDR"] == r.env["PET_MASTER_ADDR"] == "127.0.0.1"
        assert r.env["MASTER_PORT"] == "23456" and r.env["PYTHONUNBUFFERED"] == "1"
        assert r.env["FOO"] == "bar" and r.env["HF_HOME"] == str(tmp_path / "ws" / ".cache" / "huggingface")
        assert r.command == ["colbert-train", "--config", str(tmp_path / "cfg" / "train.yaml")]
        assert r.cwd == tmp_path / "ws"


def test_a_replicas_end_takes_the_workers_in_sessions_of_their_own(tmp_path):
    """As a container's end does: torchrun's workers run in sessions of their own, so killing the agent's
    process group leaves them training alone. kill_group finds them by the replica's tag and kills them."""
    from operator_cli.local.processes import kill_group, start

    spec = JobSpec(name="job", config_text="data: {train: {path: x}}\n", nodes=2, gpus_per_node=0, pvc="ws")
    leader, other = plan_replicas(render(spec), tmp_path / "ws", tmp_path / "cfg", "127.0.0.1", 23456)
    script = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); "
        "print(p.pid, flush=True); time.sleep(120)"
    )
    others = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=other.env)]
    start([leader], lambda r: [sys.executable, "-c", script])
    deadline = time.time() + 30
    while not (pids := [p.pid for p in psutil.Process(leader.proc.pid).children()]) and time.time() < deadline:
        time.sleep(0.1)
    worker = psutil.Process(pids[0])
    assert worker.pid != leader.proc.pid and os.getsid(worker.pid) != os.getsid(leader.proc.pid)
    leader.proc.kill()  # the agent dies first; its worker lives on in its own session
    leader.proc.wait()
    assert worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE
    kill_group(leader)
    worker.wait(timeout=10)  # raises if it is still alive
    assert others[0].poll() is None  # another replica's processes are not touched
    others[0].kill()
    others[0].wait()


def test_gpu_job_world_size_counts_processes(tmp_path):
    spec = JobSpec(name="job", config_text="x: 1\n", nodes=2, gpus_per_node=8, pvc="ws")
    reps = plan_replicas(render(spec), tmp_path, tmp_path, "127.0.0.1", 1)
    assert [r.env["WORLD_SIZE"] for r in reps] == ["16", "16"]
    assert [r.env["RANK"] for r in reps] == ["0", "1"]  # node index, as the operator sets it
    assert reps[1].env["PET_NPROC_PER_NODE"] == "8"


def _pod(wd: Path, replica: str) -> Path:
    return wd / "pods" / f"tiny-{replica}"


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory, tiny_model) -> tuple[Path, subprocess.CompletedProcess]:
    """A 2-replica PyTorchJob of 4 steps on 32 rows, run once: its workdir and its output."""
    wd = local_workdir(tmp_path_factory.mktemp("two-replicas"), tiny_model, 32)
    return wd, subprocess.run(_local(wd), cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_local_two_replicas_end_to_end(two_replicas):
    from pylate import models

    wd, res = two_replicas
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    # one line per event: rank 0's lines once (rank 1 logs the same and has nothing to warn of), progress
    # as one readable line, no bar glued to a log line; the "done" line last, the summary naming the model
    assert "[master-0] [rank 0]" in res.stdout and "[worker-0] [rank 1]" not in res.stdout
    assert "progress {" not in res.stdout and "train step 4/4 · " in res.stdout and "it/s]" not in res.stdout
    lines = res.stdout.splitlines()
    done = next(i for i, line in enumerate(lines) if "INFO done: model at output/final-model" in line)
    assert done > max(i for i, line in enumerate(lines) if "final model saved" in line)
    assert "job tiny succeeded: 4 steps" in res.stdout
    assert res.stdout.splitlines()[-1] == f"model: {_pod(wd, 'master-0') / 'output' / 'final-model'}"
    assert res.stdout.splitlines()[-2].startswith(f"outputs in the master pod's /workspace, an emptyDir stand-in: {wd}")
    assert "not honoured here" in res.stderr and "world size 2" in res.stderr
    assert "each replica has its own /workspace (an emptyDir)" in res.stderr
    assert "copied into each from" in res.stderr and "data/train.jsonl" in res.stderr
    master, worker = _pod(wd, "master-0"), _pod(wd, "worker-0")
    metrics = json.loads((master / "output" / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["steps"] == 4
    assert not (worker / "output").exists()  # only rank 0 writes; the worker's emptyDir never sees it
    assert not (wd / "output").exists()  # nothing leaks into the shared --workdir
    model = models.ColBERT(str(master / "output" / "final-model"), device="cpu")
    assert model.encode(["hello"], is_query=False)[0].shape[-1] == 128


@pytest.mark.slow
def test_shared_pvc_replays_one_workspace(tmp_path, tiny_model):
    wd = local_workdir(tmp_path, tiny_model, 16, {"training.max_steps": 2})
    cmd = [a for a in _local(wd) if a != "--pod-local-storage"] + ["--pvc-size", "1Gi"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert f"/workspace is a PVC shared by every replica: {wd}" in res.stderr
    assert json.loads((wd / "output" / "metrics.json").read_text())["steps"] == 2
    assert not (wd / "pods").exists()


def _replica_proc(proc: subprocess.Popen, rank: str) -> psutil.Process:
    return next(
        p
        for p in psutil.Process(proc.pid).children(recursive=True)
        if "trainer" in " ".join(p.cmdline()) or "colbert-train" in " ".join(p.cmdline())
        if p.environ().get("RANK") == rank
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "api, rank, sig",
    [
        ("pytorchjob", "1", signal.SIGKILL),
        ("pytorchjob", "0", signal.SIGKILL),
        ("pytorchjob", "1", signal.SIGTERM),
        ("trainjob", "1", signal.SIGKILL),
    ],
    ids=["kill-worker", "kill-master", "term-worker", "trainjob-kill-worker"],
)
def test_interrupted_replica_is_restarted_and_resumes(tmp_path, tiny_model, api, rank, sig):
    """Per-pod workspaces: only the master's holds checkpoints, whichever replica dies."""
    from trainer.run.checkpoint import list_checkpoints, load_checkpoint

    every = 4
    wd = local_workdir(tmp_path, tiny_model, 96, {"training.max_steps": 40, "checkpoint.every_steps": every})
    # a TrainJob on the stock runtime: its pods restart in place, keeping their emptyDirs (this tool's runtime
    # recreates them: test_trainjob_on_the_runtime_restarts_a_sigkilled_replica_and_resumes)
    stock = ("--runtime", "torch-distributed") if api == "trainjob" else ()
    proc = subprocess.Popen(
        _local(wd, "-v", "--backoff-limit", "2", "--api", api, *stock),  # -v: every rank counted
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    master_pod, worker_pod = ("master-0", "worker-0") if api == "pytorchjob" else ("node-0-0", "node-0-1")
    ckpts = _pod(wd, master_pod) / "output" / "checkpoints"
    deadline = time.time() + 240
    while not any(s >= 2 * every for s, _ in list_checkpoints(ckpts)):
        assert proc.poll() is None and time.time() < deadline, "finished before it could be interrupted"
        time.sleep(0.05)
    _replica_proc(proc, rank).send_signal(sig)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    victim = worker_pod if rank == "1" else master_pod
    code = "signal 9" if sig == signal.SIGKILL else "exit code 143"
    assert re.search(rf"replica \S+ ended with ({code}|exit code \d+); restarting", out), out[-3000:]
    before = out.split("restarting")[0]
    steps_before = [int(m) for m in re.findall(r"\[rank 0\] \S+ INFO step (\d+)/40", before)]
    resumed = int(re.search(r"resumed from \S+ at step (\d+)/40", out).group(1))
    if sig == signal.SIGTERM:  # checkpointed at the step it stopped: nothing but the step in flight is lost
        assert resumed == max(steps_before), (resumed, steps_before)
        assert "stopped by SIGTERM after step" in before
    else:
        assert max(steps_before) - resumed <= every  # at most one checkpoint interval is lost
    assert out.count(f"weights identical on all ranks at step {resumed} after start-up") == 2
    metrics = json.loads((_pod(wd, master_pod) / "output" / "metrics.json").read_text())
    assert metrics["steps"] == 40
    assert not (_pod(wd, worker_pod) / "output").exists(), victim
    for step, path in list_checkpoints(ckpts):
        assert load_checkpoint(path)["step"] == step


@pytest.mark.slow
def test_a_killed_worker_is_retried_under_restart_policy_exit_code(tmp_path, tiny_model):
    """With a claim the policy is ExitCode: a SIGKILLed worker (a signal) and its peer's lost-peer exit
    (129) are retryable, so the job restarts and resumes from the claim's checkpoint."""
    from trainer.run.checkpoint import list_checkpoints

    wd = local_workdir(tmp_path, tiny_model, 96, {"training.max_steps": 24, "checkpoint.every_steps": 4})
    proc = subprocess.Popen(
        _local(wd, "--backoff-limit", "2", "--pvc-size", "1Gi"),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 240
    while not any(s >= 8 for s, _ in list_checkpoints(wd / "output" / "checkpoints")):
        assert proc.poll() is None and time.time() < deadline, "finished before it could be interrupted"
        time.sleep(0.05)
    _replica_proc(proc, "1").send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert re.search(r"replica \S+ ended with (signal 9|exit code 129); restarting", out), out[-3000:]
    assert "permanent failure" not in out
    assert re.search(r"resumed from \S+ at step (\d+)/24", out)
    assert json.loads((wd / "output" / "metrics.json").read_text())["steps"] == 24


@pytest.mark.slow
def test_a_bad_data_row_fails_the_job_after_one_attempt(tmp_path, tiny_model):
    """restartPolicy ExitCode (a claim holds the workspace): the trainer's exit 2 is permanent, so the
    job fails on its first attempt with the row's one line, and the restart budget is not burnt."""
    wd = local_workdir(tmp_path, tiny_model, 8)
    (wd / "data" / "train.jsonl").write_text('{"query": "q"}\n')  # every start fails on this row
    res = subprocess.run(
        _local(wd, "--backoff-limit", "3", "--pvc-size", "1Gi"), cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 1
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "ended with exit code 2, a permanent failure under restartPolicy ExitCode" in errors[0]
    assert "restarting the job's replicas" not in res.stderr  # one attempt
    assert res.stdout.count("column 'positive' is missing") >= 1
    assert "Traceback" not in res.stdout + res.stderr


@pytest.mark.slow
def test_trainjob_on_the_runtime_fails_a_bad_data_row_with_no_restart(tmp_path, tiny_model):
    """--api trainjob on this tool's runtime (the default): its podFailurePolicy fails the Job on exit 1-127 and
    the JobSet rule fails the TrainJob, so a bad row is one attempt, not maxRestarts of them."""
    wd = local_workdir(tmp_path, tiny_model, 8)
    (wd / "data" / "train.jsonl").write_text('{"query": "q"}\n')
    res = subprocess.run(_local(wd, "--api", "trainjob"), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1, res.stderr[-2000:]
    assert "runtime colbert-torch's failure policy replayed" in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors
    assert "ended with exit code 2, a permanent failure under podFailurePolicy FailJob" in errors[0]
    assert "restarting the job's replicas" not in res.stderr  # one attempt
    assert res.stdout.count("column 'positive' is missing") >= 1 and "Traceback" not in res.stdout + res.stderr


@pytest.mark.slow
def test_trainjob_on_the_runtime_restarts_a_sigkilled_replica_and_resumes(tmp_path, tiny_model):
    """The same runtime restarts anything else (here a SIGKILL) within maxRestarts: new pods, which resume from
    the claim's newest checkpoint."""
    from trainer.run.checkpoint import list_checkpoints

    wd = local_workdir(tmp_path, tiny_model, 96, {"training.max_steps": 24, "checkpoint.every_steps": 4})
    proc = subprocess.Popen(
        _local(wd, "--api", "trainjob", "--pvc-size", "1Gi"),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 240
    while not any(s >= 8 for s, _ in list_checkpoints(wd / "output" / "checkpoints")):
        assert proc.poll() is None and time.time() < deadline, "finished before it could be interrupted"
        time.sleep(0.05)
    _replica_proc(proc, "1").send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert re.search(r"replica \S+ ended with (signal 9|exit code \d+); restarting the job's replicas \(1/3\)", out)
    assert "permanent failure" not in out
    assert re.search(r"resumed from \S+ at step (\d+)/24", out), out[-3000:]
    assert json.loads((wd / "output" / "metrics.json").read_text())["steps"] == 24


@pytest.mark.slow
def test_a_permanent_error_fails_once_on_one_node_with_an_empty_dir(tmp_path, tiny_model):
    """One pod on an emptyDir (the default storage) runs under restartPolicy ExitCode too (issue 43, item 6): a
    bad row fails the job on its first attempt; under 0.3's OnFailure it was retried backoffLimit times."""
    wd = local_workdir(tmp_path, tiny_model, 8)
    (wd / "data" / "train.jsonl").write_text('{"query": "q"}\n')
    cmd = _local(wd, "--backoff-limit", "3")
    cmd[cmd.index("--nodes") + 1] = "1"  # one pod: no --pod-local-storage needed
    cmd.remove("--pod-local-storage")
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "ended with exit code 2, a permanent failure under restartPolicy ExitCode" in errors[0]
    assert "restarting the job's replicas" not in res.stderr
    assert "Traceback" not in res.stdout + res.stderr


def _netns_reason() -> str | None:
    from operator_cli.netns import available

    return available()


@pytest.mark.slow
@pytest.mark.skipif(_netns_reason() is not None, reason=f"network namespaces unavailable: {_netns_reason()}")
def test_isolated_network_namespaces(tmp_path, tiny_model):
    wd = local_workdir(tmp_path, tiny_model, 16, {"training.max_steps": 2})
    res = run_job(_local(wd, "--isolate-network", "-v"), cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    addrs = dict(pair.split("=") for pair in res.stderr.split("network namespaces: ")[1].splitlines()[0].split(", "))
    assert set(addrs) == {"tiny-master-0", "tiny-worker-0"} and not addrs["tiny-master-0"].startswith("127.")
    # both ranks rendezvoused on the operator's host name, not on loopback
    assert res.stdout.count("master=tiny-master-0:") == 2
    assert "job tiny succeeded: 2 steps" in res.stdout
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "ck8s-" not in left and not list(Path("/etc/netns").glob("ck8s-*"))


def _namespaces() -> set[str]:
    return {
        line.split()[0]
        for line in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
    }


def test_trainjob_replica_env_is_v2s(tmp_path):
    spec = JobSpec(
        name="job", config_text="data: {train: {path: x}}\n", nodes=3, gpus_per_node=0, api="trainjob", pvc="ws"
    )
    reps = plan_replicas(render(spec), tmp_path / "ws", tmp_path / "cfg", "job-node-0-0.job", 29500)
    assert [r.replica for r in reps] == ["node-0", "node-1", "node-2"]
    assert [r.host for r in reps] == ["job-node-0-0", "job-node-0-1", "job-node-0-2"]
    for i, r in enumerate(reps):
        launcher = {
            k: v for k, v in r.env.items() if k.startswith("PET_") or k in ("RANK", "WORLD_SIZE", "MASTER_ADDR")
        }
        assert launcher == {
            "PET_NNODES": "3",
            "PET_NPROC_PER_NODE": "1",
            "PET_NODE_RANK": str(i),
            "PET_MASTER_ADDR": "job-node-0-0.job",
            "PET_MASTER_PORT": "29500",
        }
        assert r.command == ["colbert-train", "--config", str(tmp_path / "cfg" / "train.yaml")]
        assert r.cwd == tmp_path / "ws"


@pytest.mark.slow
def test_trainjob_replay_trains_to_the_same_weights_as_pytorchjob(tmp_path, tiny_model, two_replicas):
    """The same job through v1 (the PyTorchJob run above) and v2 launchers: same seed, same data, identical
    final weights."""
    import hashlib

    def digest(master: Path) -> str:
        assert json.loads((master / "output" / "metrics.json").read_text())["world_size"] == 2
        return hashlib.sha256((master / "output" / "final-model" / "model.safetensors").read_bytes()).hexdigest()

    pytorchjob, res = two_replicas
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    wd = local_workdir(tmp_path, tiny_model, 32)
    res = run_job(_local(wd, "--api", "trainjob", "-v"), cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "[node-0] [rank 0]" in res.stdout and "[node-1] [rank 1]" in res.stdout
    assert "mode=torchrun" in res.stdout  # the trainer started torchrun from PET_* alone
    assert digest(wd / "pods" / "tiny-node-0-0") == digest(pytorchjob / "pods" / "tiny-master-0")


@pytest.mark.slow
@pytest.mark.skipif(_netns_reason() is not None, reason=f"network namespaces unavailable: {_netns_reason()}")
def test_trainjob_in_network_namespaces_uses_v2s_master_name(tmp_path, tiny_model):
    wd = local_workdir(tmp_path, tiny_model, 16, {"training.max_steps": 2})
    res = run_job(_local(wd, "--api", "trainjob", "--isolate-network", "-v"), cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "--master_addr=tiny-node-0-0.tiny" in res.stdout and "--master_port=29500" in res.stdout
    assert "job tiny succeeded: 2 steps" in res.stdout


@pytest.mark.slow
def test_a_sigkilled_local_takes_its_replicas_and_temp_dir_with_it(tmp_path, tiny_model):
    """SIGKILL of the `local` process alone left 2 trainers and 2 DataLoader workers training on, and its
    /tmp/<job>-config-* behind: a pod's containers end with the pod. A TrainJob's, so each replica is a launcher,
    torchrun's agent and a trainer: SIGUSR1 to a launcher (a pod's PID 1) has its trainer print its stacks.
    Where network namespaces can be made, the replicas run in them, and the reaper removes them too."""
    import tempfile

    isolated = _netns_reason() is None
    wd = local_workdir(tmp_path, tiny_model, 96, {"training.max_steps": 400, "checkpoint.every_steps": 1000})
    before = set(Path(tempfile.gettempdir()).glob("reaped-config-*"))  # a name no other test's job has
    namespaces_before = _namespaces() if isolated else set()
    flags = ("--api", "trainjob", *(["--isolate-network"] if isolated else []))
    proc = subprocess.Popen(
        _local(wd, *flags, name="reaped"), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.time() + 240
    for line in proc.stdout:  # until both replicas train
        if "INFO step 2/400" in line:
            break
        assert time.time() < deadline and proc.poll() is None, line
    descendants = psutil.Process(proc.pid).children(recursive=True)
    trainers = [p for p in descendants if "train" in " ".join(p.cmdline())]
    assert len(trainers) >= 2
    made = set(Path(tempfile.gettempdir()).glob("reaped-config-*")) - before
    assert len(made) == 1
    namespaces_made = _namespaces() if isolated else set()
    deadline = time.time() + 60
    launcher = next(p for p in descendants if "colbert-train" in " ".join(p.cmdline()))
    launcher.send_signal(signal.SIGUSR1)  # a hang's diagnosis: every thread's stack, and training goes on
    for line in proc.stdout:  # the trainer's stack, in its training loop (the launcher's own is in child.wait)
        if 'trainer/train.py", line' in line:
            break
        assert time.time() < deadline and proc.poll() is None, line
    assert all(p.is_running() for p in trainers)
    proc.kill()  # the local process only, not its group
    proc.wait()
    gone, alive = psutil.wait_procs([p for p in descendants if p.is_running()], timeout=15)
    assert not alive, [p.cmdline() for p in alive]
    deadline = time.time() + 10
    while next(iter(made)).exists() and time.time() < deadline:
        time.sleep(0.1)
    assert not next(iter(made)).exists()
    if isolated:  # SIGKILL left `local` no clean-up of its own: its reaper removed the namespaces it was told of
        ours = namespaces_made - namespaces_before
        while _namespaces() & ours and time.time() < deadline + 20:
            time.sleep(0.2)
        assert len(ours) == 3 and not _namespaces() & ours  # two replicas and the switch
        assert not [p for p in Path("/etc/netns").glob("ck8s-*") if p.name in ours]
