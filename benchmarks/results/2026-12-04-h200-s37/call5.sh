#!/usr/bin/env bash
# Session 37 call 5 (issue 21): GPU tests of the GQA varlen change (test_attention.py) and the graph paths; the
# served Qwen2.5-Omni-7B sweep of the four seed paths at B = 1 (N = 20) and 32 (N = 64) on this tree, and HF
# transformers' s2t generate at B = 1 in the same call (the ratio's two sides on one machine).
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
LIMIT=585
LOG=$OUT/log.txt
install_wheels || exit 1
export PYTHONUNBUFFERED=1
deadline_step 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention.py \
  tests/test_qwen2_5_omni_graphs_gpu.py tests/test_encoder_graphs_gpu.py
deadline_step 430 bash benchmarks/h200_qwen25.sh --paths s2t,i2t,s2s,i2s --concurrency 1,32 --min-requests 20 \
  --sweep-seconds 340 --hf-paths s2t --hf-seconds 70 --out "$OUT/q25"
(cd "$OUT/q25" && tar czf sweep.tar.gz sweep && rm -rf sweep/server.log sweep/charts.tar)
grep -E "passed|failed" "$LOG" | tail -3
grep -E "^phases|^\| (s2t|i2t|s2s|i2s) " "$OUT/q25/sweep/sweep.log" | cut -c1-300
cat "$OUT/q25/ratio.md"
