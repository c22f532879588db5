"""An elastic PyTorchJob replayed here: each replica runs torchrun's elastic agent, as each pod would.

What the Training Operator and the kubelet do, and what stands for it here:

* a **worker process** that fails (a lost peer, exit 129) is restarted by its own agent, which re-forms
  the group with whoever is still there (``elasticPolicy.maxRestarts``): nothing to do here;
* a **pod** whose container fails is restarted in place by the kubelet (``restartPolicy``, within
  ``backoffLimit``); its agent rejoins at the next rendezvous and the group grows again. Here the
  replica alone is started again; ``ExitCode`` fails the job on 1-127, as the operator does;
* a **node gone for good** (a reclaimed spot VM) leaves its pod Pending until capacity returns. Here a
  replica killed with SIGKILL stands for it: it is not started again, and the survivors re-form the
  group on fewer nodes and resume from the newest checkpoint at the new world size;
* the job succeeds when every replica still there succeeds, and fails when fewer than MIN are left.

The agents find each other through the c10d store at ``PET_RDZV_ENDPOINT`` (replica 0's, as worker-0's on a
cluster): the replica that hosts it cannot be the one that goes for good, on a cluster as here.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import click

from operator_cli.local.processes import kill_group, start
from operator_cli.local.replicas import Replica
from operator_cli.podplan import PodPlan

__all__ = ["replay_elastic"]


def replay_elastic(plan: PodPlan, replicas: list[Replica], wrap: Callable, verbose: bool = False) -> tuple[int, int]:
    """Run the replicas until the job ends: (0 when it succeeded, 1 when it failed; replica restarts).
    ``verbose``: every line of their output (processes.start)."""
    low, high = plan.elastic
    live = {r.replica: r for r in replicas}
    done: set[str] = set()
    restarts = 0
    threads = start(replicas, wrap, verbose)
    while True:
        for r in list(live.values()):
            code = r.proc.poll()
            if code is None:
                continue
            if code == 0:
                done.add(r.replica)
                continue
            kill_group(r)  # the container is gone, and every process it started with it
            del live[r.replica]
            if code == -signal.SIGKILL:
                click.echo(
                    f"local: replica {r.replica} was killed (SIGKILL): a node gone for good, not started again; "
                    f"{len(live)} of {high} node(s) left, the job needs {low}",
                    err=True,
                )
                if len(live) < low:
                    click.echo(f"error: job {plan.name} failed: fewer than {low} node(s) are left", err=True)
                    return 1, restarts
                continue
            why = f"signal {-code}" if code < 0 else f"exit code {code}"
            permanent = plan.failure.is_permanent(code)
            if permanent or restarts >= plan.backoff_limit:
                verdict = "a permanent failure" if permanent else f"backoffLimit {plan.backoff_limit} is used up"
                click.echo(f"error: job {plan.name} failed: replica {r.replica} ended with {why} ({verdict})", err=True)
                return 1, restarts
            restarts += 1
            click.echo(
                f"local: replica {r.replica} ended with {why}; restarting it ({restarts}/{plan.backoff_limit}); "
                "its agent rejoins the rendezvous",
                err=True,
            )
            threads += start([r], wrap, verbose)
            live[r.replica] = r
        if live and set(live) <= done:
            for t in threads:
                t.join(timeout=5)
            return 0, restarts
        time.sleep(0.2)
