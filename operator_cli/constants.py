"""Every Kubernetes name, group, label key and path the CLI, the chart and local replay agree on."""

GROUP = "kubeflow.org"
VERSION = "v1"
PLURAL = "pytorchjobs"
KIND = "PyTorchJob"
CRD_NAME = f"{PLURAL}.{GROUP}"

CONTAINER = "pytorch"  # the operator requires this container name
PORT_NAME = "pytorchjob-port"
MASTER_PORT = 23456

APP_NAME = "colbert-k8s"
MANAGED_BY = "colbert-k8s"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
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
DEFAULT_IMAGE = "colbert-k8s/colbert-train:0.1.0"
_OPERATOR_KUSTOMIZE = "github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.4"
TRAINING_OPERATOR_INSTALL = f'kubectl apply --server-side -k "{_OPERATOR_KUSTOMIZE}"'
