#!/usr/bin/env bash
# Lead's device call 1 (session 27, main as merged at session 26's end): every GPU test (`pytest -m gpu
# tests/`, HF-parity ones included: carry .whl and .whl_hf), then the Qwen3-Omni sweep's B = 1 and 4 cells
# of the four seed paths (N = max(50, 10 B)). Run from the repo root: bash <this file>.
set -uo pipefail
START_EPOCH=$(date +%s.%N)
. benchmarks/h200_common.sh
install_wheels || exit 1
export PYTHONUNBUFFERED=1
record_env >"$OUT/env.txt" 2>&1
log "GPU tests"
timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE --continue-on-collection-errors tests/ \
  >"$OUT/gpu_tests.log" 2>&1
log "GPU tests rc=$?: $(tail -1 "$OUT/gpu_tests.log")"
bash benchmarks/h200_sweep.sh --no-install --out "$OUT/sweep_b1_4" --paths s2t,i2t,s2s,i2s --concurrency 1,4 \
  --order concurrency --max-seconds "${SWEEP_SECONDS:-290}"
log "done"
