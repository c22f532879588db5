#!/usr/bin/env bash
# Install with the test extras, lint, and run the test suite on the CPU.
#
#   scripts/test.sh                 the whole suite (CI's; 2 pytest workers, under 30 minutes on 2 cores)
#   scripts/test.sh --fast          unit tests, doctests and the layout checks: every test not marked slow
#                                   (no training run, server or trainer subprocess; a few minutes on 2 cores)
#   scripts/test.sh [--fast] ARGS   ARGS go to pytest as they are (a file, -k EXPR, -x ...)
set -euo pipefail
cd "$(dirname "$0")/.."
select=()
if [ "${1:-}" = "--fast" ]; then
  shift
  select=(-m "not slow")
fi
bash scripts/setup.sh train,test
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# one thread a process unless told otherwise: two workers (and the jobs they start) on two cores, where torch's
# default of a thread a core leaves threads spinning for a core; about a fifth less wall time on the slow modules
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
.venv/bin/ruff check operator_cli trainer tests bench recipes lab
.venv/bin/python -m operator_cli.chart_schema --check  # the chart's values.schema.json matches the config schema
.venv/bin/python -m lab.results --check  # docs/results.md and the docs' results blocks match the research record
set +e
# two workers, a test module to each at a time: a module's shared runs and servers are made once (-n 0: one process)
.venv/bin/python -m pytest -q -n 2 --dist loadscope ${select[@]+"${select[@]}"} "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then  # pytest's "no tests ran": a test run that tests nothing is a failure
  echo "pytest ran no tests: the arguments${select[@]+ and --fast (-m \"not slow\")} selected none" >&2
  exit 1
fi
exit "$code"
