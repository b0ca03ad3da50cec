#!/usr/bin/env bash
# Session 37 call 1 (issue 21): where one s2t request's time goes on main (4d1a44c): ttft_probe s2t --whole
# (free/clocked TTFT per stage, the profiled first text, add -> end, one request whole under the profiler with
# its Chrome trace); the 7B's projections at prefill row counts (cuBLAS, graphs of 20).
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
LIMIT=400
LOG=$OUT/log.txt
install_wheels || exit 1
export PYTHONUNBUFFERED=1
SKEL=.gpu/qwen25-7b-skel
make_skeleton "$SKEL" qwen2.5-omni-7b >/tmp/skel.log 2>&1
deadline_step 60 python3 benchmarks/results/2026-12-04-h200-s37/gemm_rows.py
deadline_step 240 python3 benchmarks/ttft_probe.py "$SKEL" --paths s2t --whole --out "$OUT/ttft"
cat "$OUT/ttft/ttft.md" | cut -c1-400 | head -80
grep -E "^rows|^[0-9]+ \|" "$LOG"
