"""The job kinds as objects (operator_cli/kube/kinds) and the one table of job options (operator_cli/options.py).

Each kind's pieces must agree with its own template: what ``resize`` rebuilds of a live job is what ``render``
makes of the new shape, the pods ``local`` plans are the pods the spec names, and the nodes and GPUs read off
a job are the ones it was rendered with. Each option's rule is checked by JobSpec, whoever builds it.
"""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from operator_cli.cli import cli
from operator_cli.errors import CliError
from operator_cli.kube.kinds import API_CHOICES, KINDS, kind_of, plan_pods
from operator_cli.options import JOB_OPTIONS
from operator_cli.render import render
from operator_cli.spec import NCCL_PRESETS, JobSpec

CONFIG = "data: {train: {path: d.jsonl}}\n"
# (nodes, gpus) -> (nodes, gpus): grow, shrink to one pod, to CPU, and back to GPUs
RESHAPES = [((1, 1), (3, 1)), ((3, 2), (1, 2)), ((2, 4), (2, 0)), ((2, 0), (4, 8))]


def _spec(api: str, nodes: int, gpus: int, config: str = CONFIG, **extra) -> JobSpec:
    return JobSpec(name="job", config_text=config, api=api, nodes=nodes, gpus_per_node=gpus, pvc_size="10Gi", **extra)


@pytest.mark.parametrize("api", list(KINDS))
@pytest.mark.parametrize("old,new", RESHAPES, ids=[f"{a}to{b}" for a, b in RESHAPES])
def test_a_reshaped_job_is_what_render_makes_of_the_new_shape(api, old, new):
    before, after = _spec(api, *old), _spec(api, *new)
    job = render(before)[-1]
    kind = kind_of(job)
    assert kind is KINDS[api] and kind.nodes_and_gpus(job) == old
    reshaped = kind.reshaped(job, *new)
    assert reshaped == render(after)[-1]
    assert kind.nodes_and_gpus(reshaped) == new


@pytest.mark.parametrize("api", list(KINDS))
@pytest.mark.parametrize("nodes", [1, 3])
def test_the_pods_local_plans_are_the_pods_the_spec_names(api, nodes):
    spec = _spec(api, nodes, 1)
    plan = plan_pods(render(spec))
    assert plan.kind is spec.kind and plan.hosts == spec.pod_names == list(spec.names.pods)
    env = plan.launcher_env(nodes - 1, "master", 1234)
    assert env["PET_NODE_RANK"] == str(nodes - 1) and env["PET_NNODES"] == str(nodes)


def test_an_elastic_job_names_its_pods_as_its_kind_does():
    spec = _spec("pytorchjob", 2, 1, elastic=(1, 3), config=CONFIG + "training: {global_batch_size: 12}\n")
    assert spec.pod_names == ["job-worker-0", "job-worker-1", "job-worker-2"]
    with pytest.raises(CliError, match="a TrainJob .* has no elastic policy"):
        dataclasses.replace(spec, api="trainjob")


# a value that breaks each kind of rule: a name, a quantity, an image, a label value; a count out of range
BAD = {str: "Not A Name!", int: -1}


@pytest.mark.parametrize("option", [o for o in JOB_OPTIONS if o.rule], ids=lambda o: o.flag)
def test_every_option_rule_is_checked_by_jobspec(option):
    """The table's rule reaches JobSpec: a bad value is one line naming the option's flag."""
    good = JobSpec(name="job", config_text=CONFIG)  # one node, no claim: no other rule to trip first
    value = BAD[option.type]
    with pytest.raises(CliError) as refused:
        dataclasses.replace(good, **{option.spec_field: [value] if option.multiple else value})
    assert refused.value.message.startswith(option.flag + " "), refused.value.message


def test_every_option_is_a_flag_of_render_submit_and_local():
    """The click options are made from the same table, with JobSpec's defaults and the choices' sources."""
    for command in ("render", "submit", "local"):
        text = CliRunner().invoke(cli, [command, "--help"], terminal_width=200).output
        assert all(o.flag in text for o in JOB_OPTIONS), command
    text = CliRunner().invoke(cli, ["render", "--help"], terminal_width=200).output
    defaults = JobSpec.defaults()
    assert f"[default: {defaults['active_deadline']}]" in text and f"[default: {defaults['image']}]" in text
    assert f"[{'|'.join(NCCL_PRESETS)}]" in text and f"[{'|'.join(API_CHOICES)}]" in text
