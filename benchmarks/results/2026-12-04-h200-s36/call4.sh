#!/usr/bin/env bash
# Session 36 call 4 (issue 18): bf16 against FP8 on this tree, interleaved (h200_ab_micro.sh's DIR@OPTIONS), 30
# timed steps a run: micro talker frame at B = 1, 32 and thinker at B = 1 (2 rounds each).
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
LIMIT=400
LOG=$OUT/log.txt
install_wheels || exit 1
export PYTHONUNBUFFERED=1
OUT=$OUT/talker deadline_step 220 bash benchmarks/h200_ab_micro.sh --trees ". .@quantization=fp8" --part talker \
  --batches 1,32 --rounds 2 --no-install --run-seconds 70 -- --steps 30
OUT=$OUT/thinker deadline_step 160 bash benchmarks/h200_ab_micro.sh --trees ". .@quantization=fp8" --part thinker \
  --batches 1 --rounds 2 --no-install --run-seconds 60 -- --steps 30
rm -f "$OUT"/*/runs.tar.gz
cat "$OUT/talker/summary.md" "$OUT/thinker/summary.md" 2>/dev/null
