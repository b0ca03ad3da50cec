#!/usr/bin/env bash
# Session 34 call 1: sort_pairs (one kernel for the grouped MoE paths' pair sort) on the H200.
# GPU tests of the touched kernels, then micro.py A/B at B = 32 (the grouped path) against .dev_prev
# (8b0b627, before the change): thinker bf16 and FP8; 2 rounds each.
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
LIMIT=570
LOG=$OUT/log.txt
install_wheels || exit 1
export PYTHONUNBUFFERED=1
deadline_step 100 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_fused_gpu.py tests/test_fp8_gpu.py -k "sort or moe or grouped or route"
for spec in "thinker:" "thinker:--option quantization=fp8"; do
  part=${spec%%:*}; extra=${spec#*:}; tag=$part${extra:+_fp8}
  mkdir -p "$OUT/$tag"
  OUT=$OUT/$tag bash benchmarks/h200_ab_micro.sh --no-install --trees ".dev_prev ." --part "$part" --batches 32 \
    --rounds 2 --run-seconds 75 -- --option cuda_graph_max_batch=32 --option encoder_graph_max_tokens=0 --option prefill_graph_max_tokens=0 $extra 2>&1 | tail -8 | tee -a "$LOG"
done
grep -E "passed|failed|error|GPU-FUSED MoE|sort" "$LOG" | cut -c1-200 | tail -30
