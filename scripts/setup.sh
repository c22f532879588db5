#!/usr/bin/env bash
# Create .venv (once) and install this project with the given extras, pinned in pyproject.toml, saying
# what it installs (each package as pip collects it, each download with its size) and how big .venv ends.
# Usage: scripts/setup.sh [EXTRAS] [--cpu|--cuda]     e.g. scripts/setup.sh train,test
#   torch: --cpu installs PyTorch's CPU-only build (about 0.2 GB instead of 4 GB of torch, CUDA libraries
#   and triton) from $TORCH_CPU_INDEX; --cuda the PyPI build; neither: CPU-only when this machine has no
#   nvidia-smi and that index offers the pinned version, else the PyPI build (the line says which, and why).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="train"
torch_build="auto"
for arg in "$@"; do
  case "$arg" in
    --cpu) torch_build="cpu" ;;
    --cuda) torch_build="cuda" ;;
    -*) echo "setup: unknown option $arg (use --cpu or --cuda)" >&2; exit 2 ;;
    *) extras="$arg" ;;
  esac
done
TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"

# pip's own line for each download, with its size, as it comes (unbuffered: a pipe would hold them back),
# and the count installed; warnings and errors (stderr) pass through as they are, less setuptools' note on
# every editable install (not a problem of ours).
pip_install() {
  PYTHONUNBUFFERED=1 PYTHONWARNINGS="ignore:Editable installation" \
    .venv/bin/python -m pip install --progress-bar off "$@" \
    | awk '/^ *(Downloading|Using cached|Processing) / {sub(/^ */, ""); print "  " $0; fflush()}
           /^Installing collected packages/ {print "  unpacking " NF - 3 " package(s) (minutes for torch)"; fflush()}
           /^Successfully installed/ {print "  installed " NF - 2 " package(s)"; fflush()}'
}

# A first install needs room: on a full disk pip fails late, after minutes of downloads, with a bare OSError.
# Say so first, in one line: $1 GB needed for $2.
need_room() {
  local free_gb
  free_gb=$(df -Pk . | awk 'NR == 2 {printf "%d", $4 / 1048576}')
  if [ "$free_gb" -lt "$1" ]; then
    echo "setup: ${free_gb} GB free on $(df -P . | awk 'NR == 2 {print $6}'), $2 needs about $1 GB: free some room and run setup again" >&2
    exit 1
  fi
}

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade "pip>=24"

if [[ ",${extras}," == *",train,"* ]]; then
  torch_pin="$(sed -n 's/^ *"torch==\([0-9.]*\)".*/\1/p' pyproject.toml | head -n 1)"
  if [ "$torch_build" = "auto" ]; then
    if command -v nvidia-smi >/dev/null 2>&1; then
      torch_build="cuda"; why="nvidia-smi found"
    elif .venv/bin/python -m pip index versions torch --retries 0 --timeout 10 \
        --extra-index-url "$TORCH_CPU_INDEX" 2>/dev/null | grep -q "${torch_pin}+cpu"; then
      torch_build="cpu"; why="no nvidia-smi, and ${TORCH_CPU_INDEX} offers ${torch_pin}+cpu"
    else
      torch_build="cuda"
      why="no nvidia-smi, but no index here offers ${torch_pin}+cpu"
    fi
  else
    why="--${torch_build}"
  fi
  has_torch=false
  .venv/bin/python -c "import torch" >/dev/null 2>&1 && has_torch=true
  if ! $has_torch; then
    # measured: .venv 6.6 GB with the CUDA build, pip's cache and unpacking beside it; the CPU build about 2 GB
    if [ "$torch_build" = "cpu" ]; then need_room 3 "torch's CPU build and the rest"; else
      need_room 10 "torch's CUDA build (about 4.5 GB), the rest and pip's unpacking"; fi
  fi
  if [ "$torch_build" = "cpu" ] && ! $has_torch; then
    echo "setup: torch ${torch_pin}+cpu, the CPU-only build (${why}): about 0.2 GB"
    pip_install "torch==${torch_pin}+cpu" --extra-index-url "$TORCH_CPU_INDEX"
  elif [ "$torch_build" = "cuda" ]; then
    echo "setup: torch ${torch_pin}, PyPI's CUDA build: about 4.5 GB with its CUDA libraries and triton (${why})"
    [ "$why" = "nvidia-smi found" ] || [ "$why" = "--cuda" ] ||
      echo "setup: where an index offers the CPU-only build: TORCH_CPU_INDEX=URL scripts/setup.sh ${extras} --cpu"
  fi
