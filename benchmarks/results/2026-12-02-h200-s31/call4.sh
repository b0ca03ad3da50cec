#!/usr/bin/env bash
# Session 31, call 4: after the vision encoder's merge (q/k/v one GEMM; gate/up one GEMM padded 3,420 -> 3,456,
# silu·mul one kernel): ttft_probe s2t, i2t; the skinny GEMM's wider M = 1 search on the thinker's four
# projections; served s2t, i2t at B = 1 (N = 10); GPU tests of the vision merge and Qwen2.5-Omni's graphs.
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
install_wheels || exit 1
export PYTHONUNBUFFERED=1
SKEL=.gpu/qwen25-7b-skel
make_skeleton "$SKEL" qwen2.5-omni-7b >/tmp/skel.log 2>&1
log "GPU tests"
timeout -k 5 90 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_qwen2_5_omni_vision_merge_gpu.py \
  tests/test_qwen2_5_omni_graphs_gpu.py >"$OUT/tests.log" 2>&1
grep -E "GPU-Q25-VISION|passed|failed" "$OUT/tests.log" | tail -4
log "ttft_probe"
timeout -k 5 120 python3 benchmarks/ttft_probe.py "$SKEL" --paths s2t,i2t --out "$OUT/ttft" >"$OUT/ttft.log" 2>&1
grep -E "free:|profiled:|^\| 1 " "$OUT/ttft/ttft.md" | cut -c1-260
log "skinny"
timeout -k 5 100 python3 benchmarks/skinny_gemm.py --shapes qwen2.5-omni-7b --rows 1 \
  --names "thinker qkv,thinker o,thinker gate_up,thinker down" --out "$OUT/skinny" >"$OUT/skinny.log" 2>&1
grep -E "M=" "$OUT/skinny.log"
log "served"
timeout -k 5 200 bash benchmarks/h200_qwen25.sh --paths s2t,i2t --concurrency 1 --min-requests 10 --sweep-seconds 190 \
  --hf-paths none --out "$OUT/q25" >"$OUT/q25.log" 2>&1
grep -E "phases" "$OUT/q25/sweep/sweep.log"; grep -E "^\| (s2t|i2t)" "$OUT/q25/sweep/results.md"
log done
cd "$OUT" && tar czf call4.tar.gz ttft skinny q25 *.log && rm -rf ttft skinny q25 *.log
