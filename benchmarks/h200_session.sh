#!/usr/bin/env bash
# One device call that re-checks and re-measures GPU-side: the GPU tests and the engine
# micro-benchmarks ("checks", ~3 minutes on GPU 0), and a sweep (`h200_sweep.sh` with the arguments
# given after --), on the last GPU at the same time when the machine has two, else after the checks.
#
#   bash benchmarks/h200_session.sh                         # checks + a B = 1/32 sweep of the four paths
#   bash benchmarks/h200_session.sh -- --paths i2s --min-requests 30      # checks + that sweep
#   bash benchmarks/h200_session.sh --no-checks -- --paths s2t,s2s        # the sweep alone
#   bash benchmarks/h200_session.sh --no-micro --profile s2s@1,s2s@32 -- --paths s2s
#             # after the tests: profile_walk.py on those cells (profile/), then the sweep
#   bash benchmarks/h200_session.sh --no-micro --also "--paths i2t,s2s" -- --paths s2t
#             # GPU 1: the --also sweep (sweep2/); GPU 0: the GPU tests, then the other sweep (sweep/)
#
# Device tool: carry [".whl", ".whl_hf"] (.whl_hf only for the HF-parity GPU tests), timeout 600 (kind nvidia-h200-x2 runs checks and sweep side
# by side). The full-size skeleton (.gpu/full-skel) is made from the packaged
# preset config when missing; needs the wheels in .whl/ (benchmarks/h200_common.sh). Writes under $OUT
# (the device returns at most 8 files): tests.log, micro/micro.{md,json}, profile/profile.{md,json}
# (with --profile), and per sweep
# results.{md,json} and sweep.log (with the server's /metrics at its end). Each part has its own
# time limit.
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmarks/h200_common.sh
OUT=${OUT:-./h200-session-out}
CHECKS=1
MICRO=1
ALSO=""
PROFILE=""
SWEEP_ARGS=(--concurrency 1,32 --min-requests 10 --requests-per-concurrency 2)
while [ $# -gt 0 ]; do
  case "$1" in
    --no-checks) CHECKS=0; shift ;;
    --no-micro) MICRO=0; shift ;;
    --also) ALSO=$2; shift 2 ;;
    --profile) PROFILE=$2; shift 2 ;;
    --) shift; [ $# -gt 0 ] && SWEEP_ARGS=("$@"); break ;;
    *) echo "unknown option $1 (see the header)"; exit 2 ;;
  esac
done
mkdir -p "$OUT/micro" "$OUT/sweep"
install_wheels || exit 1
SKEL=.gpu/full-skel
make_skeleton "$SKEL" qwen3-omni-30b-a3b || exit 1
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)

sweep() {  # on GPU $1, guard $2 seconds, into $OUT/$3 (default sweep), then the arguments
  local gpu=$1 guard=$2 into=${3:-sweep} dir
  shift 3
  dir=$(mktemp -d)
  mkdir -p "$OUT/$into"
  CUDA_VISIBLE_DEVICES=$gpu bash benchmarks/h200_sweep.sh --no-install --out "$dir" --max-seconds "$guard" \
    --port $((8011 + gpu)) "$@" >"$dir/stdout.txt" 2>&1
  grep -A40 "^| path" "$dir/results.md" | grep "^|" | tail -n +3
  { echo "--- /metrics after the sweep"; cat "$dir/metrics.txt"; } >>"$dir/sweep.log" 2>/dev/null
  cp "$dir"/results.json "$dir"/results.md "$dir"/sweep.log "$OUT/$into/" 2>/dev/null
}

checks() {
  log "GPU tests"
  # (modules needing packages the device lacks, e.g. openai, fail to import: their tests are CPU ones)
  CUDA_VISIBLE_DEVICES=0 timeout 330 python3 -m pytest -q -s -p no:cacheprovider -m gpu \
    --continue-on-collection-errors tests/ 2>&1 | grep -v "^cuda graphs" >"$OUT/tests.log"
  grep -E "GPU-|SYNC-|passed|failed|Error" "$OUT/tests.log" | cut -c1-220
  if [ -n "$PROFILE" ]; then
    log "profile_walk $PROFILE"
    CUDA_VISIBLE_DEVICES=0 timeout 300 python3 benchmarks/profile_walk.py "$SKEL" --cells "$PROFILE" \
      --out "$OUT/profile" 2>&1 | grep -E "profiled in|Error|error" | cut -c1-220
  fi
  [ "$MICRO" = 1 ] || return 0
  log "micro-benchmarks"
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/micro.py "$SKEL" --out "$OUT/micro" \
    --thinker-batches 1,8,32,64 --talker-batches 1,8,32 --vocoder-batches 1,8,32 --encoder-batches 1,8,32 2>&1 |
    grep -E "^(thinker|talker|vocoder|audio|vision)|Error|cuda graphs: .* \(1/"
}

if [ "$GPUS" -ge 2 ] && [ -n "$ALSO" ]; then
  log "GPU 1: sweep $ALSO; GPU 0: checks, then sweep ${SWEEP_ARGS[*]}"
  read -r -a ALSO_ARGS <<<"$ALSO"
  sweep 1 570 sweep2 "${ALSO_ARGS[@]}" >"$OUT/sweep_table.txt" &
  SWEEP_PID=$!
  [ "$CHECKS" = 1 ] && checks
  log "sweep on GPU 0"
  sweep 0 $((570 - SECONDS)) sweep "${SWEEP_ARGS[@]}"
  wait "$SWEEP_PID"
  cat "$OUT/sweep_table.txt" && rm -f "$OUT/sweep_table.txt"
elif [ "$GPUS" -ge 2 ] && [ "$CHECKS" = 1 ]; then
  log "sweep on GPU 1 beside the checks on GPU 0: ${SWEEP_ARGS[*]}"
  sweep 1 570 sweep "${SWEEP_ARGS[@]}" >"$OUT/sweep_table.txt" &
  SWEEP_PID=$!
  checks
  wait "$SWEEP_PID"
  log "sweep"
  cat "$OUT/sweep_table.txt" && rm -f "$OUT/sweep_table.txt"
else
  [ "$CHECKS" = 1 ] && checks
  log "sweep: ${SWEEP_ARGS[*]}"
  sweep 0 $((570 - SECONDS)) sweep "${SWEEP_ARGS[@]}"
fi
log "done"
