#!/usr/bin/env bash
# Full-size benchmark sweep on one GPU: serve Qwen3-Omni-30B-A3B with random bf16 weights and run
# `omniwalk bench` against it, one cell (path x concurrency) at a time, under an overall time guard.
# Writes results even when the guard cuts the sweep short.
#
# Usage (from the repo root; on the device with `carry: [".whl", ".gpu"]`):
#   bash benchmarks/h200_sweep.sh [options] [-- SERVE_FLAGS...]
#   bash benchmarks/h200_sweep.sh --max-seconds 540 --min-requests 8 --requests-per-concurrency 2 \
#       -- --cuda-graph-max-batch 64
#   bash benchmarks/h200_sweep.sh --cpu --paths s2t --concurrency 1,2 --min-requests 2    # CPU smoke test
#
# Options (defaults in brackets):
#   --skel DIR | --model DIR   checkpoint or skeleton dir [.gpu/full-skel]; a missing one is made with
#                              `omniwalk make-tiny DIR --config SKEL_CONFIG --no-weights`
#   --skel-config FILE         config for that [qwen3-omni-30b-a3b, the packaged preset]; "" = packaged tiny
#   --paths LIST               [s2t,i2t,s2s,i2s]
#   --concurrency LIST         [1,4,16,32]
#   --min-requests N           bench: N = max(min_requests, K * B) measured requests per cell [50]
#   --requests-per-concurrency K   [10]
#   --warmup-waves W           [1]
#   --bench-arg ARG            one more `omniwalk bench` argument (repeat for several)
#   --order path|concurrency   cell order: all B of a path first, or all paths of a B first [path]
#   --group cell|path|all      one `omniwalk bench` run per cell, per path, or one for all [cell]; each run
#                              costs ~3-5 s of process start + charts, but a run cut by the guard loses
#                              all its cells (bench writes at its end), so "cell" keeps the most
#   --max-seconds S            overall guard from the script's start; cells are cut (timeout) and later
#                              ones skipped so results, charts and logs are written before it [540]
#   --cell-seconds S           cap on one bench run [0 = none beyond the guard]
#   --ready-timeout S          wait this long for /health [300]
#   --port P                   [8011]
#   --thinker-kv-bytes B / --talker-kv-bytes B   [16 GiB / 4 GiB; --cpu: 256 MiB / 64 MiB]
#   --out DIR                  [$OUT, else ./h200-sweep-out]
#   --no-install               don't install .whl/*.whl (packages already importable)
#   --cpu                      CPU smoke mode: --no-install, --device cpu --dtype float32, small KV pools,
#                              skeleton from the packaged tiny config in /tmp/omniwalk-tiny-skel
#   -- SERVE_FLAGS...          passed to `omniwalk serve` after the defaults (so they override them);
#                              any unrecognised argument is passed through the same way
#
# What comes back in --out (at most 8 files, device limit): sweep.log (this script's output: commands,
# environment, nvidia-smi, per-cell bench output and timings), server.log, results.json (the
# `omniwalk bench` schema: {"path@B": {"summary", "requests"}}), results.md (table + sweep notes),
# charts.tar (the bench's PNG charts), metrics.txt (the server's /metrics after the sweep),
# gpu_dmon.txt (nvidia-smi dmon every 5 s). results.json / results.md are rewritten after every
# cell, so a run killed from outside still leaves the finished cells.
#
# Why one `omniwalk bench` per cell (--group cell): bench writes its results only at the end of all
# its cells, so a sweep cut by the time guard would leave nothing; per-cell runs are merged with the
# bench's own report.write (same files, same schema; results.md also lists runs cut or skipped).
#
# Time budget (device: 600 s per command). Fixed: wheel install ~10-20 s, server start (imports,
# random weights ~2 s, CUDA graph capture) ~30-90 s, teardown + charts <= 30 s, and ~4 s per bench
# run (process start with torch import, its charts, the merge): ~1 min for 16 cells. A cell takes about
# (warmup_waves + N/B) waves x one request's E2E latency at that B. Measured with CUDA graphs
# (benchmarks/results/2026-11-30-h200/sweep, E2E p50 at B = 1/4/16/32): s2t 0.35/0.64/1.45/3.7 s,
# i2t 2.3/3.1/6.7/11.9 s, s2s 1.8/2.4/5.3/9.4 s, i2s 3.5/5.5/10.4/22.6 s. So:
#   default N = max(50, 10B): s2t ~1.5 min, i2t ~5.5, s2s ~4.5, i2s ~10: ~22 min in all; run it as
#     --paths s2t,i2t | --paths s2s | --paths i2s --concurrency 1,4 | --paths i2s --concurrency 16,32
#   --min-requests 10 --requests-per-concurrency 2 (what 2026-11-30 ran): ~7.5 min for all 16 cells;
#     the guard cuts what does not fit (cut cells are listed in results.md and sweep.log).
set -uo pipefail
cd "$(dirname "$0")/.."
START_EPOCH=$(date +%s.%N)
. benchmarks/h200_common.sh

