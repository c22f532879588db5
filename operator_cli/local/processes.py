"""The replicas as process groups: start them, copy their output line by line, stop them as the kubelet does."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import click

from operator_cli.lines import text_lines
from operator_cli.local.replicas import Replica

__all__ = ["kill_group", "start", "stop", "wait_any_failure"]


def _pump(replica: Replica, lock: threading.Lock) -> None:
    """Copy a replica's output, line by line (a \\r ends a progress line), prefixed by its replica."""
    stream = replica.proc.stdout
    read = stream.read1 if hasattr(stream, "read1") else stream.read
    prefix = f"[{replica.replica}] "  # the trainer's own lines add "[rank N]"
    for line in text_lines(iter(lambda: read(4096), b""), carriage_return_ends_line=True):
        if line.strip():
            with lock:
                click.echo(prefix + line)


def start(replicas: list[Replica], wrap) -> list[threading.Thread]:
    lock = threading.Lock()
    threads = []
    for r in replicas:
        r.cwd.mkdir(parents=True, exist_ok=True)
        r.proc = subprocess.Popen(
            wrap(r),
            cwd=r.cwd,
            env=r.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        t = threading.Thread(target=_pump, args=(r, lock), daemon=True)
        t.start()
        threads.append(t)
    return threads


def stop(replicas: list[Replica], grace: float = 10.0) -> None:
    """SIGTERM each replica's process group (the launcher and torchrun's agent, which passes it on to its
    workers), then SIGKILL after ``grace``, and whatever is left of the replica with it (:func:`kill_group`)."""
    for r in replicas:
        if r.proc and r.proc.poll() is None:
            try:
                os.killpg(r.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.time() + grace
    for r in replicas:
        if r.proc:
            try:
                r.proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
            kill_group(r)
            r.proc.wait()


def kill_group(replica: Replica) -> None:
    """SIGKILL every process the replica started, as a container's end does: its process group (the
    launcher and torchrun's agent) and torchrun's workers, which run in sessions of their own and would
    otherwise train on alone. They are found by the replica's tag in their environment (``/proc``)."""
    try:
        os.killpg(replica.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in _tagged(replica.tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _tagged(tag: bytes) -> list[int]:
    """The processes whose environment holds ``tag``, this one excluded."""
    found = []
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    if tag in f.read().split(b"\0"):
                        found.append(int(entry.name))
            except OSError:  # gone, or another user's
                continue
    return found


def wait_any_failure(replicas: list[Replica]) -> Replica | None:
    """Block until every replica succeeded (None) or one failed (that replica)."""
    while True:
        codes = [r.proc.poll() for r in replicas]
        for r, code in zip(replicas, codes):
            if code is not None and code != 0:
                return r
        if all(code == 0 for code in codes):
            return None
        time.sleep(0.2)
