"""The local engine: a sweep's trials run on this machine, each a job replayed by ``colbert-k8s local``.

Under ``--workdir DIR`` (the volume, as for ``local``) a sweep keeps ``tune/NAME/``: ``sweep.json`` (its plan:
every trial's values, drawn once) and one directory per trial, the trial's own /workspace. A trial's job is
rendered as ``render`` would (``job.yaml``) and replayed by :func:`operator_cli.local.run_local` in a process
of its own, whose output goes to the trial's ``log.txt``; this process prints one table row per trial event: as it
starts (``Running``, and the path of its log), and as it ends (its state, figure and time).

* **Shared inputs and caches, separate outputs.** A trial's workspace links to DIR's inputs (the config's
  relative paths) and caches (``data.cache_dir``, the model cache), so staging and the Arrow copy of the rows
  happen once; ``output_dir`` is the trial's own.
* **Resumable.** A trial whose ``metrics.json`` and ``done.json`` are there is never run again; a failed trial
  keeps its reason; any other trial is run (again), and the trainer resumes it from its newest checkpoint,
  which its workspace (a volume here, not an emptyDir) kept. A rerun must ask for the same sweep.
* **Stopped safely.** SIGTERM or Ctrl-C reaches the running trials, which checkpoint; a sweep killed outright
  takes its trials with it (they get SIGTERM from the kernel, ``PR_SET_PDEATHSIG``).
* **Failures.** A trial that fails is recorded with its one-line reason (the trainer's ``error:`` line), and the
  sweep goes on until more than ``--max-failed`` have failed.
* **Early stopping** (``--early-stop median``). Every trial appends its evaluations to ``evaluations.jsonl`` in
  its workspace (``colbert-train --metrics-file``, the lines Katib's collector reads); a running trial whose
  latest intermediate figure is worse than the succeeded trials' median at the same step is sent SIGTERM (it
  checkpoints) and recorded as ``EarlyStopped`` with the figures in its reason (:mod:`.early_stop`).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from operator_cli import constants as C
from operator_cli.errors import CliError
from operator_cli.kube.kinds.sweeps import add_args
from operator_cli.render import render, to_yaml
from operator_cli.tune import record as R
from operator_cli.tune.spec import SweepSpec, Trial

__all__ = ["check_output_dir", "run_sweep", "sweep_root"]

_CACHE = ".cache"  # HF_HOME (/workspace/.cache/huggingface) and the default data.cache_dir


def sweep_root(workdir: Path, name: str) -> Path:
    return workdir / "tune" / name


def check_output_dir(output_dir: str) -> None:
    """A trial's outputs are ``output_dir`` under its own workspace: an absolute one, or one that leaves the
    workspace (``..``), would be the same folder for every trial, and each would find another's results.

    >>> check_output_dir("output/quickstart")
    >>> check_output_dir("/out")
    Traceback (most recent call last):
    ...
    operator_cli.errors.CliError: output_dir /out is absolute: every trial of the sweep would write one folder
    """
    norm = os.path.normpath(output_dir)
    if os.path.isabs(norm) or norm.split(os.sep)[0] == "..":
        where = "is absolute" if os.path.isabs(norm) else "leaves the trial's workspace"
        raise CliError(
            f"output_dir {output_dir} {where}: every trial of the sweep would write one folder",
            hint="set a relative output_dir such as output/NAME: each trial's then lies in its own workspace",
        )


def run_sweep(sweep: SweepSpec, workdir: Path, echo: Callable[[str], None]) -> int:
    """Run the sweep's trials that are not finished; 0 when it ends with a best trial, 1 when it does not."""
    cfg = sweep.job.train_config
    check_output_dir(cfg.output_dir)
    if sweep.early_stop is not None and cfg.mine is not None and cfg.mine.rounds > 1:
        raise CliError(
            f"--early-stop with --local compares trials step for step, and each of mine.rounds {cfg.mine.rounds}'s "
            "training starts again at step 0",
            hint="use mine.rounds: 1 for the sweep, or --engine katib (which counts reports, not steps)",
        )
    root = sweep_root(workdir.resolve(), sweep.name)
    with _held(root):
        plan = _prepare(sweep, root)
        return _Runner(sweep, root, plan, echo).run()


