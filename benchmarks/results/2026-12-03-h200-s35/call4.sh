#!/usr/bin/env bash
# Session 35 call 4 (issue 18): bf16 against FP8 on one tree, interleaved (h200_ab_micro.sh's DIR@OPTIONS):
# micro thinker at B = 1, 32 (2 rounds), talker at B = 1, 32 (1 round).
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
LIMIT=285
LOG=$OUT/log.txt
install_wheels || exit 1
export PYTHONUNBUFFERED=1
OUT=$OUT/thinker deadline_step 170 bash benchmarks/h200_ab_micro.sh --trees ". .@quantization=fp8" --part thinker \
  --batches 1,32 --rounds 2 --no-install --run-seconds 70
OUT=$OUT/talker deadline_step 110 bash benchmarks/h200_ab_micro.sh --trees ". .@quantization=fp8" --part talker \
  --batches 1,32 --rounds 1 --no-install --run-seconds 70
cat "$OUT/thinker/summary.md" "$OUT/talker/summary.md" 2>/dev/null
