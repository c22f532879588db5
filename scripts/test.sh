#!/usr/bin/env bash
# Install with the test extras, lint, and run the whole test suite (CPU only, about 30 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh train,test
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check operator_cli trainer tests bench recipes lab
.venv/bin/python -m operator_cli.chart_schema --check  # the chart's values.schema.json matches the config schema
.venv/bin/python -m lab.results --check  # docs/results.md and the docs' results blocks match the research record
set +e
.venv/bin/python -m pytest -q "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 1
fi
exit "$code"
