"""Pure rendering: a :class:`JobSpec` in, Kubernetes objects (dicts) out.

``render(spec)`` is what ``render`` prints, what ``submit --dry-run`` prints and what ``submit``
creates (TorchX's dry-run contract); after creating them, ``submit`` PATCHes one thing the dry run
cannot know: an ownerReference from the ConfigMap to the job (the PVC is kept), which needs its uid.
Templates are Jinja files shipped in the package; every user value passes through the ``q`` filter
(a JSON string literal, which YAML reads back verbatim), so no value can add keys, documents or
template expressions.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import jinja2
import yaml

from operator_cli import constants
from operator_cli.jobshape import JobShape
from operator_cli.objects import KubeObject

__all__ = ["render", "render_one", "to_yaml"]


def _quote(value: Any) -> str:
    """A YAML double-quoted scalar. JSON escapes quotes, backslashes and C0 controls; anything else
    YAML would not keep verbatim (U+2028, NEL, BOM...) becomes a \\u/\\U escape. Astral characters
    stay literal: JSON's surrogate-pair escapes would come back from YAML as two broken halves."""
    text = json.dumps(str(value), ensure_ascii=False)
    return "".join(
        ch if ch.isprintable() else (f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}") for ch in text
    )


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(
            lambda name: resources.files("operator_cli").joinpath("templates", name).read_text()
        ),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters["q"] = _quote
    return env


_ENV = _environment()
_CONSTANTS = {k: v for k, v in vars(constants).items() if k.isupper()}


def render_one(template: str, spec: Any, **context: Any) -> KubeObject:
    """One template with ``spec`` as its context: a :class:`JobSpec`, or another typed spec whose fields the
    template reads (the fetch pod's, :class:`operator_cli.kube.fetch.FetchPod`); ``context``: more names
    (a job's ``kind`` and ``names``)."""
    text = _ENV.get_template(template).render(spec=spec, c=_CONSTANTS, **context)
    return yaml.safe_load(text)


def render(spec: JobShape) -> list[KubeObject]:
    """The objects of one job, in creation order: ConfigMap, [PVC], then the job in its kind's template.

    Every template gets ``kind`` (the :class:`JobKind`) and ``names`` (:class:`JobNames`: the ConfigMap's,
    the claim's and the pods' names, the ones ``delete``, ``resize`` and ``fetch`` look for)."""
    context = {"kind": spec.kind, "names": spec.names}
    objects = [render_one("configmap.yaml.j2", spec, **context)]
    if spec.pvc_size:
        objects.append(render_one("pvc.yaml.j2", spec, **context))
    objects.append(render_one(spec.kind.template, spec, **context))
    return objects


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the training config) as readable ``|`` blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value and not any(line != line.rstrip() for line in value.splitlines()) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(objects: list[KubeObject]) -> str:
    """The one serialisation used by ``render``, ``submit --dry-run`` and ``render -o DIR``."""
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)
