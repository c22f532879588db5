#!/usr/bin/env bash
# Build the real Dockerfile with buildah and run its entrypoint inside the image, offline-based.
#
#   sudo bash scripts/image-test.sh        # root: buildah (vfs, chroot isolation) and debootstrap
#
# 1. a Debian bookworm root filesystem (debootstrap, ~1 min) imported as an image;
# 2. an offline stand-in for the PyTorch runtime base: that image + torch 2.11.0 in /opt/conda;
# 3. the project's Dockerfile built on it (--build-arg BASE_IMAGE), timed;
# 4. checks inside the image: torch comes from the base, not from a second copy in /opt/venv;
#    the image runs as UID 1000;
# 5. the image's entrypoint (colbert-train) run as UID 1000 for a 2-process CPU job on the
#    quickstart data (PET_NPROC_PER_NODE=2: the trainer starts torchrun itself, as in a pod);
# 6. image size, build time and the job's metrics, printed and written to $WORK/result.json.
#
# Stand-in gaps (see docs/docker.md): no GPU/NVIDIA runtime, no registry push/pull, chroot
# isolation instead of a container runtime (no cgroup limits, the host's network namespace, and the
# host name mapping a runtime writes into /etc/hosts is added by hand).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${IMAGE_TEST_DIR:-/var/tmp/ck8s-image}
CA=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
B=(buildah --storage-driver vfs)
ROOTFS_IMAGE=localhost/ck8s-debootstrap:bookworm
BASE_IMAGE=localhost/ck8s-pytorch-standin:2.11.0
IMAGE=localhost/colbert-train:image-test
mkdir -p "$WORK"

need() { command -v "$1" >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null; }; }
need buildah buildah
need podman podman
need debootstrap debootstrap
step() { printf '\n== %s\n' "$*"; }

if ! "${B[@]}" inspect --type image "$ROOTFS_IMAGE" >/dev/null 2>&1; then
  step "debootstrap bookworm (minbase + python3) into $WORK/rootfs"
  if [ ! -x "$WORK/rootfs/usr/bin/python3" ]; then
    rm -rf "$WORK/rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$WORK/rootfs"
  fi
  tar -C "$WORK/rootfs" -c . | podman --storage-driver vfs import - "$ROOTFS_IMAGE"
fi

if ! "${B[@]}" inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
  step "stand-in base $BASE_IMAGE (torch 2.11.0 in /opt/conda)"
  "${B[@]}" bud --isolation chroot --volume "$CA:$CA:ro" --build-arg "PIP_CERT=$CA" \
    --build-arg "ROOTFS_IMAGE=$ROOTFS_IMAGE" -f scripts/image/pytorch-standin.Dockerfile -t "$BASE_IMAGE" scripts/image
fi

step "buildah bud the project's Dockerfile on $BASE_IMAGE"
start=$(date +%s)
"${B[@]}" bud --isolation chroot --volume "$CA:$CA:ro" --build-arg "PIP_CERT=$CA" \
  --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$IMAGE" .
build_seconds=$(( $(date +%s) - start ))

# docker and the kubelet map a container's host name in its /etc/hosts (torchrun's rendezvous resolves
# it); chroot isolation does not, so the mapping is added here as they would add it
c=$("${B[@]}" from --add-host ck8s-image:127.0.0.1 "$IMAGE")
trap '"${B[@]}" rm "$c" >/dev/null 2>&1 || true' EXIT
run_as() { "${B[@]}" run --isolation chroot --hostname ck8s-image --user "$1" --env HF_HUB_OFFLINE=1 --env TOKENIZERS_PARALLELISM=false "$c" -- "${@:2}"; }

step "checks inside the image"
torch_file=$(run_as 1000:1000 python -c 'import torch; print(torch.__file__)')
echo "torch imported from: $torch_file"
case "$torch_file" in /opt/venv/*) echo "FAIL: the venv carries its own torch" >&2; exit 1 ;; esac
venv_torch=$(run_as 1000:1000 sh -c 'ls -d /opt/venv/lib/python3*/site-packages/torch 2>/dev/null || true')
[ -z "$venv_torch" ] || { echo "FAIL: $venv_torch exists" >&2; exit 1; }
run_as 1000:1000 sh -c 'id -u; test -w /workspace' | head -1 | grep -qx 1000
run_as 1000:1000 /opt/serve/bin/python -c 'import kserve, torch, trainer.serve.predictor; print("serve venv: kserve and torch", torch.__version__)'

step "entrypoint (colbert-train) as UID 1000, 2 CPU processes, quickstart data"
"${B[@]}" copy --chown 1000:1000 "$c" examples/quickstart.yaml /workspace/quickstart.yaml >/dev/null
run_as 1000:1000 python -m trainer.quickstart_data /workspace/data/quickstart
job_start=$(date +%s)
run_as 1000:1000 env PET_NPROC_PER_NODE=2 colbert-train --config /workspace/quickstart.yaml
job_seconds=$(( $(date +%s) - job_start ))
metrics=$(run_as 1000:1000 cat /workspace/output/quickstart/metrics.json)

size=$("${B[@]}" images --format '{{.Size}}' "$IMAGE" | head -1)
base_size=$("${B[@]}" images --format '{{.Size}}' "$BASE_IMAGE" | head -1)
python3 - "$WORK/result.json" "$size" "$base_size" "$build_seconds" "$job_seconds" "$metrics" <<'PY'
import json, sys
out, size, base, build, job, metrics = sys.argv[1:]
m = json.loads(metrics)
result = {"image_size": size, "base_size": base, "build_seconds": int(build), "job_wall_seconds": int(job),
          "steps": m["steps"], "world_size": m["world_size"], "before": m.get("before"), "after": m.get("after")}
open(out, "w").write(json.dumps(result, indent=2) + "\n")
print(json.dumps(result, indent=2))
PY
"${B[@]}" rmi --prune >/dev/null 2>&1 || true  # earlier builds' untagged layers (vfs stores each in full)
step "image-test passed"
