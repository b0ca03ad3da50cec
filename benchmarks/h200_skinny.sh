#!/usr/bin/env bash
# The skinny-GEMM device call (issue 15), run from a copy of the tree in .dev_<name>/ with ../.whl and
# ../.whl_hf carried (house rules): the kernel's stand-alone timings and tuned table, the engine
# micro-benchmarks with that table in place (``skinny_gemm.py --apply``), then GPU tests ($TESTS).
# Each part has its own time limit (seconds: BENCH_S, MICRO_S, TESTS_S); everything lands in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmarks/h200_common.sh
OUT=${OUT:-./h200-skinny-out}
TESTS=${TESTS:-tests/test_skinny_gemm_gpu.py tests/test_thinker_gpu.py tests/test_speech_gpu.py}
mkdir -p "$OUT"
install_wheels || exit 1
export PYTHONUNBUFFERED=1
SKEL=.gpu/full-skel
make_skeleton "$SKEL" qwen3-omni-30b-a3b >"$OUT/skel.log" 2>&1 &
SKEL_PID=$!
echo "--- skinny_gemm.py $(date +%T)"
timeout -k 5 "${BENCH_S:-75}" python3 benchmarks/skinny_gemm.py --out "$OUT" 2>&1 | tee "$OUT/bench.log" | tail -50
wait "$SKEL_PID"
echo "--- micro.py $(date +%T)"
APPLY=()
[ -f "$OUT/tuned.json" ] && APPLY=(benchmarks/skinny_gemm.py --apply "$OUT/tuned.json")
timeout -k 5 "${MICRO_S:-85}" python3 "${APPLY[@]}" benchmarks/micro.py "$SKEL" --out "$OUT/micro" \
  --parts thinker,talker --thinker-batches 1,8,32 --talker-batches 1,8,32 2>&1 | tee "$OUT/micro.log" |
  grep -E "^(thinker|talker|model built|copy|skinny)|Error|error" | cut -c1-200
echo "--- GPU tests $(date +%T)"
# shellcheck disable=SC2086
timeout -k 5 "${TESTS_S:-60}" python3 -m pytest -q -s -p no:cacheprovider -m gpu $TESTS >"$OUT/tests.log" 2>&1
grep -E "GPU-|passed|failed|Error" "$OUT/tests.log" | cut -c1-160 | tail -50
echo "--- done $(date +%T)"
