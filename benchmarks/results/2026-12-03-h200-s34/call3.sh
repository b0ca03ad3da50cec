#!/usr/bin/env bash
# Session 34 call 3 (issue 18): FP8 launch configurations at M = 32 (benchmarks/fp8.py tune --tune-rows 32:
# the skinny GEMM per projection, the grouped GEMM's 16-row tile), then micro.py thinker + talker at B = 32
# in FP8 with the source's tables and with the tuned ones (--apply), bf16 beside them; same machine.
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
LIMIT=520
LOG=$OUT/log.txt
install_wheels || exit 1
export PYTHONUNBUFFERED=1
SKEL=.gpu/full-skel
make_skeleton "$SKEL" qwen3-omni-30b-a3b >/tmp/make_tiny.log 2>&1
deadline_step 230 python3 benchmarks/fp8.py "$SKEL" --parts tune --tune-rows 32 --out "$OUT/tune"
MICRO="$SKEL --parts thinker,talker --thinker-batches 32 --talker-batches 32 --option encoder_graph_max_tokens=0 --option prefill_graph_max_tokens=0 --option cuda_graph_max_batch=32"
for run in fp8 fp8_tuned; do
  mkdir -p "$OUT/$run"
  case $run in
    fp8) deadline_step 75 python3 benchmarks/micro.py $MICRO --option quantization=fp8 --out "$OUT/$run" ;;
    fp8_tuned) [ -f "$OUT/tune/tuned.json" ] && deadline_step 75 python3 benchmarks/fp8.py --apply "$OUT/tune/tuned.json" \
      benchmarks/micro.py $MICRO --option quantization=fp8 --out "$OUT/$run" ;;
    bf16) deadline_step 70 python3 benchmarks/micro.py $MICRO --out "$OUT/$run" ;;
  esac
  echo "--- $run" | tee -a "$LOG"; grep -E "^\| 32 \|" "$OUT/$run/micro.md" 2>/dev/null | cut -d'|' -f1-4 | tee -a "$LOG"
done
grep -E "^tune|applied" "$LOG" | cut -c1-200
