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
fi
