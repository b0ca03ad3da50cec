#!/usr/bin/env bash
# Session 36 call 2 (issue 18): the FP8 skinny GEMM's 32-row tiles tuned again for the chained dot
# (fp8.py --parts tune --tune-rows 32; the grouped tiles are re-timed by the same part), the winners put into
# a copy of this tree (.dev_tuned, on the device only); then micro talker and thinker at B = 32, FP8, interleaved:
# .dev_prev (9834d0a), this tree, .dev_tuned; 30 timed steps a run.
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
LIMIT=575
LOG=$OUT/log.txt
install_wheels || exit 1
export PYTHONUNBUFFERED=1
SKEL=.gpu/full-skel
make_skeleton "$SKEL" qwen3-omni-30b-a3b >/tmp/make_tiny.log 2>&1
deadline_step 130 python3 benchmarks/fp8.py "$SKEL" --parts tune --tune-rows 32 --out /tmp/tune
cp /tmp/tune/tuned.json "$OUT/tuned.json"
mkdir -p .dev_tuned && cp -r omniwalk benchmarks pyproject.toml .dev_tuned/ && rm -rf .dev_tuned/benchmarks/results
python3 - <<'PY' | tee -a "$LOG"
import json
tuned = json.load(open("/tmp/tune/tuned.json"))["tuned"]
skinny = {tuple(k): tuple(b) for k, b in tuned["skinny"]}
with open(".dev_tuned/omniwalk/layers/skinny_gemm.py", "a") as f:
    f.write("\nTUNED_FP8.update({k: Blocks(*b) for k, b in %r.items()})\n" % skinny)
grouped = {w: {t: tuple(tuned[f"grouped_{w}{t}"]) for t in (16, 64)} for w in ("gate_up", "down")}
with open(".dev_tuned/omniwalk/layers/grouped_fp8.py", "a") as f:
    f.write("\nGATE_UP_BLOCKS.update(%r)\nDOWN_BLOCKS.update(%r)\n" % (grouped["gate_up"], grouped["down"]))
print("dev_tuned:", skinny, grouped)
PY
for part in talker thinker; do
  OUT=$OUT/$part deadline_step 210 bash benchmarks/h200_ab_micro.sh \
    --trees ".dev_prev@quantization=fp8 .@quantization=fp8 .dev_tuned@quantization=fp8" \
    --part $part --batches 32 --rounds 2 --no-install --run-seconds 60 -- --steps 30
  rm -f "$OUT/$part/runs.tar.gz"
done
grep -E "^tune|dev_tuned:|^\| " "$LOG" | cut -c1-600 | tail -40
