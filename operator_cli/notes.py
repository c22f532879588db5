"""What ``render`` and ``submit`` say about a job's storage before it runs, as ``warning:``/``note:`` lines on
stderr (the manifests on stdout stay exactly what is sent).

* A config's data path that is local (``data/train.jsonl``) resolves under ``/workspace``. A claim that
  ``--pvc-size`` creates starts empty, and so does an emptyDir: the pods would stop with "not found". The
  warning names both ways: ``colbert-k8s upload`` onto the claim (with ``submit --suspend`` first, so no pod
  reads before the data is there), or an ``s3://``/``https://`` source, which each pod stages itself.
* A claim ``--pvc-size`` creates without ``--storage-class`` gets the cluster's default StorageClass, often
  ReadWriteOnce only: a multi-node job's ReadWriteMany claim would then stay Pending.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from operator_cli.spec import JobSpec

__all__ = ["local_data_paths", "storage_notes"]


def local_data_paths(cfg) -> list[tuple[str, str]]:
    """(key, path) of every data location the config names on the job's volume: not a URL, not absolute
    outside /workspace (an image may carry those)."""
    found = [("data.train.path", cfg.data.train.path), ("data.eval_beir", cfg.data.eval_beir)]
    if cfg.mine is not None:
        found.append(("mine.corpus", cfg.mine.corpus))
    if cfg.index is not None:
        found.append(("index.corpus", cfg.index.corpus))
    return [(key, str(path)) for key, path in found if path and _on_volume(str(path))]


def _on_volume(path: str) -> bool:
    """Whether ``path`` resolves on the pod's workspace volume (relative, or under /workspace).

    >>> _on_volume("data/x.jsonl"), _on_volume("/workspace/x"), _on_volume("/data/x"), _on_volume("s3://b/x")
    (True, True, False, False)
    """
    return "://" not in path and (not path.startswith("/") or path.startswith("/workspace/"))


def storage_notes(spec: JobSpec, suspend: bool = False) -> list[str]:
    """The lines to print for ``spec`` (none for a job whose claim already exists: ``--pvc``)."""
    lines = []
    if spec.pvc_size and not spec.storage_class:
        mode = "ReadWriteMany" if spec.nodes > 1 else "ReadWriteOnce"
        lines.append(
            f"note: the new claim {spec.claim_name} asks the cluster's default StorageClass for {mode}; many "
            "default classes are ReadWriteOnce only (`colbert-k8s doctor` says which offer ReadWriteMany): "
            "pass --storage-class to choose"
        )
    if spec.pvc:
        return lines
    paths = local_data_paths(spec.train_config)
    if not paths:
        return lines
    named = ", ".join(f"{key} {path}" for key, path in paths)
    first = paths[0][1].removeprefix("/workspace/")
    if spec.pvc_size:
        then = "" if suspend else "submit with --suspend, then "
        lines.append(
            f"warning: {named} resolve(s) under /workspace, but the new claim {spec.claim_name} starts empty: "
            f"{then}`colbert-k8s upload {spec.name} {first}` (each path) and `colbert-k8s resume {spec.name}`; "
            "or name an s3://, gs://, az:// or https:// source in the config, which each pod stages itself"
        )
    else:
        lines.append(
            f"warning: {named} resolve(s) under /workspace, an emptyDir that starts empty in every pod: use "
            f"--pvc-size with --suspend and `colbert-k8s upload {spec.name} {first}`, an existing claim that "
            "holds the data (--pvc), or an s3://, gs://, az:// or https:// source in the config"
        )
    return lines
