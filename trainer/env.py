"""Resolve the distributed layout from the environment, once, before any process group exists.

The trainer is started in seven ways, and each sets different variables (the Training Operator v1.9's
PyTorchJob controller sets ``MASTER_*``, ``WORLD_SIZE``, ``RANK`` and, for ``nprocPerNode`` > 1, the
``PET_*`` torchrun variables; Kubeflow Trainer v2 sets ``PET_*`` only):

==========================  ===========================================  =====================
how it was started          variables                                    what we do
==========================  ===========================================  =====================
a torchrun child            LOCAL_RANK, RANK, WORLD_SIZE, MASTER_*       trust them
PyTorchJob, 1 proc per pod  RANK (= pod index), WORLD_SIZE, MASTER_*     one process, rank = RANK
PyTorchJob, nproc > 1       PET_NPROC_PER_NODE > 1 (RANK is a *node*)    start torchrun from PET_*
elastic PyTorchJob          PET_RDZV_ENDPOINT, PET_NNODES=min:max        torchrun's elastic agent (c10d)
TrainJob (Trainer v2)       PET_* only                                   start torchrun from PET_*
``docker run --gpus all``   nothing; GPUs visible                        torchrun, 1 proc per GPU
laptop / CI                 nothing                                      one process
==========================  ===========================================  =====================

:func:`resolve` is a pure function of the environment mapping and the visible GPU count, so every
row above is a table-driven test without torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["EnvError", "Layout", "Launch", "resolve"]


class EnvError(ValueError):
    """An inconsistent launch environment; the message names the variable."""


@dataclass(frozen=True)
class Layout:
    """Where this process sits in the job. Read once; decides device, rank-0 duties and seeds."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    mode: str = "single"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


@dataclass(frozen=True)
class Launch:
    """This process must start ``torchrun`` with these arguments instead of training itself."""

    nnodes: str
    nproc_per_node: str
    node_rank: int
    master_addr: str | None
    master_port: int | None
    mode: str
    rdzv_endpoint: str | None = None  # elastic: the c10d rendezvous; node ranks come from it
    rdzv_backend: str = "c10d"
    rdzv_conf: str | None = None
    max_restarts: int | None = None

    def torchrun_args(self) -> list[str]:
        """Arguments for ``python -m torch.distributed.run``, before the script."""
        args = [f"--nnodes={self.nnodes}", f"--nproc_per_node={self.nproc_per_node}"]
        if self.rdzv_endpoint is not None:
            args += [f"--rdzv_backend={self.rdzv_backend}", f"--rdzv_endpoint={self.rdzv_endpoint}"]
            if self.rdzv_conf:
                args.append(f"--rdzv_conf={self.rdzv_conf}")
            if self.max_restarts is not None:
                args.append(f"--max_restarts={self.max_restarts}")
        elif self.master_addr is None:
            args.append("--standalone")
        else:
            args += [
                f"--node_rank={self.node_rank}",
                f"--master_addr={self.master_addr}",
                f"--master_port={self.master_port or 29500}",
            ]
        return args


def _int(env: Mapping[str, str], name: str, default: int | None = None, minimum: int = 0) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not an integer; unset it or give a whole number") from None
    if value < minimum:
        raise EnvError(f"{name}={value} must be >= {minimum}")
    return value


def _is_int(raw: str | None) -> bool:
    return raw is not None and raw.strip().lstrip("-").isdigit()


def _check_local_rank(local_rank: int, gpu_count: int) -> None:
    if gpu_count and local_rank >= gpu_count:
        raise EnvError(
            f"LOCAL_RANK={local_rank} but only {gpu_count} GPU(s) are visible; "
            "lower --nproc_per_node or check CUDA_VISIBLE_DEVICES"
        )


def _master(env: Mapping[str, str], world_size: int, prefix: str = "") -> tuple[str | None, int | None]:
    addr = env.get(f"{prefix}MASTER_ADDR") or None
    port = _int(env, f"{prefix}MASTER_PORT", minimum=1)
    if world_size > 1 and addr is None:
        raise EnvError(f"{prefix}MASTER_ADDR is not set but WORLD_SIZE={world_size}; set it to rank 0's host")
    if port is not None and port > 65535:
        raise EnvError(f"{prefix}MASTER_PORT={port} is not a TCP port (1-65535)")
    return addr, port


def _nnodes(env: Mapping[str, str]) -> str:
    """PET_NNODES as torchrun takes it: N, or MIN:MAX for an elastic job."""
    nnodes = env.get("PET_NNODES", "1")
    low, _, high = nnodes.partition(":")
    if not (low.isdigit() and (high or low).isdigit() and 1 <= int(low) <= int(high or low)):
        raise EnvError(f"PET_NNODES={nnodes!r} must be N or MIN:MAX with 1 <= MIN <= MAX")
    return nnodes


