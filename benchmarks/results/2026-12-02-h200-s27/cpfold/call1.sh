#!/usr/bin/env bash
# cpfold's device call 1 (fresh machine): GPU tests of the folded-norm GEMV and embed_add; micro.py
# thinker/talker B = 1, 32 on this branch (new/) and on main 666edcb (base/), the GPU otherwise idle; the
# engine's graphs on vs off; then what-if cells (whatif.py) of the talker frame at B = 1.
# Run from .dev_cpfold/new: bash ../call1.sh
set -uo pipefail
LIMIT=${LIMIT:-198}
. ../common.sh
install
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
SKEL=.gpu/full-skel
step 20 python3 -m omniwalk.cli make-tiny "$SKEL" --config qwen3-omni-30b-a3b --no-weights
PYTEST="python3 -m pytest -q -s -p no:cacheprovider -m gpu"
step 30 $PYTEST tests/test_skinny_gemm_gpu.py tests/test_fused_gpu.py -k "folded or embed_add"
MICRO="$SKEL --parts thinker,talker --thinker-batches 1,32 --talker-batches 1,32"
mkdir -p "$OUT/micro_new" "$OUT/micro_base" "$OUT/whatif_moe_parts" "$OUT/whatif_wide_tiles"
step 45 python3 benchmarks/micro.py $MICRO --out "$OUT/micro_new"
(cd ../base && PYTHONPATH=/tmp/site:$PWD step 42 python3 benchmarks/micro.py ../new/$MICRO --out "$OUT/micro_base")
for f in new base; do echo "--- micro $f"; grep -E "^\| (1|32) \|" "$OUT/micro_$f/micro.md" 2>/dev/null | cut -d'|' -f1-4; done | tee -a "$LOG"
step 45 $PYTEST tests/test_graphs_gpu.py -k "graph_replay_equals_eager"
for cell in wide_tiles moe_parts; do
  step 22 python3 ../whatif.py $cell "$SKEL" --parts talker --talker-batches 1 --out "$OUT/whatif_$cell"
  echo "--- what-if $cell"; grep -E "^\| 1 \|" "$OUT/whatif_$cell/micro.md" 2>/dev/null | cut -d'|' -f1-4
done | tee -a "$LOG"
grep -E "GPU-FOLD|GPU-FUSED embed|GPU-GRAPHS request|passed|failed|^(FAILED|ERROR)|Error" "$LOG" | cut -c1-220 | tail -40
echo "[$((SECONDS - T0))s] done"
