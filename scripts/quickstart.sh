#!/usr/bin/env bash
# The main job on a fresh machine: install, build the offline quickstart data, and train
# all-MiniLM-L6-v2 as a ColBERT model with 2 CPU replicas through `colbert-k8s local`,
# printing nDCG@10 on the held-out split before and after.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh train
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/python -m trainer.quickstart_data data/quickstart
exec .venv/bin/colbert-k8s local --config examples/quickstart.yaml --name quickstart \
  --nodes 2 --gpus-per-node 0 --pvc-size 5Gi --workdir . "$@"
