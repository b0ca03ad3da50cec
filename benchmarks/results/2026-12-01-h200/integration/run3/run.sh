#!/usr/bin/env bash
# One-off device call (2026-12-01, fourth session): (GPU 0) where does the server's s2s request hang with
# stage streams (faulthandler dump of every process); (GPU 1) the same tree with every stage on one
# stream (lanes.py patched in a copy), swept over the four paths at B = 1 and 32.
set -uo pipefail
export PYTHONUNBUFFERED=1
. benchmarks/h200_common.sh
install_wheels || exit 1
python3 -m omniwalk.cli make-tiny .gpu/full-skel --config qwen3-omni-30b-a3b --no-weights >/dev/null
mkdir -p /tmp/sc "$OUT/diag"
cat >/tmp/sc/sitecustomize.py <<'PY'
import faulthandler, sys
faulthandler.dump_traceback_later(170, exit=False, file=sys.stderr)
PY
mkdir -p /tmp/one && cp -r benchmarks omniwalk tests pyproject.toml .gpu /tmp/one/
sed -i 's/self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None/self.stream = None/' /tmp/one/omniwalk/engine/lanes.py
grep -n "self.stream = " /tmp/one/omniwalk/engine/lanes.py
(
  cd /tmp/one && PYTHONPATH=/tmp/site:/tmp/one CUDA_VISIBLE_DEVICES=1 bash benchmarks/h200_sweep.sh --no-install \
    --out /tmp/sweep1 --port 8012 --max-seconds 390 --cell-seconds 100 --paths s2s,i2s,s2t,i2t --concurrency 1,32 \
    --min-requests 20 --requests-per-concurrency 4 --warmup-waves 1 >/tmp/sweep1.out 2>&1
  mkdir -p "$OUT/one"; cp /tmp/sweep1/results.md /tmp/sweep1/results.json /tmp/sweep1/sweep.log "$OUT/one/" 2>/dev/null
) &
SWEEP=$!
PYTHONPATH=/tmp/sc:$PYTHONPATH CUDA_VISIBLE_DEVICES=0 python3 -m omniwalk.cli serve --model .gpu/full-skel --random-weights \
  --device cuda --dtype bfloat16 --port 8011 --thinker-kv-bytes 16GiB --talker-kv-bytes 4GiB >"$OUT/diag/server.log" 2>&1 &
SERVER=$!
for i in $(seq 120); do [ "$(http_status http://127.0.0.1:8011/health)" = 200 ] && break; sleep 1; done
log "diag server up ($i s)"
timeout 140 python3 -m omniwalk.cli bench --base-url http://127.0.0.1:8011/v1 --paths s2s --concurrency 1 \
  --min-requests 3 --requests-per-concurrency 1 --warmup-waves 0 --out /tmp/d0 >"$OUT/diag/bench.log" 2>&1
log "diag bench exit $?"
curl -s http://127.0.0.1:8011/metrics | grep -E "^omniwalk_engine|^omniwalk_http" >"$OUT/diag/metrics.txt"
sleep 20
kill -TERM $SERVER; sleep 10; pkill -KILL -P $SERVER 2>/dev/null; kill -KILL $SERVER 2>/dev/null
grep -n "Thread\|File" "$OUT/diag/server.log" | head -80
wait $SWEEP
log "single-stream sweep"
grep "^|" "$OUT/one/results.md" | head -20
grep -E "CUT|skip|exit" "$OUT/one/sweep.log" | head
