"""``colbert-train --config FILE.yaml``: read the config, stage the data, start torchrun or train, and
turn every known failure into one line and an exit code.

The config is read before torch is imported, so a bad key costs a second, not a torch import and a
process group. Staging (downloads, the Arrow copy of the rows) runs here, once per pod, before any
process group exists: a long download cannot trip a collective's timeout.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import trainer.run.clock  # noqa: F401 (first: the start that time to first step counts from)
from trainer.baseline import BelowBase
from trainer.config.load import load_config, load_yaml, parse_config, read_config_text
from trainer.config.overrides import apply, parse_override
from trainer.config.schema import ConfigError, TrainConfig
from trainer.env import EnvError, Launch, resolve
from trainer.errors import (
    EXIT_CONFIG,
    EXIT_DIR_ENV,
    EXIT_EXPORT,
    EXIT_PEER,
    DiskFull,
    NonFinite,
    PhaseNotWhole,
    WeightsDiverged,
    job_exit_code,
    no_space,
    peer_failure,
)
from trainer.redirects import guard_hub
from trainer.reporting.metrics_file import write_metrics_line
from trainer.run.preemption import EXIT_PREEMPTED, Preempted
from trainer.storage import export
from trainer.storage.export import ExportFailed

__all__ = ["dump_stacks_on_sigusr1", "main", "setup_logging", "stage", "launch_torchrun"]

log = logging.getLogger("trainer")

DESCRIPTION = (
    "Train a ColBERT model as the config says: read and check the config, stage the data, then train in this "
    "process or start torchrun with one process per GPU. Every known failure is one line and an exit code "
    "(1-127 permanent, 128-255 retryable)."
)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``colbert-train`` and ``python -m trainer``: the exit code follows the rule in
    ``trainer/errors.py`` (1-127 permanent, 128-255 retryable).

    A torchrun child tells its launcher the code on every way out that Python sees, an exception that
    escapes included (Python prints its traceback and exits 1): said nothing, it counted as a lost peer
    (129, retryable), so the same bug failed a one-process pod at once and was retried under torchrun."""
    code = 1  # Python's exit code for an exception that escapes
    dump_stacks_on_sigusr1()
    try:
        code = _main(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:  # argparse's 2
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
        raise
    except KeyboardInterrupt:  # before _main's own handler: Python ends by SIGINT, 130 to a shell
        code = 130
        raise
    except BaseException:  # a bug: its traceback, which Python prints next, starts a line of its own
        _end_progress_bars()
        raise
    finally:
        if exit_dir := os.environ.get(EXIT_DIR_ENV):  # a torchrun child: tell the launcher why
            with contextlib.suppress(OSError):
                (Path(exit_dir) / f"{os.environ.get('RANK', '0')}.code").write_text(str(code))
    return code


def dump_stacks_on_sigusr1() -> None:
    """``kill -USR1 <pid>`` (``kubectl exec POD -- kill -USR1 1``) prints every thread's Python stack to stderr
    and the process goes on: a job that hangs says where, without a debugger in the image. Under torchrun, PID 1
    is the launcher: it passes the signal to the trainers (:func:`launch_torchrun`)."""
    if hasattr(signal, "SIGUSR1") and sys.__stderr__ is not None:  # fd 2, also where sys.stderr is replaced
        with contextlib.suppress(OSError, ValueError):
            faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)