@contextlib.contextmanager
def _held(root: Path) -> Iterator[None]:
    """One process runs a sweep at a time (a lock file, released by the OS if this process dies)."""
    root.mkdir(parents=True, exist_ok=True)
    lock = FileLock(root / ".tune.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise CliError(
            f"sweep {root.name} in {root.parent.parent} is being run by another `colbert-k8s tune`",
            hint="wait for it, or see `colbert-k8s tune status NAME --workdir DIR`",
        ) from None
    try:
        yield
    finally:
        lock.release()


def _prepare(sweep: SweepSpec, root: Path) -> list[Trial]:
    """Write ``sweep.json`` the first time; a rerun must describe the same sweep (same config, space, seed)."""
    from trainer.atomic import write_text

    described = sweep.describe()
    described["output_dir"] = sweep.job.train_config.output_dir
    path = root / R.SWEEP_FILE
    if path.is_file():
        stored = json.loads(path.read_text())
        changed = [k for k in described if k != "created" and stored.get(k) != described[k]]
        if changed:
            raise CliError(
                f"sweep {sweep.name} in {root.parent.parent} was started with another {', '.join(changed)}",
                hint="rerun it with the options it was started with, or pass another --name",
            )
    else:
        write_text(path, json.dumps({**described, "created": _now()}, indent=2) + "\n")
    plan = sweep.plan()
    for trial in plan:
        _lay_out(sweep, root / trial.name, trial)
    return plan


def _lay_out(sweep: SweepSpec, tdir: Path, trial: Trial) -> None:
    """The trial's workspace: its job (as ``render`` prints it) and links to the sweep's inputs and caches."""
    import dataclasses

    from trainer.atomic import write_text

    tdir.mkdir(parents=True, exist_ok=True)
    job = dataclasses.replace(
        sweep.job,
        name=trial.name,
        config_text=sweep.trial_config(trial.values),
        pvc=sweep.job.pvc or (None if sweep.job.pvc_size else f"{sweep.name}-workspace"),
        pod_local_storage=False,
    )
    objects = render(job)
    add_args(objects[-1], ["--metrics-file", f"{C.WORKSPACE_MOUNT}/{R.LINES_FILE}"])  # as Katib's trials do
    write_text(tdir / "job.yaml", to_yaml(objects))
    workdir = tdir.parent.parent.parent
    for name in _shared_names(job.train_config):
        link, target = tdir / name, workdir / name
        if name == _CACHE or name == Path(job.train_config.data.cache_dir).parts[0]:
            target.mkdir(parents=True, exist_ok=True)
        if target.exists() and not link.is_symlink():
            link.symlink_to(target, target_is_directory=target.is_dir())


def _shared_names(cfg) -> list[str]:
    """The first folders of the config's relative inputs and caches: what every trial shares."""
    paths = [
        cfg.data.train.path,
        cfg.data.eval_beir,
        cfg.model.name_or_path,
        cfg.data.cache_dir,
        cfg.index and cfg.index.corpus,
        cfg.mine and cfg.mine.corpus,
        cfg.mine and cfg.mine.model,
        cfg.mine and cfg.mine.teacher and cfg.mine.teacher.name_or_path,
    ]
    names = {_CACHE}
    for p in paths:
        if p and "://" not in p and not Path(p).is_absolute() and Path(p).parts[0] not in (".", ".."):
            names.add(Path(p).parts[0])
    out = Path(cfg.output_dir).parts[0]
    if out in names:
        raise CliError(
            f"output_dir {cfg.output_dir} starts in {out}/, which the trials share (an input or a cache): "
            "every trial would write there",
            hint="set output_dir to a folder of its own, e.g. output/",
        )
    return sorted(names)


def read_lines(path: Path) -> list[dict[str, Any]]:
    """A trial's evaluation lines (:func:`trainer.reporting.metrics_file.read_lines`; the trainer's config loads
    lazily)."""
    from trainer.reporting.metrics_file import read_lines as read

    return read(path)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Stopped(Exception):
    pass


def _stop(_signum, _frame) -> None:
    raise _Stopped


