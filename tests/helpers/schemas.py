"""Validate rendered objects the way the API server would, with what a pip install provides.

Three layers, strongest available first:

* **typed models** (always): the Kubeflow Training SDK's generated PyTorchJob models (1.9.4, the
  operator version targeted), walked strictly: an unknown field, a wrong type or a missing
  required field fails. Nested Kubernetes types are the official client's models. TrainJobs go
  through ``kubeflow-trainer-api`` 2.3.0's pydantic models, and must survive a round trip
  unchanged (the models drop unknown fields, so a dropped field is an unknown one).
* **core objects** (always): ``kubernetes-validate``'s bundled OpenAPI schemas; a pod template
  inside a custom resource is wrapped in a core ``PodTemplate``.
* **the official CRD** (additionally, when ``../shared/crds`` sits beside the checkout): the
  CRD's ``openAPIV3Schema`` with strict field validation. A user's clone has no such folder, so
  nothing *depends* on it; :data:`CRD_CHECKS` records whether it ran.
"""

from __future__ import annotations

import copy
import datetime
import functools
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes.client.models as k8s_models
import kubernetes_validate
import yaml

from tests.helpers import SHARED

K8S_VERSION = "1.32.0"
CRD_DIR = SHARED / "crds"
CRD_CHECKS = {"ran": 0}  # counted, so a run can say whether the extra layer was exercised


# ---- typed models --------------------------------------------------------------------------------


class TypedModelError(AssertionError):
    pass


def _model_class(name: str):
    import kubeflow.training.models as kf_models

    return getattr(kf_models, name, None) or getattr(k8s_models, name, None)


_PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object}


def check_typed(data: Any, type_name: str, path: str = "") -> None:
    """Walk ``data`` against an OpenAPI-generated model type, refusing unknown and missing fields."""
    if data is None:
        return
    if m := re.fullmatch(r"(?:list|List)\[(.+)\]", type_name):
        if not isinstance(data, list):
            raise TypedModelError(f"{path}: expected a list, got {type(data).__name__}")
        for i, item in enumerate(data):
            check_typed(item, m.group(1), f"{path}[{i}]")
        return
    if m := re.fullmatch(r"(?:dict\(str, (.+)\)|Dict\[str, (.+)\])", type_name):
        if not isinstance(data, dict):
            raise TypedModelError(f"{path}: expected a mapping, got {type(data).__name__}")
        for k, v in data.items():
            check_typed(v, m.group(1) or m.group(2), f"{path}.{k}")
        return
    if type_name == "str" and re.search(r"\.(limits|requests)\.", path) and isinstance(data, (int, float)):
        return  # a resource.Quantity: the models type it str, the API server takes a number too
    if type_name in _PRIMITIVES:
        ok = isinstance(data, _PRIMITIVES[type_name]) and not (type_name == "int" and isinstance(data, bool))
        if not ok:
            raise TypedModelError(f"{path}: expected {type_name}, got {data!r}")
        return
    if type_name == "datetime":
        if not isinstance(data, (str, datetime.datetime)):
            raise TypedModelError(f"{path}: expected a timestamp, got {data!r}")
        return
    cls = _model_class(type_name)
    if cls is None:
        raise TypedModelError(f"{path}: no model named {type_name}")
    if not isinstance(data, dict):
        raise TypedModelError(f"{path}: expected a {type_name} mapping, got {type(data).__name__}")
    by_json = {json_key: attr for attr, json_key in cls.attribute_map.items()}
    unknown = set(data) - set(by_json)
    if unknown:
        raise TypedModelError(f"{path}: unknown field(s) {sorted(unknown)} for {type_name}")
    for json_key, value in data.items():
        attr = by_json[json_key]
        check_typed(value, cls.openapi_types[attr], f"{path}.{json_key}" if path else json_key)
    if not cls.__module__.startswith("kubeflow."):
        return  # core types: kubernetes-validate checks their required fields (validate_core)
    try:  # the generated constructor refuses a missing required field and a value outside an enum
        cls(**{by_json[k]: v for k, v in data.items()})
    except ValueError as e:
        raise TypedModelError(f"{path or type_name}: {e}") from None


# ---- the official CRD, when it is beside the checkout ------------------------------------------------


