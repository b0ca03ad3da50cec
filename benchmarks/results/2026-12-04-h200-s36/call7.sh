#!/usr/bin/env bash
# Session 36 call 7 (issue 18): the 16-row FP8 tiles in a step: micro talker at B = 16, FP8, this tree against
# .dev_prev = 2a0b00f (16 rows on TUNED's bf16 tiles), one run each, 20 timed steps.
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
LIMIT=170
LOG=$OUT/log.txt
install_wheels || exit 1
export PYTHONUNBUFFERED=1
OUT=$OUT/talker deadline_step 165 bash benchmarks/h200_ab_micro.sh --trees ".@quantization=fp8 .dev_prev@quantization=fp8" \
  --part talker --batches 16 --rounds 1 --no-install --run-seconds 80 -- --steps 20
rm -f "$OUT"/*/runs.tar.gz
cat "$OUT/talker/summary.md"
