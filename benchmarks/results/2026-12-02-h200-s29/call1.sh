#!/usr/bin/env bash
# Session 29, device call 1 (main as committed + this script): every GPU test (`pytest -m gpu tests/`,
# HF-parity ones included: carry .whl and .whl_hf), the talker frame at B = 1 (micro.py, the served options),
# then benchmarks/h200_fp8.sh (bf16 vs FP8 decode steps at B = 1/32, FP8 projections, accuracy).
# Run from the repo root: bash <this file>. Files back: env.txt, gpu_tests.log, talker_b1.md, fp8.tar.gz.
set -uo pipefail
START_EPOCH=$(date +%s.%N)
. benchmarks/h200_common.sh
install_wheels || exit 1
export PYTHONUNBUFFERED=1
record_env >"$OUT/env.txt" 2>&1
make_skeleton .gpu/full-skel qwen3-omni-30b-a3b >/tmp/make_tiny.log 2>&1 &
log "GPU tests"
timeout 230 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE --continue-on-collection-errors tests/ \
  >"$OUT/gpu_tests.log" 2>&1
log "GPU tests rc=$?: $(tail -1 "$OUT/gpu_tests.log")"
wait
mkdir -p /tmp/talker
timeout 70 python3 benchmarks/micro.py .gpu/full-skel --parts talker --talker-batches 1 --out /tmp/talker \
  >/tmp/talker/log.txt 2>&1
log "talker micro rc=$?"
cp /tmp/talker/micro.md "$OUT/talker_b1.md" 2>/dev/null || tail -30 /tmp/talker/log.txt
grep -E "^\| 1 \|" "$OUT/talker_b1.md" 2>/dev/null
mkdir -p /tmp/fp8
LIMIT=$((560 - ${SECONDS})) OUT=/tmp/fp8 bash benchmarks/h200_fp8.sh --no-install
tar -czf "$OUT/fp8.tar.gz" -C /tmp fp8
log "done"