def _structural(node: Any) -> Any:
    """Map the API server's OpenAPI extensions onto plain JSON schema (Draft 4)."""
    if isinstance(node, list):
        return [_structural(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: _structural(v) for k, v in node.items()}
    if node.pop("x-kubernetes-int-or-string", False):
        node.pop("type", None)
        node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.pop("nullable", False) and "type" in node:
        node["type"] = [node["type"], "null"]
    preserve = node.pop("x-kubernetes-preserve-unknown-fields", False)
    if "properties" in node and not preserve and "additionalProperties" not in node:
        node["additionalProperties"] = False  # strict field validation
    return node


def crd_available(filename: str) -> bool:
    return (CRD_DIR / filename).is_file()


@functools.cache
def crd_validator(filename: str) -> jsonschema.Draft4Validator:
    crd = yaml.safe_load(Path(CRD_DIR / filename).read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return jsonschema.Draft4Validator(_structural(copy.deepcopy(schema)))


def check_crd(obj: dict, filename: str) -> None:
    if not crd_available(filename):
        return
    errors = sorted(crd_validator(filename).iter_errors(obj), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        raise AssertionError(f"{'/'.join(map(str, e.path))}: {e.message}")
    CRD_CHECKS["ran"] += 1


# ---- entry points ------------------------------------------------------------------------------------


def validate_pytorchjob(obj: dict) -> None:
    check_typed(obj, "KubeflowOrgV1PyTorchJob")
    check_crd(obj, "kubeflow.org_pytorchjobs.yaml")
    for rtype, replica in obj["spec"]["pytorchReplicaSpecs"].items():
        pod_template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": f"{obj['metadata']['name']}-{rtype.lower()}"},
            "template": replica["template"],
        }
        validate_core(pod_template)


def _first_difference(a: Any, b: Any, path: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a.keys() | b.keys():
            if k not in b:
                return f"{path}.{k}: unknown field" if path else f"{k}: unknown field"
            if k not in a:
                continue  # a default the model adds
            if diff := _first_difference(a[k], b[k], f"{path}.{k}" if path else k):
                return diff
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: list length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            if diff := _first_difference(x, y, f"{path}[{i}]"):
                return diff
        return None
    return None if a == b else f"{path}: {a!r} became {b!r}"


def validate_trainjob(obj: dict) -> None:
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

    try:
        model = TrainerV1alpha1TrainJob.from_dict(obj)
    except Exception as e:  # pydantic's ValidationError names the field
        raise TypedModelError(f"TrainJob: {str(e).splitlines()[0:3]}") from None
    if diff := _first_difference(obj, model.to_dict()):
        raise TypedModelError(f"TrainJob {diff}")
    check_crd(obj, "trainer.kubeflow.org_trainjobs.yaml")


def validate_runtime(obj: dict) -> None:
    """A ClusterTrainingRuntime: Trainer v2.3.0's models (round trip), its CRD, and the node Job and pod
    template against the core schemas (a Job with a podFailurePolicy needs restartPolicy Never, which the
    API server checks and these schemas do not: checked here)."""
    from kubeflow_trainer_api.models import TrainerV1alpha1ClusterTrainingRuntime

    try:
        model = TrainerV1alpha1ClusterTrainingRuntime.from_dict(obj)
    except Exception as e:
        raise TypedModelError(f"ClusterTrainingRuntime: {str(e).splitlines()[0:3]}") from None
    if diff := _first_difference(obj, model.to_dict()):
        raise TypedModelError(f"ClusterTrainingRuntime {diff}")
    check_crd(obj, "trainer.kubeflow.org_clustertrainingruntimes.yaml")
    for job in obj["spec"]["template"]["spec"]["replicatedJobs"]:
        spec = job["template"]["spec"]
        validate_core({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": job["name"]}, "spec": spec})
        if spec.get("podFailurePolicy"):
            policy = spec["template"]["spec"].get("restartPolicy")
            assert policy == "Never", f"{job['name']}: a podFailurePolicy needs restartPolicy Never, got {policy}"
            for rule in spec["podFailurePolicy"]["rules"]:
                _check_exit_codes(job["name"], rule.get("onExitCodes"))


def _check_exit_codes(job: str, codes: dict | None) -> None:
    """What the API server checks of ``onExitCodes`` (batch/v1 validation) and the schemas do not: 1 to 255
    values, ordered, no duplicates, no 0 under ``In``."""
    if codes is None:
        return
    values = codes["values"]
    assert 1 <= len(values) <= 255, f"{job}: onExitCodes takes 1 to 255 values, got {len(values)}"
    assert values == sorted(set(values)), f"{job}: onExitCodes values must be ordered, without duplicates"
    assert not (codes["operator"] == "In" and 0 in values), f"{job}: onExitCodes In cannot hold 0"


def validate_core(obj: dict) -> None:
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        raise AssertionError(f"{obj['kind']}: {e.message}") from e


def validate_all(objects: list[dict]) -> None:
    for obj in objects:
        if obj["kind"] == "PyTorchJob":
            validate_pytorchjob(obj)
        elif obj["kind"] == "TrainJob":
            validate_trainjob(obj)
        elif obj["kind"] == "ClusterTrainingRuntime":
            validate_runtime(obj)
        elif obj["kind"] == "Experiment":
            validate_experiment(obj)
        elif obj["kind"] == "OptimizationJob":
            validate_optimizationjob(obj)
        else:
            validate_core(obj)


# ---- sweeps (colbert-k8s tune) --------------------------------------------------------------------------

_KATIB_TYPES = {"double": ("min", "max"), "int": ("min", "max"), "discrete": ("list",), "categorical": ("list",)}


def _katib_webhook(spec: dict) -> None:
    """What Katib's validating webhook checks and its CRD (preserve-unknown-fields) does not: objective, counts,
    parameter types and their feasible spaces, the File collector, and that the trial template uses exactly the
    trial parameters it declares (katib pkg/webhook/v1beta1/experiment/validator)."""
    objective = spec["objective"]
    assert objective["type"] in ("maximize", "minimize"), objective
    assert objective["objectiveMetricName"] not in objective.get("additionalMetricNames", []), objective
    assert spec["algorithm"]["algorithmName"] in ("random", "grid", "bayesianoptimization", "tpe", "cmaes")
    assert 0 < spec["parallelTrialCount"] <= spec["maxTrialCount"] and spec["maxFailedTrialCount"] >= 0
    for p in spec["parameters"]:
        space = p["feasibleSpace"]
        assert set(space) - {"distribution"} == set(_KATIB_TYPES[p["parameterType"]]), p
        assert space.get("distribution", "uniform") in ("uniform", "logUniform", "normal", "logNormal"), p
        for bound in ("min", "max"):
            if bound in space:
                float(space[bound])  # Katib parses them with strconv.ParseFloat
    collector = spec["metricsCollectorSpec"]
    path = collector["source"]["fileSystemPath"]
    assert collector["collector"]["kind"] == path["kind"] == "File" and path["format"] in ("TEXT", "JSON")
    assert path["path"].startswith("/"), path
    template = spec["trialTemplate"]
    declared = {p["name"] for p in template["trialParameters"]}
    used = set(re.findall(r"\$\{trialParameters\.([^}]+)\}", str(template["trialSpec"])))
    assert used == declared, f"trial parameters declared {sorted(declared)}, used {sorted(used)}"
    names = {p["name"] for p in spec["parameters"]}
    for p in template["trialParameters"]:
        assert p["reference"] in names or re.fullmatch(r"\$\{trialSpec\.\w+\}", p["reference"]), p
    metrics = {objective["objectiveMetricName"], *objective.get("additionalMetricNames", [])}
    for strategy in objective.get("metricStrategies", []):
        assert strategy["name"] in metrics and strategy["value"] in ("min", "max", "latest"), strategy
    if "earlyStopping" in spec:
        _katib_medianstop(spec["earlyStopping"])


def _katib_medianstop(early: dict) -> None:
    """Katib's medianstop service's own check of its settings (pkg/earlystopping/v1beta1/medianstop): known
    names, whole numbers, min_trials_required above 0 and start_step at least 1."""
    assert early["algorithmName"] == "medianstop", early
    for setting in early.get("algorithmSettings", []):
        assert setting["name"] in ("min_trials_required", "start_step"), setting
        assert int(setting["value"]) >= 1, setting


def validate_experiment(obj: dict) -> None:
    """A Katib Experiment: kubeflow-katib-api 0.19's models (round trip), the webhook's rules, its (permissive)
    CRD, and the trial template as the PyTorchJob it is."""
    from kubeflow_katib_api.models import V1beta1Experiment

    try:
        model = V1beta1Experiment.from_dict(obj)
    except Exception as e:
        raise TypedModelError(f"Experiment: {str(e).splitlines()[0:3]}") from None
    if diff := _first_difference(obj, model.to_dict()):
        raise TypedModelError(f"Experiment {diff}")
    _katib_webhook(obj["spec"])
    check_crd(obj, "kubeflow.org_experiments.katib.yaml")
    trial = copy.deepcopy(obj["spec"]["trialTemplate"]["trialSpec"])
    trial["metadata"]["name"] = "trial-name"  # Katib names each trial's job
    validate_pytorchjob(trial)


def validate_optimizationjob(obj: dict) -> None:
    """A Trainer OptimizationJob: its CRD (from Trainer's main branch; there are no released models), the CEL
    rules it states, and the trial template as the TrainJob it is."""
    check_crd(obj, "trainer.kubeflow.org_optimizationjobs.yaml")
    spec = obj["spec"]
    assert spec["parallelTrials"] <= spec["numTrials"], "parallelTrials cannot exceed numTrials"
    assert len(spec["searchAlgorithm"]) == 1, "exactly one of random, grid"
    if "grid" in spec["searchAlgorithm"]:
        assert all("categorical" in p["searchSpace"] for p in spec["parameters"]), "grid takes categorical only"
    template = spec["trainJobTemplate"]
    assert "name" not in template.get("metadata", {}), "name and namespace cannot be set in a template"
    meta = {"name": "trial", **template["metadata"]}
    trainjob = {"apiVersion": obj["apiVersion"], "kind": "TrainJob", "metadata": meta, "spec": template["spec"]}
    validate_trainjob(trainjob)
