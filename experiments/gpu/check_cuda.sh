#!/usr/bin/env bash
# One GPU call (under 9 minutes) that checks everything CUDA-related this repo can run WITHOUT
# vLLM, in priority order, each part under its own timeout, logs under $OUT:
#   1. the built-in tiny agent trains on CUDA: 20 GRPO steps and 20 FOCUS steps (`agentrl train
#      --set model.device=cuda`), from a tiny build carried in $AGENTRL_CACHE (or built there);
#   2. the hf engine on CUDA with a small Qwen3 in bfloat16 (experiments/gpu/check_scale.py
#      bench + focus, --engines hf): throughput, engine-vs-trainer log-prob gap, FOCUS steps;
#   3. the gpu-marked tests with CUDA visible (AGENTRL_TEST_CUDA=1): tests/test_cuda.py (sampling
#      on GPU logits with CPU generators, every method's two training steps, resume, eval) and
#      tests/test_attention.py's sink-attention checks; then the long-context memory benchmark
#      (ATTN_BENCH=0 skips it);
#   4. the CPU suite on the GPU machine (conftest hides CUDA from it).
#
#   AGENTRL_CACHE=$PWD/.gpucache OUT=$PWD/runs/check-cuda bash experiments/gpu/check_cuda.sh 2>&1 | tee log
# ($OUT holds the run folders and one log per part; the parts' tails are printed.)
# Needs python3 with torch (CUDA), transformers >= 5, typer, rich, pyyaml, pytest (and
# pytest-xdist for part 4); wheels in .whl/ (math-verify, bfcl-eval) are installed first if present.
set -u
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
export OUT=${OUT:-/tmp/check_cuda}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error \
  TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 AGENTRL_CACHE=${AGENTRL_CACHE:-$OUT/cache}
"$PY" -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__, '|', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA')" || exit 2
AGENTRL="$PY -m agentrl_cli.cli.main"
status=0
part() { local t=$1 name=$2; shift 2; echo "== $name"; local s=$(date +%s)
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  tail -n "${TAILN:-25}" "$OUT/$name.log"; echo "== $name: exit $rc in $(( $(date +%s) - s ))s"
  [ $rc -eq 0 ] || status=1; }

DEV=${DEVICE:-cuda}; STEPS=${STEPS:-20}
COMMON=(--seed 0 --set model.device=$DEV --set train.eval_every=10 --set train.save_every=0)
TAILN=8 part 150 train-grpo $AGENTRL train --method grpo --steps $STEPS "${COMMON[@]}" --out "$OUT/grpo"
TAILN=8 part 150 train-focus $AGENTRL train --method focus --steps $STEPS "${COMMON[@]}" --out "$OUT/focus"
for m in grpo focus; do
  "$PY" - "$OUT/$m" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
ev = [(r["step"], r["eval/success"]) for r in rows if "eval/success" in r]
st = [r["time/step"] for r in rows if "time/step" in r]
print(sys.argv[1].rsplit("/", 1)[1], "held-out:", ev, "| mean s/step:", round(sum(st) / max(len(st), 1), 2))
EOF
done
part 60 scale-build "$PY" experiments/gpu/check_scale.py build --device $DEV --out "$OUT/scale"
part 120 scale-bench "$PY" experiments/gpu/check_scale.py bench --device $DEV --engines hf --out "$OUT/scale"
part 120 scale-focus "$PY" experiments/gpu/check_scale.py focus --device $DEV --engines hf --steps 3 --out "$OUT/scale"
# the gpu-marked tests (tests/test_cuda.py: sampling and every method's training on CUDA;
# tests/test_attention.py: sink attention vs eager) with CUDA visible to the tests
part 300 gpu-tests env AGENTRL_TEST_CUDA=1 "$PY" -m pytest -q -m gpu -n 4 -p no:cacheprovider tests
if [ "${ATTN_BENCH:-1}" = 1 ]; then
part 100 attention-bench "$PY" benchmarks/bench_long_context.py --device cuda --dtype bfloat16 \
    --hidden 512 --heads 8 --kv-heads 2 --head-dim 64 --vocab 32768 --layer-pairs 2
fi
# the CPU suite on the GPU machine (conftest hides CUDA from it)
TAILN=40 part "${SUITE_TIMEOUT:-150}" cpu-suite env OMP_NUM_THREADS=1 "$PY" -m pytest -q -n 12 --tb=short -rfE -p no:cacheprovider tests
echo "overall: $status"
exit $status
