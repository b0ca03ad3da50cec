#!/usr/bin/env bash
# fp8's second device call (run from .dev_fp8 with ../.whl carried), every part cut at a deadline so the
# whole stays under LIMIT seconds: the FP8 GPU tests (now with the FP8 grouped GEMM), the FP8 launch
# configuration sweep (benchmarks/fp8.py --parts tune), micro.py thinker/talker bf16 and FP8 with the
# swept tables applied in-process (fp8.py --apply), the thinker accuracy run again while time is left.
# Files back (8 at most): log.txt, tune/{tuned.json,fp8.md}, {bf16,fp8}/micro.md, fp8/micro.json, acc/fp8.{md,json}.
set -uo pipefail
LIMIT=${LIMIT:-170}
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
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../.whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
SKEL=.gpu/full-skel
(python3 -m omniwalk.cli make-tiny "$SKEL" --config qwen3-omni-30b-a3b --no-weights >/tmp/make_tiny.log 2>&1) &
SKEL_PID=$!
step 30 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_fp8_gpu.py
wait $SKEL_PID
step 60 python3 benchmarks/fp8.py "$SKEL" --parts tune --out "$OUT/tune"
rm -f "$OUT/tune/fp8.json"
MICRO="$SKEL --parts thinker,talker --thinker-batches 1,32 --talker-batches 1,32 --option encoder_graph_max_tokens=0 --option prefill_graph_max_tokens=0 --option cuda_graph_max_batch=32"
mkdir -p "$OUT/bf16" "$OUT/fp8"
step 30 python3 benchmarks/micro.py $MICRO --out "$OUT/bf16"
if [ -f "$OUT/tune/tuned.json" ]; then
  step 35 python3 benchmarks/fp8.py --apply "$OUT/tune/tuned.json" benchmarks/micro.py $MICRO --option quantization=fp8 --out "$OUT/fp8"
else
  step 35 python3 benchmarks/micro.py $MICRO --option quantization=fp8 --out "$OUT/fp8"
fi
for f in bf16 fp8; do echo "--- $f"; grep -E "^\| (1|32) \|" "$OUT/$f/micro.md" 2>/dev/null | cut -d'|' -f1-4; grep max_memory "$OUT/$f/micro.json" 2>/dev/null; done | tee -a "$LOG"
rm -f "$OUT/bf16/micro.json"
step 45 python3 benchmarks/fp8.py "$SKEL" --parts accuracy --prompts 2 --out "$OUT/acc"
grep -E "passed|failed|error|Error" "$LOG" | cut -c1-200 | tail -12
echo "[$((SECONDS - T0))s] done"
