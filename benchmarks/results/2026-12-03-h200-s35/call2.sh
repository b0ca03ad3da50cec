#!/usr/bin/env bash
# Session 35 call 2 (issue 18): the FP8 GPU tests (all of test_fp8_gpu.py); the grouped GEMMs' tiles tuned
# apart (gate_up, then down; 16 rows at 32 tokens, 64 rows at 1,024: fp8.py --parts tune --tune-rows 32), the
# winners written into grouped_fp8.py's tables on this machine; then served sweeps, FP8 then bf16, back to back
# (four paths at B = 1 and 32, N = max(8, 2 B)).
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
LIMIT=580
LOG=$OUT/log.txt
install_wheels || exit 1
export PYTHONUNBUFFERED=1
SKEL=.gpu/full-skel
make_skeleton "$SKEL" qwen3-omni-30b-a3b >/tmp/make_tiny.log 2>&1 &
SKEL_PID=$!
deadline_step 110 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_fp8_gpu.py
wait $SKEL_PID
deadline_step 90 python3 benchmarks/fp8.py "$SKEL" --parts tune --tune-rows 32 --out /tmp/tune
cp /tmp/tune/tuned.json "$OUT/tuned.json"
python3 - <<'PY' | tee -a "$LOG"
import json, re
tuned = json.load(open("/tmp/tune/tuned.json"))["tuned"]
path = "omniwalk/layers/grouped_fp8.py"
src = open(path).read()
for name, key in (("GATE_UP_BLOCKS", "grouped_gate_up"), ("DOWN_BLOCKS", "grouped_down")):
    table = {tile: tuple(tuned[f"{key}{tile}"]) for tile in (16, 64)}
    src = re.sub(rf"^{name} = .*$", f"{name} = {table}", src, count=1, flags=re.M)
    print(f"{name} = {table}")
open(path, "w").write(src)
PY
for q in fp8 bf16; do
  flags=(); [ $q = fp8 ] && flags=(--quantization fp8)
  timeout 200 bash benchmarks/h200_sweep.sh --no-install --paths s2t,i2t,s2s,i2s --concurrency 1,32 --min-requests 8 \
    --requests-per-concurrency 2 --max-seconds 190 --out /tmp/sweep_$q -- "${flags[@]}" >/tmp/sweep_$q.log 2>&1
  cp /tmp/sweep_$q/results.md "$OUT/${q}_results.md"; cp /tmp/sweep_$q/results.json "$OUT/${q}_results.json"
  echo "--- $q" | tee -a "$LOG"; grep -E "^\| (s2t|i2t|s2s|i2s) " "$OUT/${q}_results.md" | tee -a "$LOG"
  grep -iE "fp8|quantis|memory|weights" /tmp/sweep_$q/server.log | head -6 | tee -a "$LOG"
done
tail -4 /tmp/sweep_fp8.log /tmp/sweep_bf16.log >>"$LOG"
grep -E "passed|failed|GPU-FP8 grouped|^tune MoE" "$LOG" | cut -c1-400 | tail -20
