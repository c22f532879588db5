"""When this process started, for the time-to-first-step figure in ``metrics.json``.

A module of its own, imported by ``trainer/cli.py`` before anything heavy: ``train.py`` reads it without
importing the entry point (which imports ``rounds.py``, which imports ``train.py``: a cycle).
"""

from __future__ import annotations

import time

__all__ = ["PROCESS_STARTED"]

PROCESS_STARTED = time.time()  # time to first step counts from the first import of this module
