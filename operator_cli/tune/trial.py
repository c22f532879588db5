"""One trial of a local sweep, in a process of its own: ``python -m operator_cli.tune.trial TRIAL_DIR`` replays
``TRIAL_DIR/job.yaml`` (the trial's job as ``render`` prints it) with ``TRIAL_DIR`` as its volume, exactly as
``colbert-k8s local`` does; its exit status is the job's."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from operator_cli.errors import CliError

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    from operator_cli.local import run_local  # the replay: subprocesses, the trainer's config

    tdir = Path((sys.argv[1:] if argv is None else argv)[0])
    objects = list(yaml.safe_load_all((tdir / "job.yaml").read_text()))
    try:
        return run_local(objects, tdir)
    except CliError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
