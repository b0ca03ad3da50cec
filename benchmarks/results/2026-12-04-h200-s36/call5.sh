#!/usr/bin/env bash
# Session 36 call 5 (issue 18): the thinker's accuracy with the dequantised model beside it (fp8.py --parts
# accuracy, 2 prompts, 64 teacher-forced steps): FP8 vs bf16, the bf16 model of the FP8 weights vs bf16, and FP8
# vs that model.
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
LIMIT=250
LOG=$OUT/log.txt
install_wheels || exit 1
export PYTHONUNBUFFERED=1
SKEL=.gpu/full-skel
make_skeleton "$SKEL" qwen3-omni-30b-a3b >/tmp/make_tiny.log 2>&1
deadline_step 200 python3 benchmarks/fp8.py "$SKEL" --parts accuracy --prompts 2 --out "$OUT/acc"
rm -f "$OUT/acc/fp8.json"
cat "$OUT/acc/fp8.md"
