#!/usr/bin/env bash
# Serve one model and measure it with `omniwalk bench`: start `omniwalk serve`, wait for /health, run the bench's
# cells (paths x concurrency) or another client (--command), keep the server's /metrics, stop the server.
#
#   bash benchmarks/serving/sweep.sh MODEL OUTDIR [options] [-- SERVE_FLAGS...]
#   bash benchmarks/serving/sweep.sh .skel/qwen3-omni-30b-a3b out/qwen3 --concurrency 1,32 -- --quantization fp8
#   bash benchmarks/serving/sweep.sh /tmp/tiny out/cpu --cpu --paths s2t --concurrency 1 --min-requests 2
#   bash benchmarks/serving/sweep.sh .skel/qwen3-omni-30b-a3b out/balanced --concurrency 1,4,16,32 -- --moe-routing balanced
#     (random weights with a trained router's expert traffic: the figures that compare with real weights' at B > 1)
#
# MODEL is a checkpoint directory or a weightless skeleton (`omniwalk make-tiny DIR --config PRESET --no-weights`);
# the weights are random unless --real-weights is given. Options [defaults]:
#   --paths LIST                      [s2t,i2t,s2s,i2s]
#   --concurrency LIST                [1,32]
#   --min-requests N                  N = max(N, K * B) measured requests per cell [8]
#   --requests-per-concurrency K      [2]
#   --warmup-waves W                  [1]
#   --port P                          [8011]
#   --ready-timeout S                 seconds to wait for /health [600]
#   --real-weights                    read the checkpoint's weights instead of building random ones
#   --cpu                             --device cpu --dtype float32 and small KV pools (a smoke test)
#   --command CMD                     run CMD (bash -c, with BASE_URL=http://127.0.0.1:PORT/v1 and SERVER_PID, the HTTP
#                                     server's process id) instead of the bench
#   -- SERVE_FLAGS...                 more `omniwalk serve` flags, after the defaults (so they override them)
# Needs `omniwalk` importable with the [bench] extra (pip install -e '.[bench]'). Writes into OUTDIR: results.json,
# results.md and charts (`omniwalk bench`), server.log, metrics.txt, command.txt.
set -uo pipefail
[ $# -ge 2 ] || { sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2; }
MODEL=$1
OUTDIR=$2
shift 2
PATHS=s2t,i2t,s2s,i2s
CONCURRENCY=1,32
MIN_REQUESTS=8
PER_B=2
WARMUP=1
PORT=8011
READY_TIMEOUT=600
RANDOM_WEIGHTS=(--random-weights true)
DEVICE_ARGS=(--device cuda --dtype bfloat16 --thinker-kv-bytes $((16 * 2 ** 30)) --talker-kv-bytes $((4 * 2 ** 30)))
COMMAND=""
SERVE_EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --paths) PATHS=$2; shift 2 ;;
    --concurrency) CONCURRENCY=$2; shift 2 ;;
    --min-requests) MIN_REQUESTS=$2; shift 2 ;;
    --requests-per-concurrency) PER_B=$2; shift 2 ;;
    --warmup-waves) WARMUP=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --ready-timeout) READY_TIMEOUT=$2; shift 2 ;;
    --real-weights) RANDOM_WEIGHTS=(); shift ;;
    --command) COMMAND=$2; shift 2 ;;
    --cpu) DEVICE_ARGS=(--device cpu --dtype float32 --thinker-kv-bytes $((256 * 2 ** 20)) --talker-kv-bytes $((64 * 2 ** 20)))
      shift ;;
    --) shift; SERVE_EXTRA+=("$@"); break ;;
    *) echo "unknown option $1 (run without arguments for help)"; exit 2 ;;
  esac
done
mkdir -p "$OUTDIR"
BASE=http://127.0.0.1:$PORT
SERVE=(python3 -m omniwalk.cli serve --model "$MODEL" "${RANDOM_WEIGHTS[@]}" "${DEVICE_ARGS[@]}" --host 127.0.0.1
  --port "$PORT" "${SERVE_EXTRA[@]}")
BENCH=(python3 -m omniwalk.cli bench --base-url "$BASE/v1" --paths "$PATHS" --concurrency "$CONCURRENCY"
  --min-requests "$MIN_REQUESTS" --requests-per-concurrency "$PER_B" --warmup-waves "$WARMUP" --out "$OUTDIR")
[ -n "$COMMAND" ] && BENCH=(env BASE_URL="$BASE/v1" bash -c "$COMMAND")
printf '%s\n' "${SERVE[*]}" "${BENCH[*]}" >"$OUTDIR/command.txt"

echo "+ ${SERVE[*]}"
set -m  # the server in its own process group, so that stopping it stops its engine processes too
PYTHONUNBUFFERED=1 "${SERVE[@]}" >"$OUTDIR/server.log" 2>&1 &
SERVER=$!
set +m
stop() {
  if kill -0 "$SERVER" 2>/dev/null; then
    kill -TERM "$SERVER"
    for _ in $(seq 30); do kill -0 -- "-$SERVER" 2>/dev/null || return 0; sleep 1; done
    kill -KILL -- "-$SERVER" 2>/dev/null
  fi
}
trap stop EXIT

fetch() { python3 -c "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())" "$1"; }
t0=$SECONDS
until fetch "$BASE/health" >/dev/null 2>&1; do
  if ! kill -0 "$SERVER" 2>/dev/null || [ $((SECONDS - t0)) -ge "$READY_TIMEOUT" ]; then
    echo "the server did not come up; the end of $OUTDIR/server.log:"
    tail -n 40 "$OUTDIR/server.log"
    exit 1
  fi
  sleep 2
done
echo "server ready after $((SECONDS - t0)) s"

echo "+ ${BENCH[*]}"
SERVER_PID=$SERVER "${BENCH[@]}"
rc=$?
fetch "$BASE/metrics" >"$OUTDIR/metrics.txt" 2>&1
exit $rc
