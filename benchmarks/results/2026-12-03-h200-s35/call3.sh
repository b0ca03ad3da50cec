#!/usr/bin/env bash
# Session 35 call 3 (issue 18): the grouped GEMMs' tiles tuned again (gate_up's columns, hence the down GEMM's
# activation group, now a choice: 64-column tiles fit 128 rows in 8 warps), the winners written into
# grouped_fp8.py on this machine; the FP8 GPU tests and the fused MoE's GPU tests on them; micro.py
# thinker/talker at B = 1, 32 in bf16 then FP8 (same options as benchmarks/h200_fp8.sh); the thinker accuracy
# (1 prompt, 64 teacher-forced steps).
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
LIMIT=470
LOG=$OUT/log.txt
install_wheels || exit 1
export PYTHONUNBUFFERED=1
SKEL=.gpu/full-skel
make_skeleton "$SKEL" qwen3-omni-30b-a3b >/tmp/make_tiny.log 2>&1
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
deadline_step 100 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_fp8_gpu.py tests/test_fused_gpu.py -k "fp8 or moe or sort or quantiser"
MICRO="$SKEL --parts thinker,talker --thinker-batches 1,32 --talker-batches 1,32 --option encoder_graph_max_tokens=0 --option prefill_graph_max_tokens=0 --option cuda_graph_max_batch=32"
mkdir -p "$OUT/bf16" "$OUT/fp8"
deadline_step 75 python3 benchmarks/micro.py $MICRO --out "$OUT/bf16"
deadline_step 75 python3 benchmarks/micro.py $MICRO --option quantization=fp8 --out "$OUT/fp8"
for f in bf16 fp8; do echo "--- $f"; grep -E "^\| (1|32) \|" "$OUT/$f/micro.md" 2>/dev/null | cut -d'|' -f1-4; grep -o '"max_memory[^,]*' "$OUT/$f/micro.json" 2>/dev/null; done | tee -a "$LOG"
deadline_step 60 python3 benchmarks/fp8.py "$SKEL" --parts accuracy --prompts 1 --out "$OUT/acc"
rm -f "$OUT/acc/fp8.json" "$OUT/bf16/micro.json" "$OUT/fp8/micro.json"
grep -E "passed|failed|error|Error|GPU-FP8 grouped|accuracy prompt|^tune MoE" "$LOG" | cut -c1-400 | tail -30
