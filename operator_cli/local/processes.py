"""The replicas as process groups: start them, copy their output line by line, stop them as the kubelet does."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import click

from operator_cli.lines import text_lines
from operator_cli.local.output import shown
from operator_cli.local.replicas import Replica

__all__ = [
    "kill_group",
    "reap_network",
    "start",
    "start_reaper",
    "stop",
    "tagged_with_prefix",
    "wait_any_failure",
]

# The reaper: waits for EOF on its stdin, which comes when `local` ends however it ends (SIGKILL included:
# the kernel closes the pipe), then kills every process of this run's replicas and removes the temp dir
# and the network namespaces `local` wrote to it.
_REAPER = """
import os, shutil, signal, sys, time
namespaces = sys.stdin.buffer.read().decode().split()  # what `local` wrote before it ended: its own, by name
from operator_cli.local.processes import tagged_with_prefix
for _ in range(5):  # a launcher may fork once more while the first sweep runs
    for pid in tagged_with_prefix(sys.argv[1].encode()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.1)
shutil.rmtree(sys.argv[2], ignore_errors=True)
if namespaces:
    from operator_cli.netns import remove
    remove(namespaces)
"""


def _pump(replica: Replica, lock: threading.Lock, verbose: bool) -> None:
    """Copy a replica's output, line by line (a \\r ends a progress line), prefixed by its replica: what
    :func:`operator_cli.local.output.shown` keeps of it, or every line with ``verbose``."""
    stream = replica.proc.stdout
    read = stream.read1 if hasattr(stream, "read1") else stream.read
    prefix = f"[{replica.replica}] "  # the trainer's own lines add "[rank N]"
    for line in text_lines(iter(lambda: read(4096), b""), carriage_return_ends_line=True):
        for text in [line] if verbose else shown(line):
            if text.strip():
                with lock:
                    click.echo(prefix + text)


def start(replicas: list[Replica], wrap, verbose: bool = False) -> list[threading.Thread]:
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
        t = threading.Thread(target=_pump, args=(r, lock, verbose), daemon=True)
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
    return _environ_matches(lambda entries: tag in entries)


def tagged_with_prefix(prefix: bytes) -> list[int]:
    """The processes with an environment entry starting with ``prefix`` (every replica of one run)."""
    return _environ_matches(lambda entries: any(e.startswith(prefix) for e in entries))


def _environ_matches(match) -> list[int]:
    found = []
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    if match(f.read().split(b"\0")):
                        found.append(int(entry.name))
            except OSError:  # gone, or another user's
                continue
    return found


def start_reaper(tag_prefix: bytes, temp_dir: Path) -> subprocess.Popen:
    """A watcher in a session of its own that outlives this process: when ``local`` ends, even by SIGKILL,
    its stdin closes, and it kills every process tagged ``tag_prefix`` and removes ``temp_dir``, and the network
    namespaces named on its stdin (:func:`reap_network`). A pod's containers end with the pod; the replicas (in
    sessions of their own) otherwise trained on, and the namespaces stayed."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(
        [sys.executable, "-c", _REAPER, tag_prefix.decode(), str(temp_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )


def reap_network(reaper: subprocess.Popen, namespace: str) -> None:
    """Tell the reaper of a network namespace this run made: it removes it too, if ``local`` is killed before
    its own clean-up runs. A reaper already gone changes nothing here (``local`` still cleans up itself)."""
    with contextlib.suppress(OSError):
        reaper.stdin.write(namespace.encode() + b"\n")
        reaper.stdin.flush()


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
