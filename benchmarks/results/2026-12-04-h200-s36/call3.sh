#!/usr/bin/env bash
# Session 36 call 3 (issue 18), this tree with call 2's 32-row FP8 tiles in the source: the FP8 GPU tests (all of
# test_fp8_gpu.py) and the skinny GEMM's GPU tests; served sweeps FP8 then bf16, back to back, as session 35's
# call 2 ran them (four paths at B = 1 and 32, N = max(8, 2 B)).
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
LIMIT=560
LOG=$OUT/log.txt
install_wheels || exit 1
export PYTHONUNBUFFERED=1
deadline_step 100 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_fp8_gpu.py tests/test_skinny_gemm_gpu.py
for q in fp8 bf16; do
  flags=(); [ $q = fp8 ] && flags=(--quantization fp8)
  timeout 215 bash benchmarks/h200_sweep.sh --no-install --paths s2t,i2t,s2s,i2s --concurrency 1,32 --min-requests 8 \
    --requests-per-concurrency 2 --max-seconds 205 --out /tmp/sweep_$q -- "${flags[@]}" >/tmp/sweep_$q.log 2>&1
  cp /tmp/sweep_$q/results.md "$OUT/${q}_results.md"; cp /tmp/sweep_$q/results.json "$OUT/${q}_results.json"
  echo "--- $q" | tee -a "$LOG"; grep -E "^\| (s2t|i2t|s2s|i2s) " "$OUT/${q}_results.md" | tee -a "$LOG"
  grep -iE "weights|memory" /tmp/sweep_$q/server.log | head -3 | tee -a "$LOG"
done
tail -4 /tmp/sweep_fp8.log /tmp/sweep_bf16.log >>"$LOG"
grep -E "passed|failed|Error" "$LOG" | cut -c1-300 | tail -10