fi
# the tests drive the vector databases' embedded modes (Qdrant, LanceDB): the test path installs them too
if [[ ",${extras}," == *",test,"* && ",${extras}," != *",vectordb,"* ]]; then extras="${extras},vectordb"; fi
echo "setup: installing colbert-k8s[${extras}] into .venv (a first install takes minutes)"
pip_install -e ".[${extras}]"
if [[ ",${extras}," == *",train,"* ]]; then
  # The KServe predictor (trainer/serve/, `colbert-k8s serve`), in a venv layered on .venv: kserve 0.21 needs
  # python-dateutil<3 (and protobuf<7, pandas<3, psutil<6), the CLI's kubernetes 37.0.2 python-dateutil>=3. It
  # sees .venv's torch and pylate after its own packages (requirements-serve.txt says what it adds or moves).
  [ -x .venv-serve/bin/python ] && .venv-serve/bin/python -c "import kserve" 2>/dev/null || {
    echo "setup: creating .venv-serve (kserve for the predictor, layered on .venv: about 280 MB)"
    python3 -m venv .venv-serve
    train_site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    serve_site=$(.venv-serve/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "import site; site.addsitedir('${train_site}')" > "${serve_site}/colbert-k8s-train.pth"
    # pip's conflict check would print, as an ERROR, the one conflict this venv exists for (kubernetes
    # 37.0.1 here, the CLI's ==37.0.2 in .venv) and those of the test models installed --no-deps on purpose;
    # any other conflict pip check reports is printed as it is
    .venv-serve/bin/python -m pip install --quiet --progress-bar off --no-warn-conflicts -r requirements-serve.txt
    nodeps=$(sed -n 's/^\([A-Za-z0-9_.-]*\)==.*/\1/p' tests/requirements-nodeps.txt | paste -sd '|' -)
    conflicts=$(.venv-serve/bin/python -m pip check 2>/dev/null |
      grep -v -E "^colbert-k8s .* requirement kubernetes==|^(${nodeps}) [0-9]|^No broken requirements" || true)
    [ -z "$conflicts" ] || echo "setup: warning: conflicts in .venv-serve: ${conflicts}" >&2
    echo "setup: .venv-serve holds kubernetes 37.0.1 (kserve needs python-dateutil<3); .venv keeps the CLI's 37.0.2"
  }
fi
if [[ ",${extras}," == *",test,"* ]]; then
  pip_install --no-deps -r tests/requirements-nodeps.txt
  # moto's S3 server for the object-store tests, in a venv of its own: its botocore needs
  # python-dateutil<3, the CLI's kubernetes client needs >=3
  [ -x .venv-moto/bin/moto_server ] || {
    echo "setup: creating .venv-moto (moto's S3 server for the object-store tests)"
    python3 -m venv .venv-moto
    .venv-moto/bin/python -m pip install --quiet --progress-bar off -r tests/requirements-moto.txt
  }
fi
# how big it ended, and what takes the room
site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "setup: .venv is $(du -sh .venv | cut -f1); largest: $(du -sm "$site"/* 2>/dev/null | sort -rn | head -n 4 \
  | awk '{n=split($2, p, "/"); printf "%s%s %.1f GB", (NR > 1 ? ", " : ""), p[n], $1 / 1024}')"
