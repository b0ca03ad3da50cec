# Shared helpers for scripts that run on the device machine (an H200 with a bare image) or on a CPU.
# Source it from bash (`. benchmarks/h200_common.sh`); it defines functions and sets nothing else
# except START_EPOCH and DEADLINE_T0 (when unset).
#
#   install_wheels [WHL..]   the carried .whl/*.whl (.whl_hf/*.whl too) and WHL into /tmp/site;
#                            PYTHONPATH=/tmp/site:$PWD (from ./.whl, or ../.whl from a .dev_<name>/ copy)
#   make_skeleton DIR [CFG]  a weightless skeleton in DIR from config CFG (default the packaged tiny one)
#   deadline_step SECS CMD.. CMD cut at SECS or at what is left of LIMIT s since sourcing, output to LOG
#                            (the caller sets LIMIT and LOG)
#   record_env               versions, GPU, commit (or a hash of omniwalk/ without .git)
#   start_server LOG ARGS..  `python3 -m omniwalk.cli serve ARGS` in the background, its own process group
#   wait_ready URL SECS LOG  poll URL (/health) until 200; fail on a dead server or a traceback in LOG
#   stop_server              TERM the server, then its process group after 15 s, KILL 5 s later
#   elapsed / log MSG        seconds since START_EPOCH / a timestamped line

: "${START_EPOCH:=$(date +%s.%N)}"
SERVER_PID=""

