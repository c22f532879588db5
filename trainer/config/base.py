"""What the config schema is built of: strict sections, and the two kinds of URL a config may name.

A source (``Location``: a model, data, an evaluation set, a corpus) is a local path or a URL that
``trainer/storage/sources.py`` stages; an export destination (:func:`parse_destination`) is an object-store prefix
or a Hub model repository that ``trainer/storage/export.py`` uploads to. Both are checked here, by the schema, so
that ``colbert-k8s render`` refuses a bad one too, instead of the pod failing at start. Standard library
and pydantic only: the CLI validates configs without torch.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict

from trainer.destinations import DESTINATIONS, FILE_SCHEMES

__all__ = [
    "DESTINATION_FORMS",
    "DESTINATION_PATTERN",
    "OBJECT_SCHEMES",
    "Destination",
    "HubRepo",
    "Location",
    "Strict",
    "hub_repo",
    "parse_destination",
]

# Where a source may live besides a local path: staged by trainer/storage/sources.py (hf:// goes to the hub's client)
OBJECT_SCHEMES = ("s3", "gs", "az", "abfs", "http", "https")


@dataclass(frozen=True)
class HubRepo:
    """The Hugging Face Hub repository an ``hf://`` URL names, as ``huggingface_hub`` takes it."""

    kind: str  # "model", "dataset" or "space"
    repo_id: str  # ORG/NAME ("" when the URL names none)


_HUB_KINDS = {"datasets": "dataset", "spaces": "space"}


def hub_repo(url: str) -> HubRepo | None:
    """The repository an ``hf://`` URL names: ``hf://ORG/NAME`` a model, ``hf://datasets/ORG/NAME`` a dataset,
    ``hf://spaces/ORG/NAME`` a Space; None for anything else. Empty parts and slashes around are dropped.

    >>> hub_repo("hf://datasets/BeIR/nfcorpus")
    HubRepo(kind='dataset', repo_id='BeIR/nfcorpus')
    >>> hub_repo("hf://my-org/colbert-nfcorpus/")
    HubRepo(kind='model', repo_id='my-org/colbert-nfcorpus')
    >>> hub_repo("hf://"), hub_repo("s3://bucket/model/"), hub_repo("my-org/colbert")
    (HubRepo(kind='model', repo_id=''), None, None)
    """
    if not url.startswith("hf://"):
        return None
    names = [p for p in url.removeprefix("hf://").split("/") if p]
    kind = _HUB_KINDS.get(names[0], "model") if names else "model"
    return HubRepo(kind, "/".join(names[1:] if kind != "model" else names))


def _location(value: str) -> str:
    """A local path, or a URL trainer/storage/sources.py can stage: checked here, so that ``render`` refuses it
    too, instead of the pod failing at start."""
    if "://" not in value:
        return value
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (parses the port: "host:http" raises here)
    except ValueError as e:
        raise ValueError(f"is not a valid URL ({e})") from None
    if parts.query or parts.fragment:  # a signed URL's signature is refused before this, as a credential
        raise ValueError(
            "has a query string or fragment, which the stager cannot use (it fetches the path alone, so a "
            "signed URL does not work); give the URL without it, and the store's credentials with --secret-env"
        )
    if (repo := hub_repo(value)) is not None:
        if not repo.repo_id:
            raise ValueError("hf:// names no repository; give hf://ORG/NAME (models) or hf://datasets/ORG/NAME")
        return value
    if parts.scheme not in OBJECT_SCHEMES:
        raise ValueError(
            f"{parts.scheme}:// is not a source this trainer can fetch; use a local path, "
            f"{', '.join(s + '://' for s in OBJECT_SCHEMES)} or hf://"
        )
    host = parts.hostname or ""
    if not host:
        raise ValueError(f"{parts.scheme}:// names no {'host' if parts.scheme.startswith('http') else 'bucket'}")
    if re.fullmatch(r"[0-9.]+", host):  # all digits and dots: URL parsers read it as an IPv4 address
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"host {host} is not an IPv4 address") from None
    return value


Location = Annotated[str, AfterValidator(_location)]


