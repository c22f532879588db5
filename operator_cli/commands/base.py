"""What every command shares: the group and command classes that turn any error into one line (plus a hint)
and refuse a single-valued flag given twice, and the options and helpers of the cluster commands."""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import click

from operator_cli import constants as C
from operator_cli.durations import Duration
from operator_cli.errors import CliError
from operator_cli.kube.cluster import Cluster
from operator_cli.kube.transport import connect, redact
from operator_cli.kube.transport import default_namespace as kubeconfig_namespace
from operator_cli.options import JOB_OPTIONS, Option
from operator_cli.values import shown

__all__ = [
    "Command",
    "Group",
    "click_option",
    "cluster_of",
    "cluster_options",
    "default_namespace",
    "job_name",
    "missing_modules",
    "namespace_option",
    "output_option",
    "trainer_log_to_stderr",
]


PATH_ENV = ("KUBECONFIG",)
"""Environment variables that name files (``os.pathsep``-separated lists, as kubectl reads them)."""
_PATH_ERRNOS = {errno.ENAMETOOLONG, errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.ELOOP, errno.EACCES, errno.EPERM}


class Command(click.Command):
    """Refuses a single-valued option given twice (click would silently keep the last one), and turns an
    OSError about a path the user gave (an option, an argument or :data:`PATH_ENV`) into one line naming it."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except OSError as e:
            source = path_source(ctx, e.filename) if e.errno in _PATH_ERRNOS else None
            if source is None:
                raise
            hint = f"check the path {source} names"
            if e.errno == errno.ENAMETOOLONG:
                hint = f"give {source} a shorter path (at most 4096 bytes, each name at most 255)"
            raise CliError(f"{source}: {e.strerror}: {shown(os.fsdecode(e.filename))}", hint=hint) from None

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        single = {
            name: opt
            for opt in self.params
            if isinstance(opt, click.Option) and not opt.multiple and not opt.count
            for name in opt.opts
        }
        seen: dict[str, str] = {}
        for arg in args:
            if arg == "--":
                break
            flag = arg.split("=", 1)[0]
            if flag in single:
                key = single[flag].name
                if key in seen:
                    also = "" if seen[key] == flag else f" (also as {seen[key]})"
                    raise CliError(f"{flag} is given twice{also}; keep one")
                seen[key] = flag
        return super().parse_args(ctx, args)


def path_source(ctx: click.Context, filename: Any) -> str | None:
    """Which option or argument the user gave, or which :data:`PATH_ENV` variable, names ``filename`` (itself
    or a folder above it); None when none does (the path is a default, or this tool's own)."""
    if not isinstance(filename, (str, bytes, os.PathLike)):
        return None
    target = os.path.abspath(os.fsdecode(filename))
    found: list[tuple[int, str]] = []

    def match(value: Any, source: str) -> None:
        if isinstance(value, (str, os.PathLike)) and os.fsdecode(value):
            given = os.path.abspath(os.fsdecode(value))
            if target == given or target.startswith(given.rstrip(os.sep) + os.sep):
                found.append((len(given), source))

    for param in ctx.command.params:
        if ctx.get_parameter_source(param.name) in (None, click.core.ParameterSource.DEFAULT):
            continue
        values = ctx.params.get(param.name)
        source = next((o for o in param.opts if o.startswith("--")), param.opts[0])
        for value in values if isinstance(values, (tuple, list)) else [values]:
            match(value, source if isinstance(param, click.Option) else "a path argument")
    for var in PATH_ENV:
        for value in os.environ.get(var, "").split(os.pathsep):
            match(value, f"${var}")
    return max(found)[1] if found else None


class Usage(click.UsageError):
    """Click's own usage errors (an unknown flag, a value out of range) in the same two lines as ours,
    instead of its usage banner and a blank line."""

    def show(self, file=None) -> None:
        command = self.ctx.command_path if self.ctx else "colbert-k8s"
        click.echo(f"error: {self.format_message()}", err=True)
        click.echo(f"hint: see `{command} --help`", err=True)


class Group(click.Group):
    """Shows a CliError as one line (plus a hint) and its exit code, never a traceback; ``--help`` lists the
    commands by section (``sections``: title -> command names, as kubectl's help groups them), each with its
    whole first sentence."""

    command_class = Command
    sections: dict[str, tuple[str, ...]] = {}

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if not self.sections:
            return super().format_commands(ctx, formatter)
        listed = {name for names in self.sections.values() for name in names}
        rest = tuple(n for n in self.list_commands(ctx) if n not in listed)
        for title, names in [*self.sections.items(), *([("Other commands", rest)] if rest else [])]:
            rows = [
                (n, c.get_short_help_str(limit=1000))
                for n in names
                if (c := self.get_command(ctx, n)) is not None and not c.hidden
            ]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)
        return None

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.exceptions.NoArgsIsHelpError:  # a bare `colbert-k8s` shows the help, as click does
            raise
        except click.UsageError as e:  # `colbert-k8s --bogus`, `colbert-k8s sumbit`
            raise Usage(e.format_message(), e.ctx) from None

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except CliError as e:
            click.echo(f"error: {redact(e.message)}", err=True)
            if e.hint:
                click.echo(f"hint: {redact(e.hint)}", err=True)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)
        except click.UsageError as e:  # a subcommand's flags: unknown, missing, out of range
            raise Usage(e.format_message(), e.ctx) from None
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as e:  # a bug of ours: still one line, and the details on request
            if os.environ.get("COLBERT_K8S_DEBUG"):
                raise
            first = redact(str(e).splitlines()[0] if str(e) else "")[:200]
            click.echo(f"error: internal error ({type(e).__name__}: {first})", err=True)
            click.echo("hint: rerun with COLBERT_K8S_DEBUG=1 for the traceback, and report it", err=True)
            ctx.exit(70)


