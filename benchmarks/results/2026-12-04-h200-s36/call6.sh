#!/usr/bin/env bash
# Session 36 call 6 (issue 18): the FP8 skinny GEMM's 16-row tiles (decode at B = 9-16) for the chained dot:
# fp8.py --parts tune --tune-rows 16 (the skinny shapes only at 16 rows; TUNED's bf16 tiles are among the candidates).
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
LIMIT=200
LOG=$OUT/log.txt
install_wheels || exit 1
export PYTHONUNBUFFERED=1
SKEL=.gpu/full-skel
make_skeleton "$SKEL" qwen3-omni-30b-a3b >/tmp/make_tiny.log 2>&1
deadline_step 150 python3 benchmarks/fp8.py "$SKEL" --parts tune --tune-rows 16 --out /tmp/tune
cp /tmp/tune/tuned.json "$OUT/tuned.json"
grep -E "^tune" "$LOG"
