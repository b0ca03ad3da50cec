#!/usr/bin/env bash
# Session 34 call 6 (issue 18): TUNED_FP8's 32-row entries in the source, A/B against .dev_prev (the
# commit before them): FP8 GPU tests of the skinny GEMM, then micro.py talker at B = 32 in FP8, 2 rounds.
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
LIMIT=330
LOG=$OUT/log.txt
install_wheels || exit 1
export PYTHONUNBUFFERED=1
deadline_step 45 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_fp8_gpu.py -k "skinny"
OUT=$OUT/talker bash benchmarks/h200_ab_micro.sh --no-install --trees ".dev_prev ." --part talker --batches 32 \
  --rounds 2 --run-seconds 60 -- --option cuda_graph_max_batch=32 --option encoder_graph_max_tokens=0 \
  --option prefill_graph_max_tokens=0 --option quantization=fp8 2>&1 | tail -6 | tee -a "$LOG"
grep -E "passed|failed" "$LOG" | tail -2
