#!/usr/bin/env bash
# Session 34 call 4: the same sweep as call 2 in bf16 (no --quantization), same machine
# the four paths at B = 1 and 32, N = max(8, 2 B).
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
install_wheels || exit 1
export PYTHONUNBUFFERED=1
bash benchmarks/h200_sweep.sh --no-install --paths s2t,i2t,s2s,i2s --concurrency 1,32 --min-requests 8 \
  --requests-per-concurrency 2 --max-seconds 480 --out "$OUT" -- >"$OUT/call4.log" 2>&1
grep -E "^\| (s2t|i2t|s2s|i2s) " "$OUT/results.md"
grep -iE "fp8|quantis|memory|weights" "$OUT/server.log" | head -12