SKEL=.gpu/full-skel
SKEL_CONFIG=qwen3-omni-30b-a3b
PATHS=s2t,i2t,s2s,i2s
CONCURRENCY=1,4,16,32
MIN_REQUESTS=50
PER_B=10
WARMUP=1
ORDER=path
GROUP=cell
MAX_SECONDS=540
CELL_SECONDS=0
READY_TIMEOUT=300
PORT=8011
THINKER_KV=$((16 * 2 ** 30))
TALKER_KV=$((4 * 2 ** 30))
OUTDIR=${OUT:-$PWD/h200-sweep-out}
INSTALL=1
CPU=0
SKEL_SET=0
KV_SET=0
SERVE_EXTRA=()
BENCH_EXTRA=()
ARGV=("$@")

while [ $# -gt 0 ]; do
  case "$1" in
    --skel | --model) SKEL=$2; SKEL_SET=1; shift 2 ;;
    --skel-config) SKEL_CONFIG=$2; shift 2 ;;
    --paths) PATHS=$2; shift 2 ;;
    --concurrency) CONCURRENCY=$2; shift 2 ;;
    --min-requests) MIN_REQUESTS=$2; shift 2 ;;
    --requests-per-concurrency) PER_B=$2; shift 2 ;;
    --warmup-waves) WARMUP=$2; shift 2 ;;
    --bench-arg) BENCH_EXTRA+=("$2"); shift 2 ;;
    --order) ORDER=$2; shift 2 ;;
    --group) GROUP=$2; shift 2 ;;
    --max-seconds) MAX_SECONDS=$2; shift 2 ;;
    --cell-seconds) CELL_SECONDS=$2; shift 2 ;;
    --ready-timeout) READY_TIMEOUT=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --thinker-kv-bytes) THINKER_KV=$2; KV_SET=1; shift 2 ;;
    --talker-kv-bytes) TALKER_KV=$2; KV_SET=1; shift 2 ;;
    --out) OUTDIR=$2; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    --cpu) CPU=1; INSTALL=0; shift ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    --) shift; SERVE_EXTRA+=("$@"); break ;;
    *) SERVE_EXTRA+=("$1"); shift ;;
  esac
done

DEVICE_ARGS=(--device cuda --dtype bfloat16)
if [ "$CPU" = 1 ]; then
  DEVICE_ARGS=(--device cpu --dtype float32)
  if [ "$SKEL_SET" = 0 ]; then
    SKEL=/tmp/omniwalk-tiny-skel
    SKEL_CONFIG=""
  fi
  if [ "$KV_SET" = 0 ]; then
    THINKER_KV=$((256 * 2 ** 20))
    TALKER_KV=$((64 * 2 ** 20))
  fi
fi

mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/h200_sweep.XXXXXX")
exec > >(tee -a "$OUTDIR/sweep.log") 2>&1
TEE_PID=$!
echo "+ bash benchmarks/h200_sweep.sh ${ARGV[*]}"
log "out $OUTDIR, scratch $WORK, guard ${MAX_SECONDS}s"

SWEEP_NOTE=""
DMON_PID=""
BENCH_PID=""
FINAL_DONE=0
finish() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$BENCH_PID" ]; then
    kill -TERM "$BENCH_PID" 2>/dev/null  # timeout passes it on to the bench
    wait "$BENCH_PID" 2>/dev/null
  fi
  if server_alive; then
    python3 - "http://127.0.0.1:$PORT/metrics" >"$OUTDIR/metrics.txt" 2>&1 <<'EOF'
import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())
EOF
  fi
  stop_server
  if [ -n "$DMON_PID" ]; then
    kill "$DMON_PID" 2>/dev/null
    wait "$DMON_PID" 2>/dev/null
  fi
  if [ "$FINAL_DONE" = 0 ] && [ -d "$WORK/cells" ]; then merge charts; fi
  if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi --query-gpu=memory.used,memory.total --format=csv; fi
  log "done (exit $rc); files in $OUTDIR: $(ls "$OUTDIR" | tr '\n' ' ')"
  rm -rf "$WORK"
  exec >&- 2>&-  # let tee write the last lines before the command returns
  for _ in $(seq 50); do kill -0 "$TEE_PID" 2>/dev/null || break; sleep 0.1; done
  exit "$rc"
}
trap finish EXIT
trap 'log "interrupted"; exit 130' INT TERM

