#!/usr/bin/env bash
# Session 31, call 5: served i2t (N = 20) and i2s (N = 10) at B = 1 on main after the vision merge, to
# check call 4's i2t figure with more requests.
set -uo pipefail
cd "$(dirname "$0")/../../.."
bash benchmarks/h200_qwen25.sh --paths i2t,i2s --concurrency 1 --min-requests 20 --sweep-seconds 230 --hf-paths none \
  --out "$OUT/q25" >"$OUT/q25.log" 2>&1
grep -E "phases" "$OUT/q25/sweep/sweep.log"; grep -E "^\| (i2t|i2s)" "$OUT/q25/sweep/results.md"
cd "$OUT" && tar czf call5.tar.gz q25 q25.log && rm -rf q25 q25.log
