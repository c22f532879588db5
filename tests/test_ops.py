"""Issue 32, operations: the shipped ClusterTrainingRuntime (render, install, chart, submit's fallback, doctor),
scheduling on shared clusters (Kueue topology, MIG slices) for both job kinds, and suspend/resume."""

from __future__ import annotations

import json

import helm_python
import pytest
import yaml
from click.testing import CliRunner

from operator_cli import constants as C
from operator_cli.cli import cli
from operator_cli.errors import CliError
from operator_cli.kube.kinds import plan_pods
from operator_cli.kube.runtime import RuntimeSpec, known_runtime, render_runtime, runtime_policy
from operator_cli.render import render
from operator_cli.spec import JobSpec
from tests.helpers.chart import CONFIG, helm_render, normalise
from tests.helpers.kube_emulator import Emulator
from tests.helpers.runtimes import TORCH_RUNTIME, stock_runtime
from tests.helpers.schemas import CRD_CHECKS, crd_available, validate_all, validate_runtime

TEXT = yaml.safe_dump(CONFIG)


def _spec(**kw) -> JobSpec:
    return JobSpec(name="job", config_text=TEXT, **kw)


# ---- the runtime ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "opts",
    [{}, {"nccl": "ib", "priority_class": "high", "max_restarts": 7}, {"shm_size": None, "name": "rt-cpu"}],
    ids=["defaults", "ib-priority", "no-shm"],
)
def test_runtime_render_is_crd_valid_with_the_fail_fast_rules(opts):
    rt = render_runtime(RuntimeSpec(**opts))
    before = CRD_CHECKS["ran"]
    validate_runtime(rt)
    assert CRD_CHECKS["ran"] == before + crd_available("trainer.kubeflow.org_clustertrainingruntimes.yaml")
    assert rt["metadata"]["labels"][C.V2_FRAMEWORK_LABEL] == "torch" and "torch" in rt["spec"]["mlPolicy"]
    assert rt["metadata"]["labels"][C.LABEL_MANAGED_BY] == "colbert-k8s"
    assert rt["metadata"]["labels"][C.LABEL_INSTANCE] == rt["metadata"]["name"]
    js = rt["spec"]["template"]["spec"]
    assert js["failurePolicy"]["maxRestarts"] == opts.get("max_restarts", 3)
    first, second = js["failurePolicy"]["rules"]
    assert first["action"] == "FailJobSet" and first["onJobFailureReasons"] == ["PodFailurePolicy"]
    assert second["action"] == "RestartJobSet" and "onJobFailureReasons" not in second
    (node,) = js["replicatedJobs"]
    job = node["template"]["spec"]
    assert node["name"] == "node" and job["backoffLimit"] == 0
    assert job["podFailurePolicy"]["rules"] == [
        {"action": "FailJob", "onExitCodes": {"containerName": "node", "operator": "In", "values": list(range(1, 128))}}
    ]
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["securityContext"]["runAsNonRoot"] is True
    assert pod.get("priorityClassName") == opts.get("priority_class")
    (container,) = pod["containers"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    assert (env.get("NCCL_IB_DISABLE") == "0") == (opts.get("nccl") == "ib")
    mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
    assert mounts == ([] if "shm_size" in opts else ["/dev/shm"])
    # the policy local replays is read back from this very object
    policy = runtime_policy(rt)
    assert policy.is_permanent(1) and policy.is_permanent(2) and policy.is_permanent(127)
    assert not policy.is_permanent(128) and not policy.is_permanent(129) and not policy.is_permanent(-9)
    assert policy.restarts == opts.get("max_restarts", 3) and policy.recreates_pods


def test_the_stock_runtime_has_no_permanent_code():
    policy = runtime_policy(stock_runtime())
    assert not policy.is_permanent(2) and policy.restarts == 3 and not policy.recreates_pods


def test_runtime_command_prints_it_and_refuses_bad_flags():
    res = CliRunner().invoke(cli, ["runtime", "render", "--name", "colbert-ib", "--nccl", "ib", "--max-restarts", "5"])
    assert res.exit_code == 0, res.output
    rt = yaml.safe_load(res.output)
    assert rt == render_runtime(RuntimeSpec(name="colbert-ib", nccl="ib", max_restarts=5))
    for bad, words in (
        (["--name", "Bad_Name"], "--name must be a DNS-1123 name"),
        (["--max-restarts", "-1"], "--max-restarts must be between 0 and 1000"),
    ):
        res = CliRunner().invoke(cli, ["runtime", "render", *bad])
        assert res.exit_code == 2 and words in res.output and "Traceback" not in res.output, res.output


def test_chart_installs_the_same_runtime_as_the_cli():
    values = {
        "api": "trainjob",
        "runtime": {"name": "colbert-torch", "install": True, "maxRestarts": 5},
        "nccl": "socket",
        "shm": {"enabled": True, "size": "16Gi"},
        "terminationGracePeriodSeconds": 300,
    }
    objects = helm_render(values)
    (rt,) = [o for o in objects if o["kind"] == "ClusterTrainingRuntime"]
    validate_all(objects)
    cli_rt = render_runtime(
        RuntimeSpec(
            max_restarts=5,
            nccl="socket",
            shm_size="16Gi",
            termination_grace=300,
            image=objects[-1]["spec"]["trainer"]["image"],
        )
    )
    for meta in (
        rt["metadata"],
        rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"],
    ):
        assert meta["labels"].pop("helm.sh/chart")
    assert rt == cli_rt
    assert objects[-1]["spec"]["runtimeRef"]["name"] == "colbert-torch"
    assert not [o for o in helm_render({"api": "trainjob"}) if o["kind"] == "ClusterTrainingRuntime"]


# ---- scheduling: each option, both kinds, CRD-valid, CLI == chart --------------------------------------

SCHEDULING = {
    "topology-required": (
        dict(topology_required="cloud.google.com/gce-topology-block", nodes=2, pvc="ckpt"),
        dict(
            scheduling={"topologyRequired": "cloud.google.com/gce-topology-block"},
            nodes=2,
            persistence={"existingClaim": "ckpt"},
        ),
        {C.KUEUE_TOPOLOGY_REQUIRED: "cloud.google.com/gce-topology-block"},
    ),
    "topology-preferred": (
        dict(topology_preferred="kubernetes.io/hostname", queue="team-a"),
        dict(scheduling={"topologyPreferred": "kubernetes.io/hostname", "queue": "team-a"}),
        {C.KUEUE_TOPOLOGY_PREFERRED: "kubernetes.io/hostname"},
    ),
    "mig": (
        dict(mig="1g.10gb", nodes=3, pvc_size="5Gi"),
        dict(mig="1g.10gb", nodes=3, persistence={"size": "5Gi"}),
        {},
    ),
}


def _pod_templates(job: dict) -> list[dict]:
    if job["kind"] == "PyTorchJob":
        return [r["template"] for r in job["spec"]["pytorchReplicaSpecs"].values()]
    patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    return [patch["template"]["spec"]["template"]]


def _limits(job: dict) -> list[dict]:
    if job["kind"] == "PyTorchJob":
        return [t["spec"]["containers"][0]["resources"]["limits"] for t in _pod_templates(job)]
    return [job["spec"]["trainer"]["resourcesPerNode"]["limits"]]


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize("case", SCHEDULING, ids=SCHEDULING)
def test_scheduling_options_are_crd_valid_and_chart_equals_cli(api, case):
    cli_opts, values, annotations = SCHEDULING[case]
    from_cli = render(_spec(api=api, **cli_opts))
    validate_all(from_cli)
    job = from_cli[-1]
    for template in _pod_templates(job):
        assert {k: v for k, v in template["metadata"]["annotations"].items() if k.startswith("kueue")} == annotations
    for limits in _limits(job):
        if "mig" in cli_opts:
            assert limits == {"nvidia.com/mig-1g.10gb": 1}
        else:
            assert limits == {"nvidia.com/gpu": 1}
    from_helm = helm_render({**values, "api": api})
    validate_all(from_helm)
    assert normalise(from_helm) == normalise(from_cli)


@pytest.mark.parametrize(
    "opts,values,words",
    [
        (
            dict(topology_required="a/b", topology_preferred="a/b"),
            {"scheduling": {"topologyRequired": "a/b", "topologyPreferred": "a/b"}},
            "exclude each other",
        ),
        (dict(topology_required="not a label"), {"scheduling": {"topologyRequired": "not a label"}}, "topology"),
        (dict(mig="10gb"), {"mig": "10gb"}, "mig"),
        (dict(mig="1g.10gb", gpus_per_node=2), {"mig": "1g.10gb", "gpusPerNode": 2}, "one slice per pod"),
        (dict(mig="1g.10gb", gpus_per_node=0), {"mig": "1g.10gb", "gpusPerNode": 0}, "one slice per pod"),
    ],
    ids=["both-topologies", "bad-level", "bad-profile", "two-slices", "cpu-with-mig"],
)
def test_bad_scheduling_is_one_line_in_the_cli_and_refused_by_the_chart(opts, values, words):
    with pytest.raises(CliError) as e:
        _spec(**opts)
    assert words in e.value.message.lower() or words in e.value.message
    with pytest.raises(helm_python.HelmError) as e:
        helm_render(values)
    assert words in str(e.value).lower() or words in str(e.value)


def test_a_topology_annotation_given_twice_is_refused():
    with pytest.raises(CliError) as e:
        _spec(topology_required="a/b", annotations={C.KUEUE_TOPOLOGY_REQUIRED: "c/d"})
    assert "also set by --topology-*" in e.value.message


# ---- the cluster side: install, submit's choice, suspend/resume, doctor -----------------------------------


def run(emu, *args):
    return CliRunner().invoke(cli, [*args, "--kubeconfig", str(emu.kubeconfig)], catch_exceptions=False)


def _with_runtime_store(emu):
    """ClusterTrainingRuntimes as a cluster-scoped resource the emulator stores (create, get, replace)."""
    import kmock

    emu.emu.resources[f"{C.V2_GROUP}/{C.V2_VERSION}/{C.V2_RUNTIME_PLURAL}"] = kmock.ResourceInfo(
        kind=C.V2_RUNTIME_KIND, namespaced=False
    )


def test_runtime_install_creates_then_updates_only_its_own(tmp_path):
    with Emulator(tmp_path, with_v2=True) as emu:
        _with_runtime_store(emu)
        res = run(emu, "runtime", "install")
        assert res.exit_code == 0 and "created ClusterTrainingRuntime colbert-torch" in res.output, res.output
        (stored,) = emu.objects(C.V2_RUNTIME_PLURAL)
        assert stored["spec"] == render_runtime(RuntimeSpec())["spec"]
        res = run(emu, "runtime", "install", "--max-restarts", "6")
        assert res.exit_code == 0 and "updated ClusterTrainingRuntime colbert-torch" in res.output, res.output
        (stored,) = emu.objects(C.V2_RUNTIME_PLURAL)
        assert stored["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 6
        emu.add(f"{C.V2_GROUP}/{C.V2_VERSION}/{C.V2_RUNTIME_PLURAL}", None, stock_runtime())
        res = run(emu, "runtime", "install", "--name", C.V2_STOCK_RUNTIME)
        assert res.exit_code == 1 and "was not created by colbert-k8s" in res.output, res.output
        stock = [o for o in emu.objects(C.V2_RUNTIME_PLURAL) if o["metadata"]["name"] == C.V2_STOCK_RUNTIME]
        assert stock == [stock_runtime()]


def _config(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("data:\n  train: {path: data/train.jsonl}\n")
    return str(path)


@pytest.mark.parametrize("installed", [True, False], ids=["runtime-installed", "stock-only"])
def test_submit_trainjob_uses_the_runtime_when_it_exists(tmp_path, installed):
    runtimes = (stock_runtime(),) + ((render_runtime(RuntimeSpec()),) if installed else ())
    with Emulator(tmp_path, with_v2=True, runtimes=runtimes) as emu:
        res = run(
            emu, "submit", "--config", _config(tmp_path), "--name", "demo", "--gpus-per-node", "0", "--api", "trainjob"
        )
        assert res.exit_code == 0, res.output
        (job,) = emu.objects("trainjobs")
        assert job["spec"]["runtimeRef"]["name"] == (C.V2_SHIPPED_RUNTIME if installed else C.V2_STOCK_RUNTIME)
        warned = [
            line for line in res.output.splitlines() if line.startswith("warning:") and "ClusterTrainingRuntime" in line
        ]
        assert len(warned) == (0 if installed else 1)
        if warned:
            assert "retries a permanent error" in warned[0] and "colbert-k8s runtime install" in warned[0]
        res = run(
            emu,
            "submit",
            "--config",
            _config(tmp_path),
            "--name",
            "other",
            "--gpus-per-node",
            "0",
            "--api",
            "trainjob",
            "--runtime",
            C.V2_SHIPPED_RUNTIME,
        )
        assert (res.exit_code == 0) == installed, res.output  # an explicit --runtime is never swapped


def _job(kind: str, name: str, ours: bool = True) -> dict:
    labels = {C.LABEL_MANAGED_BY: C.MANAGED_BY, C.LABEL_INSTANCE: name} if ours else {"app": "other"}
    spec = {"runPolicy": {"backoffLimit": 1}, "pytorchReplicaSpecs": {}} if kind == "PyTorchJob" else {"trainer": {}}
    group = f"{C.GROUP}/{C.VERSION}" if kind == "PyTorchJob" else f"{C.V2_GROUP}/{C.V2_VERSION}"
    return {
        "apiVersion": group,
        "kind": kind,
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": spec,
    }


@pytest.mark.parametrize("kind", ["PyTorchJob", "TrainJob"])
def test_suspend_and_resume_patch_only_this_tools_jobs(tmp_path, kind):
    plural = "pytorchjobs" if kind == "PyTorchJob" else "trainjobs"
    resource = f"{C.GROUP}/{C.VERSION}/{plural}" if kind == "PyTorchJob" else f"{C.V2_GROUP}/{C.V2_VERSION}/{plural}"
    field = (
        (lambda j: j["spec"].get("runPolicy", {}).get("suspend"))
        if kind == "PyTorchJob"
        else (lambda j: j["spec"].get("suspend"))
    )
    with Emulator(tmp_path, with_crd=True, with_v2=True) as emu:
        emu.add(resource, "default", _job(kind, "mine"))
        emu.add(resource, "default", _job(kind, "theirs", ours=False))
        res = run(emu, "suspend", "mine")
        assert res.exit_code == 0 and f"suspended {kind} mine" in res.output, res.output
        job = next(j for j in emu.objects(plural) if j["metadata"]["name"] == "mine")
        assert field(job) is True
        if kind == "PyTorchJob":
            assert job["spec"]["runPolicy"]["backoffLimit"] == 1  # a merge patch: the rest is kept
        assert "already suspended" in run(emu, "suspend", "mine").output
        res = run(emu, "resume", "mine")
        assert res.exit_code == 0 and f"resumed {kind} mine" in res.output, res.output
        assert field(next(j for j in emu.objects(plural) if j["metadata"]["name"] == "mine")) is False
        res = run(emu, "suspend", "theirs")
        assert res.exit_code == 1 and "was not created by colbert-k8s" in res.output
        assert field(next(j for j in emu.objects(plural) if j["metadata"]["name"] == "theirs")) is None
        res = run(emu, "suspend", "..")
        assert res.exit_code == 2 and "NAME must be a job name" in res.output


def test_doctor_reports_the_runtime_topologies_flavors_and_mig(tmp_path):
    from tests.helpers.doctor import check_rows, doctor, healthy_cluster

    mig_node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "a100-mig"},
        "status": {"allocatable": {"nvidia.com/mig-1g.10gb": "7", "cpu": "64"}},
    }
    with healthy_cluster(tmp_path, runtimes=(TORCH_RUNTIME,)) as emu:
        rows = check_rows(doctor(emu, "-o", "json"))
        assert (
            rows["torch runtime"][0] == "WARN" and "no ClusterTrainingRuntime colbert-torch" in rows["torch runtime"][1]
        )
        assert rows["Kueue topologies"] == ("OK", "Kueue is not installed (--topology-* not usable)")
        assert rows["MIG slices"][0] == "OK" and "--mig not usable" in rows["MIG slices"][1]
    with healthy_cluster(tmp_path, runtimes=(TORCH_RUNTIME, render_runtime(RuntimeSpec())), nodes=(mig_node,)) as emu:
        kueue = f"/apis/{C.KUEUE_GROUP}/{C.KUEUE_VERSION}"
        emu.react(f"get {kueue}/topologies") << {
            "items": [
                {
                    "metadata": {"name": "default"},
                    "spec": {
                        "levels": [
                            {"nodeLabel": "cloud.google.com/gce-topology-block"},
                            {"nodeLabel": "kubernetes.io/hostname"},
                        ]
                    },
                }
            ]
        }
        emu.react(f"get {kueue}/resourceflavors") << {
            "items": [
                {"metadata": {"name": "h100"}, "spec": {"topologyName": "default"}},
                {"metadata": {"name": "cpu"}},
            ]
        }
        rows = check_rows(doctor(emu, "-o", "json"))
        assert rows["torch runtime"][0] == "OK" and "fails a TrainJob at once" in rows["torch runtime"][1]
        assert rows["Kueue topologies"] == (
            "OK",
            "Topology default: cloud.google.com/gce-topology-block > "
            "kubernetes.io/hostname; ResourceFlavor(s) cpu, h100 (topology: "
            "h100 -> default)",
        )
        assert rows["MIG slices"] == ("OK", "7 x 1g.10gb: pass --mig PROFILE")


def test_local_knows_the_shipped_and_the_stock_runtime():
    objects = render(_spec(api="trainjob")) + [known_runtime(C.V2_SHIPPED_RUNTIME)]
    plan = plan_pods(objects)
    assert plan.failure.is_permanent(2) and plan.failure.restarts == 3 and "replayed" in plan.runtime_note
    stock = plan_pods(render(_spec(api="trainjob", runtime=C.V2_STOCK_RUNTIME)) + [known_runtime(C.V2_STOCK_RUNTIME)])
    assert not stock.failure.is_permanent(2) and "no failure policy" in stock.runtime_note
    other = plan_pods(render(_spec(api="trainjob", runtime="site-torch")))
    assert not other.failure.is_permanent(2) and "not known here" in other.runtime_note
    assert known_runtime("site-torch") is None
    assert json.dumps(known_runtime(C.V2_SHIPPED_RUNTIME)) == json.dumps(render_runtime(RuntimeSpec()))