def _nproc(env: Mapping[str, str]) -> str | None:
    """PET_NPROC_PER_NODE as torchrun takes it (a positive integer, auto, gpu or cpu), or None when unset."""
    nproc = env.get("PET_NPROC_PER_NODE")
    if nproc is not None and not (_is_int(nproc) and int(nproc) >= 1) and nproc not in ("auto", "gpu", "cpu"):
        raise EnvError(f"PET_NPROC_PER_NODE={nproc!r} must be a positive integer, auto, gpu or cpu")
    return nproc


def _elastic(env: Mapping[str, str], endpoint: str) -> Launch:
    host, sep, port = endpoint.rpartition(":")
    if not (sep and host and port.isdigit() and 1 <= int(port) <= 65535):
        raise EnvError(f"PET_RDZV_ENDPOINT={endpoint!r} must be HOST:PORT (the rendezvous, e.g. <job>-worker-0:23456)")
    nnodes = _nnodes(env)
    backend = env.get("PET_RDZV_BACKEND") or "c10d"
    if backend != "c10d":
        raise EnvError(f"PET_RDZV_BACKEND={backend!r}: only c10d is supported (elasticPolicy.rdzvBackend: c10d)")
    return Launch(
        nnodes,
        _nproc(env) or "auto",
        0,
        None,
        None,
        mode="elastic",
        rdzv_endpoint=endpoint,
        rdzv_backend=backend,
        rdzv_conf=env.get("PET_RDZV_CONF") or None,
        max_restarts=_int(env, "PET_MAX_RESTARTS"),
    )


def resolve(env: Mapping[str, str], gpu_count: int = 0) -> Layout | Launch:
    """Decide how this process runs from its environment.

    Args:
        env: the process environment (``os.environ``).
        gpu_count: CUDA devices visible to this process.

    Returns:
        A :class:`Layout` to train with, or a :class:`Launch` telling the caller to start torchrun.

    Raises:
        EnvError: the variables contradict each other; the message names the variable.
    """
    # 1. torchrun child: torchrun sets LOCAL_RANK and rewrites RANK/WORLD_SIZE per process.
    if "LOCAL_RANK" in env:
        local_rank = _int(env, "LOCAL_RANK")
        world_size = _int(env, "WORLD_SIZE", 1, minimum=1)
        rank = _int(env, "RANK", 0)
        if rank >= world_size:
            raise EnvError(f"RANK={rank} must be below WORLD_SIZE={world_size}")
        _check_local_rank(local_rank, gpu_count)
        addr, port = _master(env, world_size)
        return Layout(rank, world_size, local_rank, addr, port, mode="torchrun")

    # 2a. An elastic PyTorchJob (Workers only, elasticPolicy): torchrun's agents rendezvous at the endpoint.
    if endpoint := env.get("PET_RDZV_ENDPOINT"):
        return _elastic(env, endpoint)

    nproc_raw = _nproc(env)
    nproc = int(nproc_raw) if _is_int(nproc_raw) else None
    has_rank = "RANK" in env or "WORLD_SIZE" in env

    # 2. PyTorchJob v1 with several processes per pod, or Trainer v2 (PET_* only): torchrun does the rest.
    if (nproc is not None and nproc > 1) or ("PET_NNODES" in env and not has_rank):
        nnodes = _nnodes(env)
        node_rank = _int(env, "PET_NODE_RANK", 0)
        if _is_int(nnodes) and node_rank >= int(nnodes):
            raise EnvError(f"PET_NODE_RANK={node_rank} must be below PET_NNODES={nnodes}")
        multi_node = not _is_int(nnodes) or int(nnodes) > 1
        addr, port = _master(env, 2 if multi_node else 1, prefix="PET_")
        if nproc is not None and gpu_count and nproc > gpu_count:
            raise EnvError(
                f"PET_NPROC_PER_NODE={nproc} but only {gpu_count} GPU(s) are visible; "
                "set --gpus-per-node to the GPUs each node really has"
            )
        mode = "pytorchjob-torchrun" if has_rank else "trainjob" if "PET_NNODES" in env else "standalone"
        return Launch(nnodes, nproc_raw or "auto", node_rank, addr, port, mode)

    # 3. PyTorchJob v1, one process per pod: RANK is the pod index and also the global rank.
    if has_rank:
        world_size = _int(env, "WORLD_SIZE", 1, minimum=1)
        rank = _int(env, "RANK", 0)
        if rank >= world_size:
            raise EnvError(f"RANK={rank} must be below WORLD_SIZE={world_size}")
        addr, port = _master(env, world_size)
        return Layout(rank, world_size, 0, addr, port, mode="pytorchjob")

    # 4. One container with several GPUs and no launcher: one process per GPU through torchrun.
    if gpu_count > 1:
        return Launch("1", str(gpu_count), 0, None, None, mode="standalone")

    # 5. A plain single process.
    return Layout(mode="single")
