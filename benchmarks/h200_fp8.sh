#!/usr/bin/env bash
# FP8 weights on one H200 (issue 18), one device call, every part cut at a deadline so the whole stays
# under LIMIT seconds (run from the tree's root, the packages importable, OUT set):
#   the FP8 GPU tests (every FP8 kernel against its dequantised reference; the e4m3 widening on every
#   byte), micro.py thinker/talker at B = 1, 32 in bf16 then FP8 (same options; random bf16 weights,
#   quantised at load for FP8), benchmarks/fp8.py projections (µs per projection, bf16 vs FP8, FP8
#   GEMV tiles at M = 1), the thinker accuracy (1 prompt, 64 steps) while time is left.
# Files back: log.txt, {bf16,fp8}/micro.{md,json}, kernels/fp8.{md,json}, acc/fp8.md (8 at most).
set -uo pipefail
LIMIT=${LIMIT:-245}
T0=$SECONDS
LOG=$OUT/log.txt
left() { echo $((LIMIT - (SECONDS - T0))); }
step() { # step SECONDS CMD...: run CMD with at most SECONDS (and what is left), its output appended to log.txt
  local want=$1 t
  shift
  t=$(left)
  [ "$want" -lt "$t" ] && t=$want
  if [ "$t" -le 5 ]; then echo "[skip: no time] $*" | tee -a "$LOG"; return 0; fi
  echo "=== [$((SECONDS - T0))s] $* (limit ${t}s)" | tee -a "$LOG"
  timeout "$t" "$@" >>"$LOG" 2>&1
  echo "=== [$((SECONDS - T0))s] rc=$?" | tee -a "$LOG"
}
SKEL=.gpu/full-skel
(python3 -m omniwalk.cli make-tiny "$SKEL" --config qwen3-omni-30b-a3b --no-weights >/tmp/make_tiny.log 2>&1) &
SKEL_PID=$!
step 60 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_fp8_gpu.py
wait $SKEL_PID
# (decode steps only: no encoder or prefill graphs, decode graphs up to B = 32; same options for both)
MICRO="$SKEL --parts thinker,talker --thinker-batches 1,32 --talker-batches 1,32 --option encoder_graph_max_tokens=0 --option prefill_graph_max_tokens=0 --option cuda_graph_max_batch=32"
mkdir -p "$OUT/bf16" "$OUT/fp8"
step 50 python3 benchmarks/micro.py $MICRO --out "$OUT/bf16"
step 55 python3 benchmarks/micro.py $MICRO --option quantization=fp8 --out "$OUT/fp8"
for f in bf16 fp8; do echo "--- $f"; grep -E "^\| (1|32) \|" "$OUT/$f/micro.md" 2>/dev/null | cut -d'|' -f1-4; grep -o '"max_memory[^,]*' "$OUT/$f/micro.json" 2>/dev/null; done | tee -a "$LOG"
step 40 python3 benchmarks/fp8.py "$SKEL" --parts projections --out "$OUT/kernels"
step 60 python3 benchmarks/fp8.py "$SKEL" --parts accuracy --prompts 1 --out "$OUT/acc"
rm -f "$OUT/acc/fp8.json"
grep -E "passed|failed|error|Error|GPU-FP8|accuracy prompt" "$LOG" | cut -c1-220 | tail -40
echo "[$((SECONDS - T0))s] done"