elapsed() { python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$START_EPOCH"; }
log() { printf '[%7ss] %s\n' "$(elapsed)" "$*"; }

install_wheels() {
  # The device's recipe (device/README.md): one version of each wheel, no index, no deps.
  local t0=$SECONDS
  # Carried folders: .whl (server and media wheels) and, for the HF-parity tests, .whl_hf
  # (transformers + huggingface_hub); each call carries what it needs within 64 MiB.
  # Run from the checkout's root they are ./.whl; from a copy of the tree in .dev_<name>/, ../.whl.
  local root=. wheels
  [ -n "$(ls .whl/*.whl .whl_hf/*.whl 2>/dev/null)" ] || root=..
  wheels=$(ls $root/.whl/*.whl $root/.whl_hf/*.whl 2>/dev/null)
  if [ -z "$wheels" ]; then
    log "install_wheels: no .whl/*.whl here or in .. (carry .whl)"
    return 1
  fi
  if [ $# -gt 0 ]; then wheels=$(printf '%s\n' "$wheels" "$@"); fi
  # shellcheck disable=SC2086
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels ||
    return 1
  export PYTHONPATH=/tmp/site:$PWD
  log "installed $(echo "$wheels" | wc -l) wheels into /tmp/site in $((SECONDS - t0))s"
}

make_skeleton() {
  # Config + tokenizer only: the weights are built on the device (--random-weights true). Kept when
  # DIR already holds one.
  local dir=$1 config=${2:-}
  [ -f "$dir/config.json" ] && return 0
  local cmd=(python3 -m omniwalk.cli make-tiny "$dir" --no-weights)
  [ -n "$config" ] && cmd+=(--config "$config")
  log "making skeleton $dir from ${config:-the packaged tiny config}"
  echo "+ ${cmd[*]}"
  "${cmd[@]}" || { log "make-tiny failed"; return 1; }
}

: "${DEADLINE_T0:=$SECONDS}"
deadline_step() {
  # A part of a device call with a deadline for the whole: at most SECS, and never past LIMIT
  # seconds after this file was sourced; skipped when 5 s or less are left. Appends to $LOG.
  local want=$1 t
  shift
  t=$((LIMIT - (SECONDS - DEADLINE_T0)))
  [ "$want" -lt "$t" ] && t=$want
  if [ "$t" -le 5 ]; then echo "[skip: no time] $*" | tee -a "$LOG"; return 0; fi
  echo "=== [$((SECONDS - DEADLINE_T0))s] $* (limit ${t}s)" | tee -a "$LOG"
  timeout "$t" "$@" >>"$LOG" 2>&1
  echo "=== [$((SECONDS - DEADLINE_T0))s] rc=$?" | tee -a "$LOG"
}

record_env() {
  echo "--- environment"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)   host: $(hostname)   cpus: $(nproc)"
  echo "pwd: $PWD   PYTHONPATH: ${PYTHONPATH:-}"
  if git rev-parse HEAD >/dev/null 2>&1; then
    echo "git: $(git rev-parse HEAD) ($(git status --short 2>/dev/null | wc -l) changed/untracked paths)"
    git status --short 2>/dev/null | head -40
  else
    echo "git: no repository here"
  fi
  # Identifies the code without .git: compare with the same command on the checkout.
  echo "omniwalk tree sha256: $(find omniwalk -name '*.py' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)" \
    "(find omniwalk -name '*.py' | LC_ALL=C sort | xargs sha256sum | sha256sum)"
  python3 - <<'EOF' 2>&1
import importlib, sys
print("python", sys.version.split()[0], sys.executable)
for name in ("torch", "triton", "numpy", "fastapi", "starlette", "pydantic", "uvicorn", "zmq", "av", "soundfile",
             "soxr", "transformers", "httpx", "matplotlib"):
    try:
        m = importlib.import_module(name)
        print(f"  {name} {getattr(m, '__version__', '?')}  {getattr(m, '__file__', '')}")
    except Exception as e:  # noqa: BLE001
        print(f"  {name} MISSING: {type(e).__name__}: {e}")
try:
    import torch
    if torch.cuda.is_available():
        print("  cuda", torch.version.cuda, torch.cuda.get_device_name(0), torch.cuda.device_count(), "device(s)")
except Exception as e:  # noqa: BLE001
    print("  torch.cuda check failed:", e)
EOF
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi
  else
    echo "nvidia-smi: not found"
  fi
  echo "---"
}

start_server() {
  # Job control gives the background job its own process group (not a new session), so
  # stop_server can end the server and its engine process together.
  local logfile=$1
  shift
  echo "+ python3 -m omniwalk.cli serve $*"
  set -m
  PYTHONUNBUFFERED=1 python3 -m omniwalk.cli serve "$@" >"$logfile" 2>&1 &
  SERVER_PID=$!
  set +m
  log "server pid $SERVER_PID, log $logfile"
}

server_alive() { [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; }

http_status() {
  python3 - "$1" <<'EOF' 2>/dev/null
import sys, urllib.error, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=5).status)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception:
    print(0)
EOF
}

wait_ready() {
  local url=$1 limit=$2 logfile=$3 t0=$SECONDS code last=-1
  while :; do
    code=$(http_status "$url")
    if [ "$code" = 200 ]; then
      log "server ready after $((SECONDS - t0))s"
      return 0
    fi
    if ! server_alive; then
      log "server exited while starting; last lines of $logfile:"
      tail -n 40 "$logfile"
      return 1
    fi
    if grep -q "Traceback (most recent call last)" "$logfile" 2>/dev/null; then
      sleep 3  # let the traceback finish printing
      log "a traceback in $logfile while starting:"
      tail -n 60 "$logfile"
      return 1
    fi
    if [ $((SECONDS - t0)) -ge "$limit" ]; then
      log "server not ready after ${limit}s (health $code); last lines of $logfile:"
      tail -n 40 "$logfile"
      return 1
    fi
    if [ $(((SECONDS - t0) / 15)) -ne "$last" ]; then  # progress every 15 s
      last=$(((SECONDS - t0) / 15))
      log "waiting for $url (health $code): $(tail -n 1 "$logfile" 2>/dev/null | cut -c1-160)"
    fi
    sleep 1
  done
}

stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  if server_alive; then
    # The server first (uvicorn shuts down, the lifespan tells the engine process to stop), then
    # whatever is left of its process group.
    log "stopping server (pid $SERVER_PID)"
    kill -TERM "$SERVER_PID" 2>/dev/null
    local i
    for i in $(seq 15); do
      kill -0 -- "-$SERVER_PID" 2>/dev/null || break
      sleep 1
    done
    if kill -0 -- "-$SERVER_PID" 2>/dev/null; then
      log "process group $SERVER_PID still up after 15 s: TERM, then KILL after 5 s"
      kill -TERM -- "-$SERVER_PID" 2>/dev/null
      sleep 5
      kill -KILL -- "-$SERVER_PID" 2>/dev/null
    fi
  fi
  wait "$SERVER_PID" 2>/dev/null
  log "server exit status $?"
  SERVER_PID=""
}
