#!/usr/bin/env bash
# talk's device call 2 (~215 s), on a fresh machine: (1) the cold start: `omniwalk serve` of the full-size
# skeleton with random weights while Triton's cache is empty, its start-up log (phases) and the Triton
# kernels it compiled; beside it, on other cores and their own Triton cache, the HF-parity GPU tests (thinker,
# talker step) and the engine's graphs-on-vs-off tests; (2) micro.py thinker/talker B = 1, 32 on this
# branch (new/) and on main bd7fa27 (base/), the GPU otherwise idle; (3) benchmarks/parity_sources.py.
# Run from .dev_talk/new: bash ../call2.sh
set -uo pipefail
LIMIT=${LIMIT:-212}
. ../common.sh
install ../../.whl_hf/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
. benchmarks/h200_common.sh
CACHE=$HOME/.triton/cache
echo "triton cache before: $(ls "$CACHE" 2>/dev/null | wc -l) entries; GPU processes: $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)" | tee -a "$LOG"
SKEL=.gpu/full-skel
step 30 python3 -m omniwalk.cli make-tiny "$SKEL" --config qwen3-omni-30b-a3b --no-weights
PYTEST="python3 -m pytest -q -s -p no:cacheprovider -m gpu"
( export TRITON_CACHE_DIR=/tmp/triton_tests
  timeout 40 $PYTEST tests/test_thinker_gpu.py tests/test_speech_gpu.py -k "thinker or talker_step"
  echo "=== parity rc=$?"
  timeout 32 $PYTEST tests/test_graphs_gpu.py -k "not triton_paged_decode"
  echo "=== graphs rc=$?" ) >"$OUT/tests.log" 2>&1 &
TESTS=$!
t_serve=$SECONDS
start_server "$OUT/serve_cold.log" --model "$SKEL" --random-weights true --device cuda --dtype bfloat16 \
  --host 127.0.0.1 --port 8011 --thinker-kv-bytes $((16 * 2 ** 30)) --talker-kv-bytes $((4 * 2 ** 30)) >>"$LOG"
wait_ready http://127.0.0.1:8011/health 100 "$OUT/serve_cold.log" | tee -a "$LOG"
echo "cold start: ready after $((SECONDS - t_serve)) s (wall, from the serve command)" | tee -a "$LOG"
stop_server >>"$LOG" 2>&1
python3 - "$CACHE" <<'PY' | tee "$OUT/triton_cache.txt"
import collections, json, pathlib, sys
names = collections.Counter()
for f in pathlib.Path(sys.argv[1]).glob("*/*.json"):
    if f.name.startswith("__grp__"):
        continue
    try:
        names[json.loads(f.read_text()).get("name", "?")] += 1
    except Exception:
        pass
print(f"triton kernels compiled by the cold start: {sum(names.values())}")
for name, n in names.most_common():
    print(f"  {n:3d} {name}")
PY
wait $TESTS
MICRO="$SKEL --parts thinker,talker --thinker-batches 1,32 --talker-batches 1,32"
mkdir -p "$OUT/micro_new" "$OUT/micro_base"
step 45 python3 benchmarks/micro.py $MICRO --out "$OUT/micro_new"
(cd ../base && PYTHONPATH=/tmp/site:$PWD step 48 python3 benchmarks/micro.py ../new/$MICRO --out "$OUT/micro_base")
for f in new base; do echo "--- micro $f"; grep -E "^\| (1|32) \|" "$OUT/micro_$f/micro.md" 2>/dev/null | cut -d'|' -f1-4; done | tee -a "$LOG"
step 40 python3 benchmarks/parity_sources.py
grep -E "GPU-PARITY thinker|speech [1-6]|passed|failed|rc=|^(FAILED|ERROR)" "$OUT/tests.log" | cut -c1-220 | tail -20
grep -E "GPU-PARITY thinker|^---" "$LOG" | cut -c1-220 | tail -12
echo "[$((SECONDS - T0))s] done"
