#!/usr/bin/env bash
# Create .venv (once) and install this project with the given extras, pinned in pyproject.toml.
# Usage: scripts/setup.sh train,test
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-train}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade "pip>=24"
.venv/bin/python -m pip install --quiet --progress-bar off -e ".[${extras}]"
if [[ ",${extras}," == *",train,"* ]]; then
  # The KServe predictor (trainer/serve/, `colbert-k8s serve`), in a venv layered on .venv: kserve 0.21 needs
  # python-dateutil<3 (and protobuf<7, pandas<3, psutil<6), the CLI's kubernetes 37.0.2 python-dateutil>=3. It
  # sees .venv's torch and pylate after its own packages (requirements-serve.txt says what it adds or moves).
  [ -x .venv-serve/bin/python ] && .venv-serve/bin/python -c "import kserve" 2>/dev/null || {
    python3 -m venv .venv-serve
    train_site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    serve_site=$(.venv-serve/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "import site; site.addsitedir('${train_site}')" > "${serve_site}/colbert-k8s-train.pth"
    .venv-serve/bin/python -m pip install --quiet --progress-bar off -r requirements-serve.txt
  }
fi
if [[ ",${extras}," == *",test,"* ]]; then
  .venv/bin/python -m pip install --quiet --progress-bar off --no-deps -r tests/requirements-nodeps.txt
  # moto's S3 server for the object-store tests, in a venv of its own: its botocore needs
  # python-dateutil<3, the CLI's kubernetes client needs >=3
  [ -x .venv-moto/bin/moto_server ] || {
    python3 -m venv .venv-moto
    .venv-moto/bin/python -m pip install --quiet --progress-bar off -r tests/requirements-moto.txt
  }
fi
