#!/usr/bin/env bash
# k2's device call (run from .dev_k2 with ../.whl and ../.whl_hf carried): GPU tests of the changed
# kernels, the kernel benchmarks, micro.py, then the rest of the GPU tests while time is left.
# Every part is cut at a deadline so the whole stays under LIMIT seconds.
set -uo pipefail
LIMIT=${LIMIT:-232}
T0=$SECONDS
left() { echo $((LIMIT - (SECONDS - T0))); }
step() { # step SECONDS LOGFILE CMD...: run CMD with at most SECONDS (and what is left), output to LOGFILE
  local want=$1 log=$2 t; shift 2
  t=$(left); [ "$want" -lt "$t" ] && t=$want
  if [ "$t" -le 5 ]; then echo "[skip $log: no time]"; return 0; fi
  echo "[$((SECONDS - T0))s] $* (limit ${t}s)"
  timeout "$t" "$@" >"$OUT/$log" 2>&1
  echo "[$((SECONDS - T0))s] rc=$? $log"
}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  ../.whl/*.whl $(ls ../.whl_hf/*.whl 2>/dev/null) || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
SKEL=.gpu/full-skel
(python3 -m omniwalk.cli make-tiny "$SKEL" --config qwen3-omni-30b-a3b --no-weights >"$OUT/make_tiny.log" 2>&1) &
SKEL_PID=$!
PYTEST="python3 -m pytest -q -s -p no:cacheprovider"
step 45 tests_kernels.log $PYTEST -m gpu tests/test_fused_gpu.py tests/test_graphs_gpu.py -k "paged or route or fused_moe"
grep -E "GPU-|passed|failed|Error" "$OUT/tests_kernels.log" | cut -c1-220
step 55 fused_moe.log python3 benchmarks/fused_moe.py --out "$OUT"
step 40 paged_decode.log python3 benchmarks/paged_decode.py --out "$OUT"
wait $SKEL_PID
step 75 micro.log python3 benchmarks/micro.py "$SKEL" --out "$OUT/micro" --parts thinker,talker \
  --thinker-batches 1,8,32 --talker-batches 1,8,32
grep -E "^\| (1|8|32) \|" "$OUT/micro/micro.md" | head -6
step 200 tests_rest.log $PYTEST -m gpu --continue-on-collection-errors tests/ \
  -k "not (paged or route or fused_moe)"
grep -E "passed|failed" "$OUT/tests_rest.log" | tail -3
echo "[$((SECONDS - T0))s] done"
