#!/usr/bin/env bash
# pdl's one device call (run from .dev_pdl with ../.whl and ../.whl_hf carried), every part cut at a
# deadline so the whole stays under LIMIT seconds: the GPU tests of the PDL kernels and of graphs on
# vs off, micro.py with PDL, micro.py with PDL switched off in-process (the same merge's baseline,
# pdl.launch patched; not a switch of the package), then the rest of the GPU suite while time is left.
set -uo pipefail
LIMIT=${LIMIT:-172}
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
PYTEST="python3 -m pytest -q -s -p no:cacheprovider -m gpu"
MINE="tests/test_skinny_gemm_gpu.py tests/test_fused_gpu.py tests/test_graphs_gpu.py tests/test_engine_async_gpu.py"
step 60 $PYTEST $MINE
python3 -c "import torch; from omniwalk.layers import pdl; print('pdl enabled:', pdl.enabled(torch.device('cuda')))" \
  2>&1 | tee -a "$LOG"
wait $SKEL_PID
MICRO="$SKEL --parts thinker,talker --thinker-batches 1,8,32 --talker-batches 1,8,32"
mkdir -p "$OUT/on" "$OUT/off"
step 50 python3 benchmarks/micro.py $MICRO --out "$OUT/on"
step 50 python3 -c "
import runpy, sys
from omniwalk.layers import pdl
pdl.launch = lambda device: {'USE_PDL': False}
sys.argv = ['benchmarks/micro.py'] + sys.argv[1:]
sys.path.insert(0, 'benchmarks')
runpy.run_path('benchmarks/micro.py', run_name='__main__')
" $MICRO --out "$OUT/off"
for f in on off; do echo "--- $f"; grep -E "^\| (1|8|32) \|" "$OUT/$f/micro.md" 2>/dev/null | cut -d'|' -f1-4; done | tee -a "$LOG"
t=$(left)
if [ "$t" -gt 10 ]; then
  echo "=== [$((SECONDS - T0))s] the other GPU tests (limit ${t}s)" | tee -a "$LOG"
  ignores=""
  for f in $MINE; do ignores="$ignores --ignore=$f"; done
  timeout "$t" $PYTEST --continue-on-collection-errors tests/ $ignores 2>&1 | grep -v "^cuda graphs" >"$OUT/tests.log"
  echo "=== [$((SECONDS - T0))s] rc=${PIPESTATUS[0]}" | tee -a "$LOG"
fi
grep -E "passed|failed|error" "$LOG" "$OUT/tests.log" 2>/dev/null | cut -c1-200 | tail -12
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" 2>/dev/null | cut -c1-200 | head -10
echo "[$((SECONDS - T0))s] done"
