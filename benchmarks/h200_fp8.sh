#!/usr/bin/env bash
# FP8 weights on one H200 (issue 18), one device call, every part cut at a deadline so the whole stays
# under LIMIT seconds (OUT set; the carried wheels installed first unless --no-install):
#   the FP8 GPU tests (every FP8 kernel against its dequantised reference; the e4m3 widening on every
#   byte), micro.py thinker/talker at B = 1, 32 in bf16 then FP8 (same options; random bf16 weights,
#   quantised at load for FP8), benchmarks/fp8.py projections (µs per projection, bf16 vs FP8, FP8
#   GEMV tiles at M = 1), the thinker accuracy (1 prompt, 64 steps) while time is left.
# Files back: log.txt, {bf16,fp8}/micro.{md,json}, kernels/fp8.{md,json}, acc/fp8.md (8 at most).
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmarks/h200_common.sh
LIMIT=${LIMIT:-245}
LOG=$OUT/log.txt
[ "${1:-}" = --no-install ] || install_wheels || exit 1
export PYTHONUNBUFFERED=1
SKEL=.gpu/full-skel
make_skeleton "$SKEL" qwen3-omni-30b-a3b >/tmp/make_tiny.log 2>&1 &
SKEL_PID=$!
deadline_step 60 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_fp8_gpu.py
wait $SKEL_PID
# (decode steps only: no encoder or prefill graphs, decode graphs up to B = 32; same options for both)
MICRO="$SKEL --parts thinker,talker --thinker-batches 1,32 --talker-batches 1,32 --option encoder_graph_max_tokens=0 --option prefill_graph_max_tokens=0 --option cuda_graph_max_batch=32"
mkdir -p "$OUT/bf16" "$OUT/fp8"
deadline_step 50 python3 benchmarks/micro.py $MICRO --out "$OUT/bf16"
deadline_step 55 python3 benchmarks/micro.py $MICRO --option quantization=fp8 --out "$OUT/fp8"
for f in bf16 fp8; do echo "--- $f"; grep -E "^\| (1|32) \|" "$OUT/$f/micro.md" 2>/dev/null | cut -d'|' -f1-4; grep -o '"max_memory[^,]*' "$OUT/$f/micro.json" 2>/dev/null; done | tee -a "$LOG"
deadline_step 40 python3 benchmarks/fp8.py "$SKEL" --parts projections --out "$OUT/kernels"
deadline_step 60 python3 benchmarks/fp8.py "$SKEL" --parts accuracy --prompts 1 --out "$OUT/acc"
rm -f "$OUT/acc/fp8.json"
grep -E "passed|failed|error|Error|GPU-FP8|accuracy prompt" "$LOG" | cut -c1-220 | tail -40
echo "[$((SECONDS - DEADLINE_T0))s] done"