def _dump_workers_of(agent: int) -> None:
    """SIGUSR1 to each trainer torchrun's agent ``agent`` started (its children, as Linux lists them)."""
    with contextlib.suppress(OSError):
        for pid in Path(f"/proc/{agent}/task/{agent}/children").read_text().split():
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGUSR1)


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="colbert-train", description=DESCRIPTION)
    parser.add_argument("--config", required=True, metavar="FILE.yaml", help="the training config (docs/trainer.md)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key (a sweep's trial values; trainer/config/overrides.py)",
    )
    parser.add_argument(
        "--metrics-file",
        help="append each evaluation here as a JSON line (Katib's File collector): the periodic ones as they "
        "happen, the final one at the end (trainer/reporting/metrics_file.py)",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    setup_logging(os.environ.get("RANK", "0"))  # until the layout is resolved
    try:
        cfg = _load(args.config, args.set)
        for key, where in (("output_dir", cfg.output_dir), ("data.cache_dir", cfg.data.cache_dir)):
            writable_dir(where, key)
        guard_hub()  # HF_TOKEN only to the Hub's origin, for every download and upload of this process
        if not os.environ.get(EXIT_DIR_ENV):  # once per pod: torchrun's children were checked by their launcher
            export.preflight(cfg)  # a bad destination is found now, not after hours of training
            if cfg.vectordb is not None:  # the vector database answers, and the collection is not another's
                from trainer.destinations.claim import preflight as vectordb_preflight

                vectordb_preflight(cfg)
            if cfg.registration is not None:
                from trainer.serve.register import preflight

                preflight(cfg)
        cfg = stage(cfg)
        import torch  # only now: a bad config never waits for torch

        plan = resolve(os.environ, torch.cuda.device_count())
        if isinstance(plan, Launch):
            code = launch_torchrun(plan, argv)
            if code == 0 and args.metrics_file:  # the launcher, once per pod: the children are done
                write_metrics_line(cfg.output_dir, args.metrics_file)
            return code
        setup_logging(plan.rank)
        from trainer.rounds import run  # torch, transformers, pylate: imported once the config is good

        run(cfg, plan, args.metrics_file)  # the export, when asked for, is its last phase
        if args.metrics_file and not os.environ.get(EXIT_DIR_ENV):  # a torchrun child leaves it to its launcher
            write_metrics_line(cfg.output_dir, args.metrics_file)
        return 0
    except (ConfigError, EnvError) as e:
        return _fail(str(e), EXIT_CONFIG)
    except ExportFailed as e:  # the model is safe in output_dir; a restart retries the export alone
        return _fail(f"{e}; the model is kept in output_dir and a restart retries the export", EXIT_EXPORT)
    except Preempted as e:
        _say(str(e))
        return EXIT_PREEMPTED
    except (NonFinite, DiskFull, BelowBase) as e:
        return _fail(str(e), EXIT_CONFIG)
    except (WeightsDiverged, PhaseNotWhole) as e:
        return _fail(str(e), EXIT_PEER)
    except (OSError, RuntimeError) as e:  # a write outside trainer/atomic.py's, or a collective
        if cause := no_space(e):
            return _fail(str(DiskFull.of(cause, cause.filename or ".")), EXIT_CONFIG)
        if isinstance(e, RuntimeError) and (line := peer_failure(e)):
            return _fail(line, EXIT_PEER)
        raise
    except ModuleNotFoundError as e:
        return _fail(
            f"{e.name} is not installed; install the trainer with pip install 'colbert-k8s[train]'", EXIT_CONFIG
        )
    except KeyboardInterrupt:
        _say("interrupted; the newest checkpoint is kept for resume")
        return 130


def _load(path: str, overrides: list[str]) -> TrainConfig:
    """The config file, with ``--set`` overrides applied before the schema reads it."""
    if not overrides:
        return load_config(path)
    data = load_yaml(read_config_text(path), path)
    if not isinstance(data, dict):
        return parse_config(data, path)  # its one line: the top level must be a mapping
    for item in overrides:
        data = apply(data, *parse_override(item))
    return parse_config(data, f"{path} with --set")


def writable_dir(path: str, key: str) -> None:
    """Check now, before minutes of staging and model loading, that ``path`` can be created and written: its
    nearest existing ancestor is a directory this process may write. Nothing is created (only rank 0 writes
    output_dir; a worker's emptyDir never holds one)."""
    at = Path(path).absolute()
    while not at.exists() and at != at.parent:
        at = at.parent
    problem = None
    if not at.is_dir():
        problem = "not a directory"
    elif not os.access(at, os.W_OK | os.X_OK):
        problem = "not writable"
    if problem:
        raise ConfigError(f"{key} {path} cannot be created or written ({at} is {problem}); fix {key}")


def _fail(line: str, code: int) -> int:
    _say(f"error: {line}")
    return code


def _say(line: str) -> None:
    """The one line that ends a job and names why, on a line of its own in the job's log."""
    _end_progress_bars()
    print(f"colbert-train: {line}", file=sys.stderr)


def _end_progress_bars() -> None:
    """Close the progress bars a failure left open (a loop's, or a library's inside it). An open bar's line has
    no end, so the line naming the failure was written onto it, where a reader that skips progress lines (the
    log shown by ``colbert-k8s local``, a grep for bars) dropped the cause with the bar."""
    try:
        from tqdm import tqdm
    except ImportError:  # no bar was ever shown
        return
    for bar in list(getattr(tqdm, "_instances", ())):
        with contextlib.suppress(Exception):  # a bar of a dead writer: the line below is what matters
            bar.close()


def setup_logging(rank: int | str) -> None:
    logging.basicConfig(
        level=logging.INFO,
        format=f"[rank {rank}] %(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
        force=True,
    )
    for noisy in ("transformers", "sentence_transformers", "pylate", "httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


def stage(cfg: TrainConfig) -> TrainConfig:
    """Fetch remote sources into the cache and convert the training rows to Arrow (once per pod);
    torchrun's children then find everything in the cache."""
    from trainer.data import load_rows  # pyarrow: not needed to report a bad config
    from trainer.reporting.tracking import check_sinks
    from trainer.storage.sources import check_present, stage_config

    check_sinks(cfg.tracking.report_to)
    cfg = stage_config(cfg)
    check_present(cfg)  # every section's files, before any mining or training
    if cfg.model.projection_init == "principal":  # a model with its own projection: refused before mining
        from trainer.projection import check_new_projection

        check_new_projection(cfg.model)
    if cfg.mine:  # mining reads (query, positive) pairs; it writes the rows training reads
        load_rows(cfg.data.train.pairs(), distillation=False, cache_dir=cfg.data.cache_dir)
    else:
        load_rows(cfg.data.train, distillation=cfg.loss.scored, cache_dir=cfg.data.cache_dir)
    return cfg


def launch_torchrun(launch: Launch, argv: list[str]) -> int:
    """Re-run this entry point under torch's own launcher (one child per process of this node).

    In a container this process is PID 1, the one the kubelet sends SIGTERM to: it is passed on to
    torchrun, which passes it to the trainers, so they checkpoint before the grace period ends."""
    cmd = [sys.executable, "-m", "torch.distributed.run", *launch.torchrun_args(), "-m", "trainer", *argv]
    log.info("launch mode %s: %s", launch.mode, " ".join(cmd))
    exit_dir = Path(tempfile.mkdtemp(prefix="colbert-exit-"))
    env = {**os.environ, EXIT_DIR_ENV: str(exit_dir)}
    if launch.mode == "elastic":
        # Each agent counts its own restarts, and the workers' shared store is prefixed by that count: after
        # a restart for a failure on one node and for a membership change on another, the two sides wait in
        # init_process_group under different prefixes, forever (pytorch/pytorch#135712; seen here in
        # tests/test_elastic.py). A store of the round's own, hosted by its rank 0, has no such count.
        env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    child = subprocess.Popen(cmd, env=env)
    previous = {
        sig: signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
        for sig in (signal.SIGTERM, signal.SIGINT)
    }
    if hasattr(signal, "SIGUSR1"):  # the stacks worth having are the trainers' (the agent would die of it)
        signal.signal(signal.SIGUSR1, lambda _signum, _frame: _dump_workers_of(child.pid))
    try:
        code = child.wait()
        said = [p.read_text() for p in exit_dir.glob("*.code")]
        return job_exit_code(code, [int(text) for text in said if text.isdigit()])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(exit_dir, ignore_errors=True)
