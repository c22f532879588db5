"""Durations as kubectl writes them (``30s``, ``10m``, ``1h30m``), for every flag that takes one: a wait
(``submit --timeout``), a lifetime (``--active-deadline``, ``--ttl-after-finished``), a grace period, a
request timeout, ``logs --since``. A bare number still means seconds, as 0.3 took it (and kubectl's
``--request-timeout`` does).
"""

from __future__ import annotations

import re

import click

from operator_cli.errors import CliError

__all__ = ["DURATION", "Duration", "seconds"]

_FORM = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?")


def seconds(text: str | int | float, flag: str = "a duration") -> float:
    """``1h30m`` -> 5400.0; a bare number is seconds.

    >>> seconds("1h30m"), seconds("45s"), seconds("10m"), seconds("90"), seconds(2.5)
    (5400.0, 45.0, 600.0, 90.0, 2.5)
    >>> seconds("10 minutes", "--timeout")
    Traceback (most recent call last):
    ...
    operator_cli.errors.CliError: --timeout must be a duration like 30s, 10m or 1h30m, got '10 minutes'
    """
    if isinstance(text, int | float):
        return float(text)
    raw = str(text).strip()
    if re.fullmatch(r"\d+(\.\d+)?", raw):
        return float(raw)
    match = _FORM.fullmatch(raw)
    if not raw or not match or not any(match.groups()):
        shown = repr(raw) if len(raw) <= 40 and raw.isprintable() else "a value that is not one (not shown)"
        raise CliError(f"{flag} must be a duration like 30s, 10m or 1h30m, got {shown}", hint="units: h, m, s")
    h, m, s = (float(g or 0) for g in match.groups())
    return h * 3600 + m * 60 + s


class Duration(click.ParamType):
    """A click type for :func:`seconds`: whole seconds (``whole``) or a float, within ``low``..``high``."""

    name = "duration"

    def __init__(self, low: float = 0, high: float | None = None, whole: bool = True):
        self.low, self.high, self.whole = low, high, whole

    def convert(self, value, param, ctx):
        flag = param.opts[-1] if param is not None and param.opts else "a duration"
        value = seconds(value, flag)
        value = int(round(value)) if self.whole else value
        if value < self.low or (self.high is not None and value > self.high):
            top = f" and {self.high:g}s" if self.high is not None else ""
            raise CliError(f"{flag} must be between {self.low:g}s{top}, got {value:g}s")
        return value


DURATION = Duration()
