#!/usr/bin/env bash
# Realtime latency on the device: serve the full-size model (random bf16 weights) and run
# `benchmarks/realtime_latency.py` (first audio after the end of user speech, server VAD included).
#
#   bash benchmarks/h200_realtime.sh [--no-install] [--sessions 1,16] [--turns 5] [--out DIR]
#
# Device tool: carry [".whl", ".whl_hf"] (the openai client needs httpx2 from .whl_hf); writes DIR/realtime_latency.json, DIR/realtime.log, DIR/server.log (tail).
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmarks/h200_common.sh
OUT_DIR=${OUT:-./h200-realtime-out}/realtime
INSTALL=1
SESSIONS=1,16
TURNS=5
PORT=8021
while [ $# -gt 0 ]; do
  case "$1" in
    --no-install) INSTALL=0; shift ;;
    --sessions) SESSIONS=$2; shift 2 ;;
    --turns) TURNS=$2; shift 2 ;;
    --out) OUT_DIR=$2; shift 2 ;;
    *) echo "unknown option $1 (see the header)"; exit 2 ;;
  esac
done
mkdir -p "$OUT_DIR"
[ "$INSTALL" = 1 ] && { install_wheels || exit 1; }
SKEL=.gpu/full-skel
make_skeleton "$SKEL" qwen3-omni-30b-a3b || exit 1
LOG=$(mktemp)
start_server "$LOG" --model "$SKEL" --random-weights true --device cuda --dtype bfloat16 --host 127.0.0.1 \
  --port "$PORT" --thinker-kv-bytes $((16 * 2 ** 30)) --talker-kv-bytes $((4 * 2 ** 30))
if wait_ready "http://127.0.0.1:$PORT/health" 240 "$LOG"; then
  log "realtime_latency --sessions $SESSIONS --turns $TURNS"
  timeout 300 python3 benchmarks/realtime_latency.py --base-url "http://127.0.0.1:$PORT/v1" --sessions "$SESSIONS" \
    --turns "$TURNS" --out "$OUT_DIR/realtime_latency.json" 2>&1 | tee "$OUT_DIR/realtime.log" | tail -n 20
fi
stop_server
tail -n 60 "$LOG" >"$OUT_DIR/server.log"
