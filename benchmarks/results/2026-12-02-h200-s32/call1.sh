#!/usr/bin/env bash
# Session 32, call 1: where a served s2t request's 79 ms go. ttft_probe s2t with --whole (one request
# add -> end under the profiler: per-step host ms, GPU busy, idle gaps; the Chrome trace), then served
# s2t at B = 1 (N = 30) with the server's phases.
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
install_wheels || exit 1
export PYTHONUNBUFFERED=1
SKEL=.gpu/qwen25-7b-skel
make_skeleton "$SKEL" qwen2.5-omni-7b >/tmp/skel.log 2>&1
log "ttft_probe"
timeout -k 5 150 python3 benchmarks/ttft_probe.py "$SKEL" --paths s2t --whole --out "$OUT/ttft" >"$OUT/ttft.log" 2>&1
grep -E "free:|profiled:|whole" "$OUT/ttft/ttft.md" | cut -c1-260
tail -3 "$OUT/ttft.log"
log "served"
timeout -k 5 220 bash benchmarks/h200_qwen25.sh --paths s2t --concurrency 1 --min-requests 30 --sweep-seconds 200 \
  --hf-paths none --out "$OUT/q25" >"$OUT/q25.log" 2>&1
grep -E "phases" "$OUT/q25/sweep/sweep.log"; grep -E "^\| (s2t|i2t)" "$OUT/q25/sweep/results.md"
log done
cd "$OUT" && tar czf call1.tar.gz ttft q25 *.log && rm -rf q25 *.log
