#!/usr/bin/env bash
# Session 31, call 1 (issue 21's text paths): the skinny GEMM's tiles on Qwen2.5-Omni-7B's decode shapes
# (rows 1, 16, 32; cuBLAS and the LM heads beside them), then profile_walk s2t@1 and i2t@1 as the tree
# runs and with the tuned table applied (same process kind, same machine).
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
install_wheels || exit 1
export PYTHONUNBUFFERED=1
SKEL=.gpu/qwen25-7b-skel
make_skeleton "$SKEL" qwen2.5-omni-7b >/tmp/skel.log 2>&1 &
record_env >"$OUT/env.txt" 2>&1
log "skinny_gemm"
timeout -k 5 170 python3 benchmarks/skinny_gemm.py --shapes qwen2.5-omni-7b --heads --rows 1,16,32 \
  --out "$OUT/skinny" >"$OUT/skinny.log" 2>&1
grep -E "M=|Error|error" "$OUT/skinny.log" | cut -c1-200
wait
CELLS=s2t@1,i2t@1
log "profile_walk, the tree's tiles"
timeout -k 5 170 python3 benchmarks/profile_walk.py "$SKEL" --cells $CELLS --python --out "$OUT/base" \
  >"$OUT/base.log" 2>&1
tail -3 "$OUT/base.log"
if [ -f "$OUT/skinny/tuned.json" ]; then
  log "profile_walk, tuned"
  timeout -k 5 170 python3 benchmarks/skinny_gemm.py --apply "$OUT/skinny/tuned.json" benchmarks/profile_walk.py \
    "$SKEL" --cells $CELLS --out "$OUT/tuned" >"$OUT/tuned.log" 2>&1
  tail -3 "$OUT/tuned.log"
fi
for d in base tuned; do echo "=== $d"; grep -E "per engine step|TTFT|ttft" "$OUT/$d/profile.md" 2>/dev/null | head -12; done
log done
cd "$OUT" && tar czf logs.tar.gz *.log skinny base tuned env.txt 2>/dev/null; rm -rf skinny base tuned *.log env.txt
