#!/usr/bin/env bash
# k2's device calls (run from .dev_k2 with ../.whl and ../.whl_hf carried): GPU tests of the changed
# kernels, the kernel benchmarks, micro.py, then the rest of the GPU tests while time is left. Every
# part is cut at a deadline so the whole stays under LIMIT seconds. Few files under $OUT (the device
# returns a limited count): log.txt, the benchmarks' json, micro.md/json, tests.log.
#   LIMIT=232 bash k2_call.sh                  (call 1: everything)
#   LIMIT=145 PAGED=0 bash k2_call.sh          (call 2: no paged decode sweep)
set -uo pipefail
LIMIT=${LIMIT:-232}
PAGED=${PAGED:-1}
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
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  ../.whl/*.whl $(ls ../.whl_hf/*.whl 2>/dev/null) || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
SKEL=.gpu/full-skel
(python3 -m omniwalk.cli make-tiny "$SKEL" --config qwen3-omni-30b-a3b --no-weights >/tmp/make_tiny.log 2>&1) &
SKEL_PID=$!
PYTEST="python3 -m pytest -q -s -p no:cacheprovider"
step 45 $PYTEST -m gpu tests/test_fused_gpu.py tests/test_graphs_gpu.py -k "paged or route or fused_moe"
step 55 python3 benchmarks/fused_moe.py --out "$OUT"
[ "$PAGED" = 1 ] && step 40 python3 benchmarks/paged_decode.py --out "$OUT"
wait $SKEL_PID
step 75 python3 benchmarks/micro.py "$SKEL" --out "$OUT" --parts thinker,talker \
  --thinker-batches 1,8,32 --talker-batches 1,8,32
grep -E "^(thinker|talker) +B=" "$LOG"
echo "=== [$((SECONDS - T0))s] the other GPU tests" | tee -a "$LOG"
t=$(left)
if [ "$t" -gt 10 ]; then
  timeout "$t" $PYTEST -m gpu --continue-on-collection-errors tests/ -k "not (paged or route or fused_moe)" \
    >"$OUT/tests.log" 2>&1
  echo "=== [$((SECONDS - T0))s] rc=$?" | tee -a "$LOG"
  grep -E "passed|failed" "$OUT/tests.log" | tail -2
fi
grep -E "GPU-|passed|failed" "$LOG" | cut -c1-200 | head -40
echo "[$((SECONDS - T0))s] done"
