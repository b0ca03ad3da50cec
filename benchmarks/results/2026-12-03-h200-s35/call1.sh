#!/usr/bin/env bash
# Session 35 call 1 (issue 18): the FP8 grouped GEMM on FP8 tensor cores (activations e4m3 per row and
# 128-column group). Its GPU tests; a thinker MoE layer at 1, 8, 32, 1,024 tokens bf16 vs FP8 in both trees
# (.dev_prev = 7306c58 with this fp8.py, . = the new kernel); the grouped tiles tuned (16 rows at 32 tokens,
# 64 rows at 1,024); A/B micro thinker B = 32 FP8 (2 rounds); the thinker accuracy (1 prompt).
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
LIMIT=570
LOG=$OUT/log.txt
install_wheels || exit 1
export PYTHONUNBUFFERED=1
SKEL=.gpu/full-skel
make_skeleton "$SKEL" qwen3-omni-30b-a3b >/tmp/make_tiny.log 2>&1 &
SKEL_PID=$!
deadline_step 120 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_fp8_gpu.py -k "grouped or quantiser or moe"
wait $SKEL_PID
deadline_step 60 python3 benchmarks/fp8.py "$SKEL" --parts moe --out "$OUT/moe_new"
(cd .dev_prev && export PYTHONPATH=/tmp/site:$PWD && deadline_step 60 python3 benchmarks/fp8.py "../$SKEL" --parts moe --out "$OUT/moe_prev")
deadline_step 100 python3 benchmarks/fp8.py "$SKEL" --parts tune --tune-rows 32 --out "$OUT/tune"
OUT=$OUT/ab deadline_step 170 bash benchmarks/h200_ab_micro.sh --trees ".dev_prev ." --part thinker --batches 32 \
  --rounds 2 --no-install --run-seconds 75 -- --option quantization=fp8
deadline_step 70 python3 benchmarks/fp8.py "$SKEL" --parts accuracy --prompts 1 --out "$OUT/acc"
rm -f "$OUT/acc/fp8.json" "$OUT/tune/fp8.json"
grep -E "passed|failed|error|Error|GPU-FP8|thinker MoE layer|^tune MoE|accuracy prompt|cosine" "$LOG" | cut -c1-260 | tail -50
cat "$OUT/ab/summary.md" 2>/dev/null
