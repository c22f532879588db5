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
if [[ ",${extras}," == *",test,"* ]]; then
  .venv/bin/python -m pip install --quiet --progress-bar off --no-deps -r tests/requirements-nodeps.txt
  # moto's S3 server for the object-store tests, in a venv of its own: its botocore needs
  # python-dateutil<3, the CLI's kubernetes client needs >=3
  [ -x .venv-moto/bin/moto_server ] || {
    python3 -m venv .venv-moto
    .venv-moto/bin/python -m pip install --quiet --progress-bar off -r tests/requirements-moto.txt
  }
fi
