"""A pod's CPU, memory and devices: what the scheduler and a namespace's ResourceQuota read.

Without ``--cpu``/``--memory`` an 8-GPU pod asked for ``nvidia.com/gpu: 8`` alone: the scheduler placed it
blind and a quota on ``requests.cpu`` or ``requests.memory`` refused it. So every pod now *requests* CPU and
memory, derived from ``--gpus-per-node`` (:data:`CPU_PER_GPU`, :data:`MEMORY_PER_GPU_MI`) unless given. A
given ``--cpu``/``--memory`` is request and limit, as before; a derived one is a request only (a CPU limit
throttles data loading, and the node's own memory is the limit that matters).

``/dev/shm`` is a memory-backed emptyDir: its pages are charged to the pod's memory cgroup. The derived
memory request adds it, and a ``--memory`` that it would fill (shm >= memory) is refused in one line.

``--nccl ib`` asks for the RDMA device the device plugin offers (``--rdma-resource``, default
:data:`constants.RDMA_RESOURCE`; names differ between plugins) and adds ``IPC_LOCK`` (NCCL pins its
InfiniBand buffers), every other capability still dropped. The chart's ``_helpers.tpl`` renders the same
(``colbert-train.requests``); the equivalence tests compare them.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

from operator_cli.errors import CliError

__all__ = [
    "CPU_PER_GPU",
    "CPU_POD_CPU",
    "MEMORY_PER_GPU_MI",
    "CPU_POD_MEMORY_MI",
    "check_shm",
    "default_cpu",
    "default_memory",
    "quantity_bytes",
]

CPU_PER_GPU = 4  # data loading, tokenising and NCCL's proxy threads per process
CPU_POD_CPU = 4  # a CPU job's one process trains on these
MEMORY_PER_GPU_MI = 16 * 1024  # a process's host memory: the model, its optimizer state, a corpus chunk
CPU_POD_MEMORY_MI = 8 * 1024
_MI = 1024 * 1024
_DECIMAL = {"": 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_SUFFIX = {**_DECIMAL, **{f"{p}i": 2 ** (10 * n) for n, p in enumerate("KMGTPE", start=1)}}


def quantity_bytes(quantity: str) -> Decimal:
    """A Kubernetes quantity (already checked by ``rules.PATTERNS["quantity"]``) as a number.

    >>> quantity_bytes("8Gi") == 8 * 2**30, quantity_bytes("1.5G"), quantity_bytes("1e3")
    (True, Decimal('1500000000.0'), Decimal('1000'))
    """
    number, suffix = re.fullmatch(r"([0-9.]+)((?:[eE][+-]?[0-9]+)|[A-Za-z]*)", quantity).groups()
    if suffix[:1] in ("e", "E") and suffix not in _SUFFIX:
        return Decimal(number) * Decimal(10) ** int(suffix[1:])
    return Decimal(number) * _SUFFIX[suffix]


def default_cpu(gpus_per_node: int) -> str:
    """The CPU request of a pod without ``--cpu``.

    >>> default_cpu(8), default_cpu(0)
    ('32', '4')
    """
    return str(CPU_PER_GPU * gpus_per_node if gpus_per_node else CPU_POD_CPU)


def default_memory(gpus_per_node: int, shm_size: str | None) -> str:
    """The memory request of a pod without ``--memory``: the processes' share plus /dev/shm, in whole Mi
    (shown in Gi when whole), as the chart computes it.

    >>> default_memory(8, "8Gi"), default_memory(1, None), default_memory(0, "1G")
    ('136Gi', '16Gi', '9146Mi')
    """
    mi = MEMORY_PER_GPU_MI * gpus_per_node if gpus_per_node else CPU_POD_MEMORY_MI
    if shm_size:
        mi += math.ceil(quantity_bytes(shm_size) / _MI)
    return f"{mi // 1024}Gi" if mi % 1024 == 0 else f"{mi}Mi"


def check_shm(shm_size: str | None, memory: str | None) -> None:
    """``/dev/shm`` counts against the pod's memory: a ``--memory`` it would fill is refused in one line.

    >>> check_shm("8Gi", "9Gi")
    >>> check_shm("8Gi", "8Gi")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    operator_cli.errors.CliError: --shm-size 8Gi would fill --memory 8Gi: /dev/shm is memory-backed and ...
    """
    if shm_size and memory and quantity_bytes(shm_size) >= quantity_bytes(memory):
        raise CliError(
            f"--shm-size {shm_size} would fill --memory {memory}: /dev/shm is memory-backed and counts against "
            "the pod's memory limit",
            hint="raise --memory above --shm-size plus what the processes need, or lower --shm-size",
        )
