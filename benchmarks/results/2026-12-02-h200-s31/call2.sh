#!/usr/bin/env bash
# Session 31, call 2: Qwen2.5-Omni-7B served, the four paths at B = 1 and 32 on main with the 7B's tuned
# GEMV tiles (HF's B = 1 figures: session 27, same GPU kind); the sweep prints the server's first-output
# phases per cell.
set -uo pipefail
cd "$(dirname "$0")/../../.."
bash benchmarks/h200_qwen25.sh --paths s2t,i2t,s2s,i2s --concurrency 1,32 --sweep-seconds 530 --hf-paths none \
  --out "$OUT/q25" >"$OUT/q25.log" 2>&1
grep -E "phases|exit" "$OUT/q25/sweep/sweep.log"
cat "$OUT/q25/sweep/results.md" | head -20
cd "$OUT" && tar czf q25.tar.gz q25 q25.log && rm -rf q25 q25.log
