#!/usr/bin/env bash
# The 2xH200 measurements of issue 20: the 16 cells (s2t, i2t, s2s, i2s x B = 1, 4, 16, 32) of one
# multi-GPU configuration, full size, random bf16 weights, through `h200_sweep.sh` (its options after
# the mode). One configuration per device call (600 s): --min-requests 10 --requests-per-concurrency 2
# fits the 16 cells in ~8 minutes (2026-11-30 on one GPU).
#
#   bash benchmarks/h200_multi_gpu.sh tests          # the 2-GPU tests (placement, tensor parallel), ~2 min
#   bash benchmarks/h200_multi_gpu.sh one            # 1 GPU: the same commit's baseline
#   bash benchmarks/h200_multi_gpu.sh placement      # thinker on GPU 0 | talker + vocoder on GPU 1
#   bash benchmarks/h200_multi_gpu.sh dp2            # 2 data-parallel replicas, one per GPU
#   bash benchmarks/h200_multi_gpu.sh tp2            # thinker split over 2 ranks (NCCL), the rest on GPU 0
#   ... MODE --no-install                            # the wheels are installed already (PYTHONPATH set)
#
# Device tool: kind nvidia-h200-x2, carry [".whl"] (add ".whl_hf" for `tests`), timeout 600; results under
# $OUT/<mode>/ (results.{md,json}, sweep.log with the server's /metrics, server.log).
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:?mode: tests | one | placement | dp2 | tp2}
shift
OUT=${OUT:-./h200-multi-gpu-out}
case "$MODE" in
  tests)
    . benchmarks/h200_common.sh
    [ "${1:-}" = --no-install ] || install_wheels || exit 1
    mkdir -p "$OUT/tests"
    python3 -m pytest -q tests/test_placement_gpu.py tests/test_tensor_parallel_gpu.py 2>&1 | tee "$OUT/tests/tests.log"
    exit "${PIPESTATUS[0]}"
    ;;
  one) FLAGS=() ;;
  placement) FLAGS=(--placement thinker=cuda:0,talker=cuda:1,vocoder=cuda:1) ;;
  dp2) FLAGS=(--data-parallel 2) ;;
  tp2) FLAGS=(--tensor-parallel 2) ;;
  *) echo "unknown mode $MODE (see the header)"; exit 2 ;;
esac
exec bash benchmarks/h200_sweep.sh --out "$OUT/$MODE" --max-seconds 570 --min-requests 10 \
  --requests-per-concurrency 2 --ready-timeout 240 "$@" -- "${FLAGS[@]}"