class _Runner:
    """The loop: start trials up to ``--parallel``, record each as it ends, print its row."""

    def __init__(self, sweep: SweepSpec, root: Path, plan: list[Trial], echo: Callable[[str], None]):
        self.sweep, self.root, self.plan, self.echo = sweep, root, plan, echo
        self.keys = [p.key for p in sweep.params]
        self.running: dict[str, tuple[subprocess.Popen, float]] = {}
        self.failed = 0
        self.stopping: dict[str, str] = {}  # trials sent SIGTERM by the early-stopping rule, with its reason
        self.succeeded: list[list[dict]] = []  # the succeeded trials' evaluation lines: the median's sample

    def run(self) -> int:
        record = R.local_record(self.root)
        by_name = {t["name"]: t for t in record["trials"]}
        self._widths(record["trials"])
        self._print(R.table_head(self.keys, self.sweep.metric))
        todo = []
        for trial in self.plan:
            t = by_name[trial.name]
            if t["state"] in R.FINAL_STATES:
                self.failed += t["state"] == "Failed"
                self._note_success(t)
                self._print(
                    R.row({**t, "reason": "finished before; kept"} if t["state"] == "Succeeded" else t, self.keys)
                )
            else:
                todo.append(trial)
        previous = signal.signal(signal.SIGTERM, _stop)
        try:
            self._loop(todo)
        except (_Stopped, KeyboardInterrupt):
            self.echo("tune: stopped; the running trials checkpoint and stop. Run the same command to resume.")
            self._stop_all()
            return 130
        finally:
            signal.signal(signal.SIGTERM, previous)
            self._stop_all()
        return self._finish()

    def _loop(self, todo: list[Trial]) -> None:
        while todo or self.running:
            while todo and len(self.running) < self.sweep.parallel and self.failed <= self.sweep.max_failed:
                self._start(todo.pop(0))
            if not self.running:
                break
            time.sleep(0.5)
            for name, (proc, started) in list(self.running.items()):
                if proc.poll() is not None:
                    del self.running[name]
                    self._ended(name, proc.returncode, time.time() - started)
                elif self.sweep.early_stop is not None and name not in self.stopping:
                    self._judge(name, proc)
            if self.failed > self.sweep.max_failed and not self.running:
                break

    def _start(self, trial: Trial) -> None:
        tdir = self.root / trial.name
        self._write(tdir, {"state": "Running", "started": _now()})
        _wait_for_previous_replay(tdir, trial.name)
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        with open(tdir / "log.txt", "ab") as log:
            proc = subprocess.Popen(
                self._command(tdir),
                cwd=tdir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )
        self.running[trial.name] = (proc, time.time())
        self._print(
            R.row({"name": trial.name, "values": trial.values, "state": "Running", "reason": _log(tdir)}, self.keys)
        )

    def _command(self, tdir: Path) -> list[str]:
        """The trial's process: its job replayed (:mod:`operator_cli.tune.trial`)."""
        return [sys.executable, "-m", "operator_cli.tune.trial", str(tdir)]

    def _ended(self, name: str, code: int, seconds: float) -> None:
        tdir = self.root / name
        output = tdir / json.loads((self.root / R.SWEEP_FILE).read_text())["output_dir"]
        if code == 0 and R.metric_of(output, self.sweep.metric) is not None and R.finished(output):
            info = {"state": "Succeeded", "seconds": round(seconds, 1)}
            self.succeeded.append(read_lines(tdir / R.LINES_FILE))
        elif name in self.stopping:  # however it ended once told to stop: the rule's verdict is the record
            info = {"state": "EarlyStopped", "seconds": round(seconds, 1), "reason": self.stopping.pop(name)}
        elif code in (130, 128 + signal.SIGTERM, -signal.SIGTERM, -signal.SIGINT):
            return  # stopped, not failed: a rerun resumes it
        else:
            info = {"state": "Failed", "seconds": round(seconds, 1), "reason": _reason(tdir / "log.txt", code)}
            self.failed += 1
        self._write(tdir, {**R.read_json(tdir / R.TRIAL_FILE), **info, "ended": _now()})
        t = next(t for t in R.local_record(self.root)["trials"] if t["name"] == name)
        self._print(R.row(t, self.keys))
        if self.failed > self.sweep.max_failed:
            self.echo(
                f"tune: {self.failed} trials failed, more than --max-failed {self.sweep.max_failed}: "
                "no new trial is started"
            )

    def _note_success(self, trial: dict[str, Any]) -> None:
        if trial["state"] == "Succeeded":
            self.succeeded.append(read_lines(self.root / trial["name"] / R.LINES_FILE))

    def _judge(self, name: str, proc: subprocess.Popen) -> None:
        """Median stopping: SIGTERM to a running trial whose latest intermediate figure the rule finds worse."""
        lines = read_lines(self.root / name / R.LINES_FILE)
        reason = self.sweep.early_stop.verdict(lines, self.succeeded, self.sweep.metric, self.sweep.goal)
        if reason is None:
            return
        self.stopping[name] = f"early stop: {reason}"
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)  # `local` passes it on: the trial checkpoints, then stops

    def _finish(self) -> int:
        from operator_cli.tune.best import export_best

        record = R.local_record(self.root)
        best = record["best"]
        if best is None:
            self.echo(f"error: sweep {self.sweep.name}: no trial succeeded; see each trial's log.txt in {self.root}")
            return 1
        values = ", ".join(f"{k}={v}" for k, v in best["values"].items())
        self.echo(f"best: {best['name']} {self.sweep.metric} {best['metric']:.4f} ({values})")
        export_best(self.sweep, record, self.root, self.echo)
        unfinished = [t["name"] for t in record["trials"] if t["state"] not in R.FINAL_STATES]
        return 1 if unfinished or self.failed > self.sweep.max_failed else 0

    def _stop_all(self) -> None:
        for proc, _ in self.running.values():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)  # `local` passes it on: the replicas checkpoint, then stop
        for proc, _ in self.running.values():
            proc.wait()
        self.running.clear()

    def _write(self, tdir: Path, info: dict[str, Any]) -> None:
        from trainer.atomic import write_text

        write_text(tdir / R.TRIAL_FILE, json.dumps(info, indent=2) + "\n")

    def _widths(self, trials: list[dict[str, Any]]) -> None:
        head = R.table_head(self.keys, self.sweep.metric)
        rows = [
            R.row({**t, "state": "Succeeded", "metric": 0.0, "seconds": 3599, "reason": ""}, self.keys) for t in trials
        ]
        self.widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]

    def _print(self, cells: list[Any]) -> None:
        padded = [str(c).ljust(w) for c, w in zip(cells[:-1], self.widths)]
        self.echo("  ".join([*padded, str(cells[-1])]).rstrip())


