"""``colbert-k8s runtime``'s options are the job option table's (declared once: help and rule), and the TrainJob
runtime workflow (check, fall back to the stock runtime, warn) answers from ``operator_cli/kube/runtime.py``."""

from __future__ import annotations

from typing import Any

import pytest

from operator_cli import constants as C
from operator_cli.cli import cli
from operator_cli.commands.base import cluster_of
from operator_cli.errors import CliError
from operator_cli.kube.runtime import RUNTIME_OPTIONS, RuntimeSpec, runtime_health, runtime_or_stock
from operator_cli.options import JOB_OPTIONS

SHARED = ("--image", "--nccl", "--shm-size", "--priority-class", "--termination-grace-period")
JOB = {o.flag: o for o in JOB_OPTIONS}


def _params(command: str) -> dict[str, Any]:
    group = cli.commands["runtime"].commands[command]
    return {p.opts[-1]: p for p in group.params}


@pytest.mark.parametrize("command", ["render", "install"])
def test_the_shared_options_are_the_job_options(command):
    params = _params(command)
    for flag in SHARED:
        assert flag in params and params[flag].help == JOB[flag].help, flag
    assert [o.flag for o in RUNTIME_OPTIONS if o.flag in JOB and o.flag != "--name"] == list(SHARED)
    assert all(o is JOB[o.flag] for o in RUNTIME_OPTIONS if o.flag in SHARED)  # the same objects, not copies


@pytest.mark.parametrize(
    "field,value,flag",
    [
        ("image", "not an image!", "--image"),
        ("shm_size", "8 gigs", "--shm-size"),
        ("nccl", "carrier-pigeon", "--nccl"),
        ("priority_class", "Not_DNS", "--priority-class"),
        ("termination_grace", -1, "--termination-grace-period"),
    ],
)
def test_runtime_spec_refuses_by_the_job_options_rule(field, value, flag):
    with pytest.raises(CliError) as e:
        RuntimeSpec(**{field: value})
    assert e.value.message.startswith(f"{flag} {JOB[flag].must}, got ")


class _Cluster:
    """The reads the runtime workflow makes, answered from a dict of runtimes by name."""

    custom = None

    def __init__(self, runtimes: dict[str, dict]):
        self.runtimes = runtimes

    def read(self, fn, verb, kind, name=None, namespace=""):
        assert (verb, kind, namespace) == ("get", C.V2_RUNTIME_KIND, None)
        return self.runtimes.get(name)


def _runtime(name: str) -> dict:
    return {"metadata": {"name": name, "labels": {C.V2_FRAMEWORK_LABEL: "torch"}}, "spec": {"mlPolicy": {}}}


def test_the_runtime_workflow_falls_back_to_the_stock_one_and_says_so():
    ours, stock = C.V2_SHIPPED_RUNTIME, C.V2_STOCK_RUNTIME
    assert runtime_or_stock(_Cluster({ours: _runtime(ours)}), ours) == (ours, None)
    name, warning = runtime_or_stock(_Cluster({stock: _runtime(stock)}), ours)
    assert name == stock and f"ClusterTrainingRuntime {ours} is not installed" in warning
    assert "runtime install" in warning
    assert runtime_health(_Cluster({ours: _runtime(ours)}))[0] == "OK"
    assert runtime_health(_Cluster({stock: _runtime(stock)}))[:1] == ("WARN",)
    status, line, _ = runtime_health(_Cluster({}))
    assert status == "FAIL" and f"ClusterTrainingRuntime {stock!r} does not exist" in line


def test_namespace_is_checked_by_the_job_options_rule():
    with pytest.raises(CliError) as e:
        cluster_of({"namespace": "Not_A_Label"})
    assert e.value.message == f"--namespace {JOB['--namespace'].must}, got 'Not_A_Label'"