class Strict(BaseModel):
    """Unknown keys are refused: a typo must not silently fall back to a default."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


# export.destination's schemes, from the destinations' registry (trainer/destinations/__init__.py)
_STORE_SCHEMES = tuple(k for k in FILE_SCHEMES if not DESTINATIONS[k].hub)  # BUCKET/PREFIX/
_HUB_SCHEMES = tuple(k for k in FILE_SCHEMES if DESTINATIONS[k].hub)  # ORG/NAME
_HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


def _either(schemes: tuple[str, ...]) -> str:
    return schemes[0] if len(schemes) == 1 else f"({'|'.join(schemes)})"


DESTINATION_PATTERN = (
    rf"^({_either(_STORE_SCHEMES)}://[^/@?#\s]+(/[^@?#\s]*)?|"
    rf"{_either(_HUB_SCHEMES)}://[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*/?)$"
)
"""``export.destination`` as the chart's schema checks it (:func:`parse_destination` checks more)."""
DESTINATION_FORMS = (
    f"{_STORE_SCHEMES[0]}://BUCKET/PREFIX/"
    + (f" ({', '.join(f'{k}://' for k in _STORE_SCHEMES[1:])} alike)" if _STORE_SCHEMES[1:] else "")
    + "".join(f" or {k}://ORG/NAME (a Hub model repository)" for k in _HUB_SCHEMES)
)
"""``export.destination``'s forms, for its description: every scheme of the registry, none hand-listed."""
_USE = ", ".join([f"{_STORE_SCHEMES[0]}://BUCKET/PREFIX/", *(f"{k}://..." for k in _STORE_SCHEMES[1:])]) + "".join(
    f" or {k}://ORG/NAME" for k in _HUB_SCHEMES
)  # the schemes, as the refusal of another lists them


@dataclass(frozen=True)
class Destination:
    """Where the export goes: ``scheme`` s3/gs/az (``bucket``, ``prefix``) or hf (``bucket`` is the repo id)."""

    scheme: str
    bucket: str
    prefix: str = ""

    @property
    def hub(self) -> bool:
        return DESTINATIONS[self.scheme].hub

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}" if self.hub else f"{self.scheme}://{self.bucket}/{self.prefix}"


def parse_destination(value: str) -> Destination:
    """``export.destination`` checked and split; a ValueError says what is wrong (the config's validator).

    >>> parse_destination("s3://models/colbert/run-1")
    Destination(scheme='s3', bucket='models', prefix='colbert/run-1/')
    >>> str(parse_destination("hf://my-org/colbert-nfcorpus"))
    'hf://my-org/colbert-nfcorpus'
    >>> parse_destination("https://example.com/m")
    Traceback (most recent call last):
    ...
    ValueError: https:// is not an export destination; use s3://BUCKET/PREFIX/, gs://..., az://... or hf://ORG/NAME
    """
    try:
        parts = urlsplit(value)
    except ValueError as e:
        raise ValueError(f"is not a valid URL ({e})") from None
    if parts.username or parts.password or "@" in parts.netloc:
        raise ValueError("holds credentials; pass them as environment variables from a Secret (--secret-env)")
    base = DESTINATIONS.get(parts.scheme.split("+")[0])
    if base is not None and base.kind == "vectors":
        raise ValueError(
            f"{parts.scheme}:// is a vector database: it takes the corpus the model encodes "
            f"(vectordb.destination), not the model; use {_USE}"
        )
    if parts.query or parts.fragment:
        raise ValueError("has a query or fragment; give s3://BUCKET/PREFIX/ or hf://ORG/NAME alone")
    if parts.scheme in _HUB_SCHEMES:
        repo = hub_repo(value)
        if repo is None or repo.kind != "model":
            raise ValueError("names a dataset or Space; a model is exported to a model repository, hf://ORG/NAME")
        names = repo.repo_id.split("/")
        if (
            len(names) != 2
            or not all(_HUB_NAME.fullmatch(n) for n in names)
            or any(".." in n or "--" in n for n in names)
        ):
            raise ValueError("must name a Hub model repository as hf://ORG/NAME (letters, digits, '-', '_', '.')")
        return Destination(parts.scheme, repo.repo_id)
    if parts.scheme not in _STORE_SCHEMES:
        raise ValueError(
            f"{parts.scheme + '://' if parts.scheme else 'a path'} is not an export destination; use {_USE}"
        )
    if not parts.netloc:
        raise ValueError(f"{parts.scheme}:// names no bucket")
    prefix = parts.path.strip("/")
    if any(p in (".", "..") for p in prefix.split("/")):
        raise ValueError("the prefix holds '.' or '..'; give a plain PREFIX")
    return Destination(parts.scheme, parts.netloc, prefix + "/" if prefix else "")
