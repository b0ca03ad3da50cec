#!/usr/bin/env bash
# The fused-kernels session's device call (issue 15), run from a copy of the tree in .dev_kernels/
# with ../.whl and ../.whl_hf carried (house rules): stand-alone MoE timings, then the engine
# micro-benchmarks with kernel counts, then the GPU tests. Each part has its own time limit;
# everything lands in $OUT (log.txt, fused_moe.json, micro.md/json, tests.log).
#
#   bash benchmarks/h200_kernels.sh [--no-moe] [--no-micro] [--no-tests]
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmarks/h200_common.sh
OUT=${OUT:-./h200-kernels-out}
MOE=1 MICRO=1 TESTS=1
for a in "$@"; do
  case "$a" in --no-moe) MOE=0 ;; --no-micro) MICRO=0 ;; --no-tests) TESTS=0 ;; *) echo "unknown $a"; exit 2 ;; esac
done
mkdir -p "$OUT"
# (.whl_extra: cffi for soundfile, httpx2 and its deps for huggingface_hub 2.4, which this device image lacked)
# shellcheck disable=SC2046
install_wheels $(ls .whl_extra/*.whl 2>/dev/null) || exit 1
export PYTHONUNBUFFERED=1
SKEL=.gpu/full-skel
make_skeleton "$SKEL" qwen3-omni-30b-a3b >/dev/null
if [ "$MOE" = 1 ]; then
  echo "--- fused_moe.py"
  timeout 120 python3 benchmarks/fused_moe.py --out "$OUT"
fi
if [ "$MICRO" = 1 ]; then
  echo "--- micro.py"
  timeout 200 python3 benchmarks/micro.py "$SKEL" --out "$OUT" --parts thinker,talker,vocoder \
    --thinker-batches 1,8,32,64 --talker-batches 1,8,32 --vocoder-batches 1,8 2>&1 |
    grep -E "^(thinker|talker|vocoder|model built|copy)|Error|error"
fi
if [ "$TESTS" = 1 ]; then
  echo "--- GPU tests"
  timeout 220 python3 -m pytest -q -s -p no:cacheprovider -m gpu --continue-on-collection-errors tests/ 2>&1 |
    grep -v "^cuda graphs" >"$OUT/tests.log"
  grep -E "GPU-|SYNC-|passed|failed|Error" "$OUT/tests.log" | cut -c1-200
fi
