"""Every Kubernetes name, group, label key and path the CLI, the chart and local replay agree on."""

from operator_cli import __version__

GROUP = "kubeflow.org"
VERSION = "v1"
PLURAL = "pytorchjobs"
KIND = "PyTorchJob"
CRD_NAME = f"{PLURAL}.{GROUP}"

# Kubeflow Trainer v2 (TrainJob on JobSet, with a ClusterTrainingRuntime)
V2_GROUP = "trainer.kubeflow.org"
V2_VERSION = "v1alpha1"
V2_PLURAL = "trainjobs"
V2_KIND = "TrainJob"
V2_CRD_NAME = f"{V2_PLURAL}.{V2_GROUP}"
V2_RUNTIME_PLURAL = "clustertrainingruntimes"
V2_RUNTIME_KIND = "ClusterTrainingRuntime"
V2_STOCK_RUNTIME = "torch-distributed"  # the runtime Trainer v2's manifests install
V2_SHIPPED_RUNTIME = "colbert-torch"  # `colbert-k8s runtime install`: this image's, failing fast on exit 1-127
V2_DEFAULT_RUNTIME = V2_SHIPPED_RUNTIME  # --runtime's default; submit falls back to the stock one without it
V2_CONTAINER = "node"  # the trainer container of a runtime's `node` replicated job
V2_REPLICATED_JOB = "node"
V2_MASTER_PORT = 29500
V2_PATCH_MANAGER = "colbert-k8s.io/cli"
V2_FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOB_COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"

# KServe (serving a trained model: `colbert-k8s serve`)
SERVE_GROUP = "serving.kserve.io"
SERVE_VERSION = "v1beta1"
SERVE_PLURAL = "inferenceservices"
SERVE_KIND = "InferenceService"
SERVE_RUNTIME_VERSION = "v1alpha1"
SERVE_RUNTIME_PLURAL = "clusterservingruntimes"
SERVE_RUNTIME_KIND = "ClusterServingRuntime"
SERVE_RUNTIME = "colbert-k8s"  # the ClusterServingRuntime `serve apply` installs when it is missing
SERVE_MODEL_FORMAT = "colbert"
SERVE_CONTAINER = "kserve-container"  # KServe's name for the predictor's container
SERVE_PORT = 8080
SERVE_MODEL_DIR = "/mnt/models"  # where KServe's storage initializer puts storageUri
SERVE_TMP_SIZE = "1Gi"  # the predictor's /tmp (an emptyDir): its root filesystem is read-only
SERVE_PYTHON = "/opt/serve/bin/python"  # the image's serve venv (the Dockerfile), layered on /opt/venv
KSERVE_INSTALL = "https://kserve.github.io/website/docs/admin-guide/overview (KServe 0.15 or newer)"

CONTAINER = "pytorch"  # the operator requires this container name
# bounds of a job's shape, for every flag, the chart and resize: a typo (--nodes 10000) is refused before
# it asks a cluster for that many pods; 16 GPUs is the most any node sold today holds
MAX_NODES = 1024
MAX_GPUS_PER_NODE = 16
MAX_RUNTIME_RESTARTS = 1000  # a runtime's JobSet maxRestarts: `runtime --max-restarts` and the chart
PORT_NAME = "pytorchjob-port"
MASTER_PORT = 23456

APP_NAME = "colbert-k8s"
MANAGED_BY = "colbert-k8s"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_VERSION = "app.kubernetes.io/version"  # this tool's version, on every object (the chart: its appVersion)
OWN_LABELS = frozenset({LABEL_NAME, LABEL_INSTANCE, LABEL_MANAGED_BY, LABEL_COMPONENT, LABEL_VERSION})  # every object's
APP_VERSION = __version__
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
# Kueue's topology-aware scheduling (beta, on by default since Kueue 0.14): annotations on pod templates
KUEUE_TOPOLOGY_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
KUEUE_TOPOLOGY_PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta1"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"  # + a MIG profile (1g.10gb): the device plugin's mixed strategy
# --nccl ib: one RDMA device per pod, as Mellanox's k8s-rdma-shared-dev-plugin names it by default (other
# plugins: --rdma-resource, e.g. nvidia.com/hostdev or rdma/hca_shared_devices_a); NCCL pins its buffers
RDMA_RESOURCE = "rdma/ib"
RDMA_CAPABILITY = "IPC_LOCK"
# set by the Training Operator on the pods it creates
OPERATOR_JOB_NAME = "training.kubeflow.org/job-name"
OPERATOR_REPLICA_TYPE = "training.kubeflow.org/replica-type"
OPERATOR_REPLICA_INDEX = "training.kubeflow.org/replica-index"

CONFIG_MOUNT = "/etc/colbert-k8s"
CONFIG_FILE = "train.yaml"
WORKSPACE_MOUNT = "/workspace"
SHM_MOUNT = "/dev/shm"

# SIGTERM -> checkpoint of the last completed step -> exit: the kubelet waits this long before SIGKILL
TERMINATION_GRACE_SECONDS = 120
RUN_AS_USER = 1000  # the Dockerfile's `colbert` user
DEFAULT_IMAGE = f"colbert-k8s/colbert-train:{__version__}"
_OPERATOR_KUSTOMIZE = "github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.4"
TRAINING_OPERATOR_INSTALL = f'kubectl apply --server-side -k "{_OPERATOR_KUSTOMIZE}"'
_TRAINER_V2 = "github.com/kubeflow/trainer.git/manifests/overlays"
TRAINER_V2_INSTALL = (
    f'kubectl apply --server-side -k "{_TRAINER_V2}/manager?ref=v2.3.0" && '
    f'kubectl apply --server-side -k "{_TRAINER_V2}/runtimes?ref=v2.3.0"'
)

REQUEST_TIMEOUT = 30.0  # seconds for one API request, as kubectl's --request-timeout default