if [ "$INSTALL" = 1 ]; then
  install_wheels || { log "wheel install failed"; exit 1; }
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
record_env


# Merge every finished cell into $OUTDIR/results.json and results.md (and, with "charts", the
# bench's PNG charts into $OUTDIR/charts.tar), through omniwalk.bench.report.write.
merge() {
  python3 - "$WORK" "$OUTDIR" "${1:-}" "$SWEEP_NOTE" <<'EOF'
import dataclasses, json, shutil, sys, tarfile
from pathlib import Path

work, out, charts, note = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "charts", sys.argv[4]
from omniwalk.bench import report
from omniwalk.bench.loadgen import RequestRecord

names = {f.name for f in dataclasses.fields(RequestRecord)}
cells, raw = {}, {}
for f in sorted((work / "cells").glob("*/results.json")):
    for key, cell in json.loads(f.read_text()).items():
        path, b = key.rsplit("@", 1)
        cells[(path, int(b))] = cell["summary"]
        raw[(path, int(b))] = [RequestRecord(**{k: v for k, v in r.items() if k in names}) for r in cell["requests"]]
merged = work / "merged"
shutil.rmtree(merged, ignore_errors=True)
merged.mkdir()
if not charts:
    report._charts = lambda *_: []  # charts only once, at the end (matplotlib is slow to import)
report.write(merged, cells, raw)
shutil.copy(merged / "results.json", out / "results.json")
(out / "results.md").write_text((merged / "results.md").read_text() + "\n" + note + "\n")
pngs = sorted(merged.glob("*.png"))
if pngs:
    with tarfile.open(out / "charts.tar", "w") as tar:
        for p in pngs:
            tar.add(p, arcname=p.name)
print(f"merged {len(cells)} cell(s) into {out}/results.json, results.md" + (f", charts.tar ({len(pngs)} PNGs)" if pngs else ""))
EOF
}

# The server's own account of a cell's time to first output (its /metrics histograms, differenced from the
# previous cell's scrape, warm-up requests included): mean ms per request of the phases inbox (HTTP ->
# engine process), add (the engine's processing), engine (added -> first output), outbox (-> the server),
# media decode (the server's pool), and the server-side TTFT. Printed into sweep.log.
phases() {
  python3 - "http://127.0.0.1:$PORT/metrics" "$WORK/phases.json" "$1" <<'EOF2' 2>&1
import json, re, sys, urllib.request
from pathlib import Path
text = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
keep = re.compile(r'^(omniwalk_(first_output_phase|media_decode|time_to_first_token)_seconds_(sum|count))(\{[^}]*\})? (\S+)$')
now = {m[1] + (m[4] or ""): float(m[5]) for m in map(keep.match, text.splitlines()) if m}
prev_file = Path(sys.argv[2])
prev = json.loads(prev_file.read_text()) if prev_file.exists() else {}
prev_file.write_text(json.dumps(now))
d = {k: v - prev.get(k, 0.0) for k, v in now.items()}
def mean(name, labels=""):
    n = d.get(f"omniwalk_{name}_seconds_count{labels}", 0.0)
    return f"{1e3 * d[f'omniwalk_{name}_seconds_sum{labels}'] / n:.1f}" if n else "-"
def label(key, value):
    return "{" + key + '="' + value + '"}'
parts = [f"{ph} {mean('first_output_phase', label('phase', ph))}" for ph in ("inbox", "add", "engine", "outbox")]
parts += [f"media {k} {mean('media_decode', label('kind', k))}" for k in ("audio", "image", "video")]
count = d.get("omniwalk_time_to_first_token_seconds_count", 0.0)
print(f"phases {sys.argv[3]} (server, mean ms over {count:.0f} requests): " + ", ".join(parts)
      + f"; server TTFT text {mean('time_to_first_token')}")
EOF2
}

make_skeleton "$SKEL" "$SKEL_CONFIG" || exit 1

SERVE_ARGS=(--model "$SKEL" --random-weights true "${DEVICE_ARGS[@]}" --host 127.0.0.1 --port "$PORT"
  --thinker-kv-bytes "$THINKER_KV" --talker-kv-bytes "$TALKER_KV" "${SERVE_EXTRA[@]}")