def cluster_options(fn):
    """``--kubeconfig``, ``--context`` and ``--request-timeout``: how a command reaches the cluster."""
    fn = click.option(
        "--request-timeout",
        default=f"{C.REQUEST_TIMEOUT:g}s",
        show_default=True,
        type=Duration(low=1, high=600, whole=False),
        help="How long to wait for each API request, e.g. 30s or 2m (a stalled server ends the command with one line).",
    )(fn)
    fn = click.option("--context", help="kubeconfig context to use.")(fn)
    fn = click.option(
        "--kubeconfig", type=click.Path(dir_okay=False), help="Default: $KUBECONFIG, ~/.kube/config, in-cluster."
    )(fn)
    return fn


_BY_FLAG = {o.flag: o for o in JOB_OPTIONS}
_NAMESPACE, _NAME = _BY_FLAG["--namespace"], _BY_FLAG["--name"]  # declared once: the job's own options


def click_option(option: Option, defaults: dict[str, Any]) -> Callable[[Any], Any]:
    """The click option of one :class:`Option` (``JOB_OPTIONS``, ``RUNTIME_OPTIONS``): its default is the spec's
    field's (one place states them)."""
    kwargs: dict = {"help": option.help or None, "metavar": option.metavar, "required": option.required}
    if option.is_flag:
        kwargs["is_flag"] = True
    elif option.multiple:
        kwargs["multiple"] = True
    elif option.choices:
        kwargs["type"] = click.Choice(option.choices)
    elif option.file:
        kwargs["type"] = click.Path(dir_okay=False)
    else:  # str too: click would take an int default (a duration's seconds) as the type
        kwargs["type"] = option.type
    if option.show_default:
        kwargs.update(default=defaults[option.spec_field], show_default=True)
    return click.option(*filter(None, (option.short, option.flag)), **kwargs)


def namespace_option(fn):
    """``-n/--namespace`` of the commands that read or change a job: the job option itself (help and rule)."""
    return click_option(_NAMESPACE, {})(fn)


def output_option(fn):
    """``-o FORMAT``, as kubectl's: the table, or the same fields as JSON or YAML."""
    return click.option(
        "-o",
        "--output",
        type=click.Choice(["table", "json", "yaml"]),
        default="table",
        show_default=True,
        help="json/yaml: the same fields as the table, for scripts (as kubectl -o).",
    )(fn)


def default_namespace(o: dict) -> str:
    """The kubeconfig context's namespace (``--kubeconfig``, ``--context``), else 'default'."""
    return kubeconfig_namespace(o.get("kubeconfig"), o.get("context"))


def cluster_of(o: dict) -> Cluster:
    """The :class:`operator_cli.kube.Cluster` the options name (its namespace checked before any request)."""
    namespace = default_namespace(o) if o.get("namespace") is None else o["namespace"]  # -n "" is refused
    _NAMESPACE.check(namespace)
    return Cluster(
        connect(o.get("kubeconfig"), o.get("context"), o.get("request_timeout", C.REQUEST_TIMEOUT)), namespace
    )


def job_name(name: str) -> str:
    """A NAME argument, checked before any request: never empty, '.', or a path the API would misread."""
    if not _NAME.rule(name):  # the rule --name gives a job
        raise CliError(
            f"NAME must be a job name (a DNS-1035 label: a-z, 0-9, '-', starting with a letter), got {shown(name)}",
            hint="see `colbert-k8s list`",
        )
    return name


def missing_modules(*names: str) -> list[str]:
    """The modules of ``names`` this environment cannot import: a command that runs the trainer here names them
    before it starts (the CLI installs without torch).

    >>> missing_modules("json", "no_such_module_here")
    ['no_such_module_here']
    """
    return [m for m in names if importlib.util.find_spec(m) is None]


@contextlib.contextmanager
def trainer_log_to_stderr() -> Iterator[None]:
    """The trainer's INFO lines on stderr, bare, while a command runs its code in this process."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("trainer")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
