#!/usr/bin/env bash
# Session 32, call 5: A/B of the FP8 GEMV's x load (session 29's 3ba7032: x in the weight tile's shape) on one
# machine: X = the tree with it (.dev_prev, HEAD a8dc00b+), R = this tree with it reverted. benchmarks/fp8.py
# projections (µs per call, bf16 vs FP8) and micro.py thinker B = 1 in FP8, each tree, X R X R order for the
# projections.
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
install_wheels || exit 1
export PYTHONUNBUFFERED=1
SKEL=$PWD/.gpu/full-skel
make_skeleton "$SKEL" qwen3-omni-30b-a3b >/tmp/skel.log 2>&1
proj() {  # NAME TREE
  log "projections $1"
  (cd "$2" && PYTHONPATH=/tmp/site:$PWD timeout -k 5 60 python3 benchmarks/fp8.py "$SKEL" --parts projections \
    --out "$OUT/$1" >"$OUT/$1.log" 2>&1)
  grep -E "\| 1 \|" "$OUT/$1/fp8.md" | cut -d'|' -f2-5
}
micro() {  # NAME TREE
  log "micro $1"
  (cd "$2" && PYTHONPATH=/tmp/site:$PWD timeout -k 5 70 python3 benchmarks/micro.py "$SKEL" --parts thinker \
    --thinker-batches 1 --option encoder_graph_max_tokens=0 --option prefill_graph_max_tokens=0 \
    --option cuda_graph_max_batch=32 --option quantization=fp8 --out "$OUT/m$1" >"$OUT/m$1.log" 2>&1)
  grep -E "^\| 1 \|" "$OUT/m$1/micro.md" | cut -d'|' -f1-4
}
proj X1 .dev_prev; proj R1 .; proj X2 .dev_prev; proj R2 .
micro X .dev_prev; micro R .
log done
cd "$OUT" && tar czf call5.tar.gz X1 R1 X2 R2 mX mR *.log && rm -rf X1 R1 X2 R2 mX mR *.log