def _log(tdir: Path) -> str:
    """``log: PATH`` of a trial, relative to the current directory where it is under it (as a user typed
    ``--workdir .``)."""
    log = tdir / "log.txt"
    with contextlib.suppress(ValueError):
        log = log.relative_to(Path.cwd().resolve())
    return f"log: {log}"


def _die_with_parent() -> None:
    """In the trial's process, before it runs: SIGTERM when the sweep's process dies, however it dies (Linux)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _reason(log: Path, code: int) -> str:
    """The trial's one-line reason: the trainer's last ``error:`` line, else the replay's, else the exit code."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for marker in ("colbert-train: error: ", "error: "):
        found = [line.split(marker, 1)[1].strip() for line in lines if marker in line]
        if found:
            return found[-1][:300]
    return f"exit code {code}"


PREVIOUS_REPLAY_WAIT = 300.0  # seconds: a trial orphaned by a killed sweep checkpoints on SIGTERM, then exits


def _wait_for_previous_replay(tdir: Path, name: str) -> None:
    """A sweep killed outright sends its running trials SIGTERM (``PR_SET_PDEATHSIG``); each checkpoints and
    exits, holding its workspace's lock until then. A sweep resumed at once waits for that, instead of
    recording the trial as failed because its own earlier replay still holds the workspace."""
    from operator_cli.local.run import LOCK_FILE

    lock = FileLock(tdir / LOCK_FILE)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"tune: {name}: waiting for its earlier replay to checkpoint and stop", file=sys.stderr, flush=True)
        with contextlib.suppress(Timeout):  # still held: the replay itself refuses, in one line
            lock.acquire(timeout=PREVIOUS_REPLAY_WAIT)
    if lock.is_locked:
        lock.release()
