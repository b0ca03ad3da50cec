#!/usr/bin/env bash
# cpfold's device call 2: call 1's micro.py on this branch ran out of its 45 s (compiling the changed
# kernels): micro.py thinker/talker B = 1, 32 on this branch (new/) and on main 666edcb (base/), then the
# what-if cells (whatif.py, fixed: benchmarks/ on sys.path). Run from .dev_cpfold/new: bash ../call2.sh
set -uo pipefail
LIMIT=${LIMIT:-150}
. ../common.sh
install
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
SKEL=.gpu/full-skel
[ -d "$SKEL" ] || step 20 python3 -m omniwalk.cli make-tiny "$SKEL" --config qwen3-omni-30b-a3b --no-weights
MICRO="$SKEL --parts thinker,talker --thinker-batches 1,32 --talker-batches 1,32"
mkdir -p "$OUT/micro_new" "$OUT/micro_base" "$OUT/whatif_moe_parts" "$OUT/whatif_wide_tiles"
step 75 python3 benchmarks/micro.py $MICRO --out "$OUT/micro_new"
(cd ../base && PYTHONPATH=/tmp/site:$PWD step 45 python3 benchmarks/micro.py ../new/$MICRO --out "$OUT/micro_base")
for f in new base; do echo "--- micro $f"; grep -E "^\| (1|32) \|" "$OUT/micro_$f/micro.md" 2>/dev/null | cut -d'|' -f1-4; done | tee -a "$LOG"
for cell in wide_tiles moe_parts; do
  step 25 python3 ../whatif.py $cell "$SKEL" --parts talker --talker-batches 1 --out "$OUT/whatif_$cell"
  echo "--- what-if $cell"; grep -E "^\| 1 \|" "$OUT/whatif_$cell/micro.md" 2>/dev/null | cut -d'|' -f1-4
done | tee -a "$LOG"
grep -E "Error|Traceback" "$LOG" | cut -c1-220 | tail -10
echo "[$((SECONDS - T0))s] done"