start_server "$OUTDIR/server.log" "${SERVE_ARGS[@]}"
if ! wait_ready "http://127.0.0.1:$PORT/health" "$READY_TIMEOUT" "$OUTDIR/server.log"; then
  log "server did not come up"
  exit 1
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu,clocks.sm --format=csv
  nvidia-smi dmon -s pucm -d 5 -o T >"$OUTDIR/gpu_dmon.txt" 2>&1 &
  DMON_PID=$!
fi

IFS=, read -r -a PATH_LIST <<<"$PATHS"
IFS=, read -r -a B_LIST <<<"$CONCURRENCY"
UNITS=()  # "paths|concurrency": one `omniwalk bench` run each
case "$GROUP" in
  all) UNITS+=("$PATHS|$CONCURRENCY") ;;
  path) for p in "${PATH_LIST[@]}"; do UNITS+=("$p|$CONCURRENCY"); done ;;
  cell)
    if [ "$ORDER" = concurrency ]; then
      for b in "${B_LIST[@]}"; do for p in "${PATH_LIST[@]}"; do UNITS+=("$p|$b"); done; done
    else
      for p in "${PATH_LIST[@]}"; do for b in "${B_LIST[@]}"; do UNITS+=("$p|$b"); done; done
    fi
    ;;
  *) log "--group must be cell, path or all"; exit 1 ;;
esac

RESERVE=30    # seconds kept for /metrics, stopping the server, charts and the tar
MIN_CELL=15   # don't start a cell with less than this left
STATUS=()
SWEEP_NOTE="sweep: paths $PATHS, concurrency $CONCURRENCY, N = max($MIN_REQUESTS, $PER_B*B), warmup waves $WARMUP; serve ${SERVE_ARGS[*]}"
rc_all=0
n=0
for unit in "${UNITS[@]}"; do
  p=${unit%%|*}
  b=${unit##*|}
  name="paths $p B=$b"
  n=$((n + 1))
  left=$((MAX_SECONDS - SECONDS - RESERVE))
  if [ "$CELL_SECONDS" -gt 0 ] && [ "$CELL_SECONDS" -lt "$left" ]; then left=$CELL_SECONDS; fi
  if [ "$left" -lt "$MIN_CELL" ]; then
    STATUS+=("$name: skipped (guard: ${left}s left)")
    log "skip $name: ${left}s left under the guard"
    rc_all=2
    continue
  fi
  if ! server_alive; then
    STATUS+=("$name: skipped (server died)")
    log "skip $name: the server is gone"
    rc_all=2
    continue
  fi
  cmd=(python3 -m omniwalk.cli bench --base-url "http://127.0.0.1:$PORT/v1" --paths "$p" --concurrency "$b"
    --min-requests "$MIN_REQUESTS" --requests-per-concurrency "$PER_B" --warmup-waves "$WARMUP"
    --out "$WORK/cells/$n" "${BENCH_EXTRA[@]}")
  echo "+ timeout -k 5 $left ${cmd[*]}"
  t0=$SECONDS
  PYTHONUNBUFFERED=1 timeout -k 5 "$left" "${cmd[@]}" &
  BENCH_PID=$!  # in the background so a TERM to this script is handled at once (wait is interruptible)
  wait "$BENCH_PID"
  rc=$?
  BENCH_PID=""
  dt=$((SECONDS - t0))
  case $rc in
    0) STATUS+=("$name: ok in ${dt}s") ;;
    124 | 137) STATUS+=("$name: CUT by the guard after ${dt}s (its finished cells are in sweep.log only)"); rc_all=2 ;;
    *) STATUS+=("$name: FAILED (exit $rc) after ${dt}s"); rc_all=2 ;;
  esac
  log "$name: exit $rc, ${dt}s"
  server_alive && phases "$p@$b"
  SWEEP_NOTE="sweep: paths $PATHS, concurrency $CONCURRENCY, N = max($MIN_REQUESTS, $PER_B*B), warmup waves $WARMUP; serve ${SERVE_ARGS[*]}
runs: $(printf '%s; ' "${STATUS[@]}")"
  [ $rc = 0 ] && merge
done

SWEEP_NOTE="sweep: paths $PATHS, concurrency $CONCURRENCY, N = max($MIN_REQUESTS, $PER_B*B), warmup waves $WARMUP; serve ${SERVE_ARGS[*]}
runs: $(printf '%s; ' "${STATUS[@]}")"
echo "--- bench runs"
printf '  %s\n' "${STATUS[@]}"
if [ -d "$WORK/cells" ]; then
  merge charts
  FINAL_DONE=1
  echo "--- results.md"
  cat "$OUTDIR/results.md"
else
  log "no cell finished"
fi
exit $rc_all
