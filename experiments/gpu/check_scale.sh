#!/usr/bin/env bash
# GPU check of the scaling paths: --engine vllm (lock-step and path scheduler), the engine vs
# trainer log-prob gap, weight sync through sleep/wake, and a few FOCUS steps with vllm, each
# next to the hf engine on the same work. One call, under 8 minutes on one GPU.
#
#   PYTHON=/path/to/vllm-env/bin/python experiments/gpu/check_scale.sh      # from the repo root
#
# Needs: a CUDA GPU and a Python environment with vLLM and this project installed (README:
# "Scaling out"). No hub access: the model is built from a config. Results: $OUT/*.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
export OUT=${OUT:-/tmp/agentrl-check-scale}
export AGENTRL_CACHE=${AGENTRL_CACHE:-$OUT/cache} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible'" || exit 2
"$PY" -c "import vllm, agentrl_cli" || { echo "vLLM or agentrl is not importable by $PY (README: Scaling out)"; exit 2; }
status=0
step() { echo "== $*"; timeout "$1" "$PY" experiments/gpu/check_scale.py "${@:2}" --out "$OUT" || { echo "FAILED: ${*:2}"; status=1; }; }
start=$(date +%s)
step 90 build
step 240 bench --tasks 32 --group 4
step 200 focus --steps 3
echo "== done in $(( $(date +%s) - start ))s; results in $OUT/bench.json and $OUT/focus.json"
exit $status
