"""Long-running client loops over the API: wait for a job to end, follow its pods' logs.

Both poll through :class:`operator_cli.kube.Cluster`, whose every request has a timeout, so a stalled
API server ends them with one line; ``wait_for_job`` also has a deadline of its own (``--timeout``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from operator_cli.errors import CliError
from operator_cli.kube.cluster import Cluster
from operator_cli.kube.kinds import job_state, kind_of

__all__ = ["wait_for_job", "follow_logs"]

Echo = Callable[..., None]


def wait_for_job(cluster: Cluster, name: str, poll_interval: float, timeout: float | None, echo: Echo) -> int:
    """Print each state change until the job succeeds (0) or fails (1); a deadline is one line, exit 1."""
    deadline = time.monotonic() + timeout if timeout else None
    last = None
    while True:
        job = cluster.get_job(name)
        state = job_state(job)
        if state != last:
            echo(f"{time.strftime('%H:%M:%S')} {name}: {state}")
            last = state
        if state in ("Succeeded", "Failed"):
            if state == "Failed":
                for pod in cluster.pods(job):
                    if pod.reason:
                        echo(f"  {pod.replica}: {pod.reason}", err=True)
            return 0 if state == "Succeeded" else 1
        if deadline is not None and time.monotonic() >= deadline:
            raise CliError(
                f"job {name} is still {state} after --timeout {timeout:g}s; it keeps running on the cluster",
                hint=f"follow it with `colbert-k8s status {name}`, or stop it with `colbert-k8s delete {name}`",
                exit_code=1,
            )
        sleep = poll_interval if deadline is None else max(0.0, min(poll_interval, deadline - time.monotonic()))
        time.sleep(sleep)


def follow_logs(
    cluster: Cluster, name: str, want: int | None, poll_interval: float, echo: Echo, query: dict | None = None
) -> None:
    _follow(cluster, cluster.get_job(name), want, poll_interval, echo, query or {})


def _follow(cluster: Cluster, job: dict, want: int | None, poll_interval: float, echo: Echo, query: dict) -> None:
    """Follow each wanted pod in its own thread; re-attach after a restart; stop when the job ends.

    ``query`` (--tail, --since, --timestamps) shapes the first attach to a pod; after a restart the new
    container's log is followed from its start, as kubectl would show it."""
    name, kind = job["metadata"]["name"], kind_of(job)
    lock = threading.Lock()
    seen_restarts: dict[str, int] = {}
    threads: dict[str, threading.Thread] = {}

    def stream(pod, first: bool) -> None:
        options = query if first else {"timestamps": query.get("timestamps", False)}
        try:
            for line in cluster.log_lines(pod.name, kind, follow=True, **options):
                with lock:
                    echo(f"[{pod.replica} rank {pod.rank}] {line}")
        except CliError:
            pass  # the container is restarting; the poller re-attaches

    while True:
        for pod in cluster.pods(job):
            if want is not None and pod.rank != want:
                continue
            alive = threads.get(pod.name)
            restarted = seen_restarts.get(pod.name, pod.restarts) != pod.restarts
            if (alive is None or (not alive.is_alive() and restarted)) and pod.phase != "Pending":
                if restarted:
                    echo(f"[{pod.replica} rank {pod.rank}] --- container restarted ({pod.restarts}) ---")
                seen_restarts[pod.name] = pod.restarts
                threads[pod.name] = threading.Thread(target=stream, args=(pod, alive is None), daemon=True)
                threads[pod.name].start()
        if job_state(cluster.get_job(name)) in ("Succeeded", "Failed"):
            for t in threads.values():
                t.join(timeout=poll_interval)
            return
        time.sleep(poll_interval)
