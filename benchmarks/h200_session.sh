#!/usr/bin/env bash
# One device call that re-checks and re-measures everything GPU-side (about 8 minutes on an H200):
# the GPU tests, the engine micro-benchmarks, and a sweep of the four paths at B = 1 and 32.
#
#   bash benchmarks/h200_session.sh            # device tool: carry [".whl", ".gpu"], timeout 600
#
# Needs .gpu/qwen3_omni_30b_a3b_config.json (the real config; the full-size skeleton is made from
# it when missing) and the wheels in .whl/ (benchmarks/h200_common.sh). Writes 7 files under $OUT
# (the device returns at most 8): tests.log, micro/micro.{md,json}, sweep/results.{md,json},
# sweep/sweep.log, sweep/metrics.txt. Each part has its own time limit, so a slow part cannot
# starve the others of their results.
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmarks/h200_common.sh
OUT=${OUT:-./h200-session-out}
mkdir -p "$OUT/micro" "$OUT/sweep"
install_wheels || exit 1
mkdir -p ../shared/reference && cp .gpu/qwen3_omni_30b_a3b_config.json ../shared/reference/
SKEL=.gpu/full-skel
[ -f "$SKEL/config.json" ] ||
  python3 -m omniwalk.cli make-tiny "$SKEL" --config .gpu/qwen3_omni_30b_a3b_config.json --no-weights

log "GPU tests"
timeout 150 python3 -m pytest -q -s -p no:cacheprovider tests/test_graphs_gpu.py tests/test_sync_gpu.py \
  tests/test_thinker_gpu.py tests/test_speech_gpu.py 2>&1 | grep -v "^cuda graphs" >"$OUT/tests.log"
grep -E "GPU-|SYNC-|passed|failed" "$OUT/tests.log"

log "micro-benchmarks"
timeout 120 python3 benchmarks/micro.py "$SKEL" --out "$OUT/micro" --thinker-batches 1,8,32,64 \
  --talker-batches 1,8,32 --vocoder-batches 1,8 --encoder-batches 1,32 2>&1 | grep -E "^(thinker|talker)|Error"

log "sweep"
SWEEP=$(mktemp -d)
bash benchmarks/h200_sweep.sh --no-install --out "$SWEEP" --max-seconds 280 --concurrency 1,32 \
  --min-requests 10 --requests-per-concurrency 2 | grep -A10 "^| path" | tail -10
cp "$SWEEP"/results.json "$SWEEP"/results.md "$SWEEP"/sweep.log "$SWEEP"/metrics.txt "$OUT/sweep/" 2>/dev/null
log "done"
