#!/usr/bin/env bash
# Session 34 call 5 (issue 18): after the one-kernel dequantised copy for FP8 prefill-sized products
# (fp8.dequantize_triton): its GPU test, then call 2's FP8 sweep again at B = 32 (the four paths).
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
LIMIT=400
LOG=$OUT/log.txt
install_wheels || exit 1
export PYTHONUNBUFFERED=1
deadline_step 60 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_fp8_gpu.py -k "dequantize or skinny"
bash benchmarks/h200_sweep.sh --no-install --paths s2t,i2t,s2s,i2s --concurrency 32 --min-requests 8 \
  --requests-per-concurrency 2 --max-seconds 300 --out "$OUT/sweep" -- --quantization fp8 >"$OUT/sweep.log" 2>&1
rm -f "$OUT/sweep/charts.tar" "$OUT/sweep/gpu_dmon.txt"
grep -E "passed|failed" "$LOG" | tail -3
grep -E "^\| (s2t|i2t|s2s|i2s) " "$OUT/sweep/results.md"
