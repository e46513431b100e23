#!/usr/bin/env bash
# GPU check of the sink-aware attention (docs/methods.md), in one call of under 8 minutes:
#   1. the gpu-marked equivalence tests of tests/test_attention.py (sink_flex and sink_sdpa vs
#      gpt-oss eager attention on CUDA: outputs and gradients of q, k, v, sinks; a whole tiny
#      gpt-oss model's logits and parameter gradients; left padding through the mask builders);
#   2. benchmarks/bench_long_context.py on CUDA: peak memory and step time of one training
#      step at 1k-8k tokens, eager vs sink_flex vs sink_sdpa, plain vs chunked log-probs.
# Run from anywhere: bash experiments/gpu/check_attention.sh   (logs go to $OUT, by default a scratch folder)
# Needs python3 with torch (CUDA), transformers >= 5 and pytest; the repo needs no install.
set -u
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
LOG=${OUT:-/tmp/check_attention}
mkdir -p "$LOG"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error

"$PY" - <<'PYEOF' 2>&1 | tee "$LOG/env.txt"
import torch, transformers
print("torch", torch.__version__, "| transformers", transformers.__version__)
assert torch.cuda.is_available(), "no CUDA device"
print("device:", torch.cuda.get_device_name(0))
PYEOF
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "no usable CUDA python: stopping"; exit 2; }

echo "== 1. equivalence tests on CUDA (pytest -m gpu) =="
timeout 210 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/test_attention.py 2>&1 | tee "$LOG/tests.txt"
tests_rc=${PIPESTATUS[0]}

echo "== 2. long-context memory benchmark on CUDA =="
timeout 240 "$PY" benchmarks/bench_long_context.py --device cuda --dtype bfloat16 \
    --hidden 512 --heads 8 --kv-heads 2 --head-dim 64 --vocab 32768 --layer-pairs 2 \
    2>&1 | grep -v -i "warn" | tee "$LOG/bench.txt"
bench_rc=${PIPESTATUS[0]}

echo "tests exit $tests_rc, benchmark exit $bench_rc (124 = timed out)"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
