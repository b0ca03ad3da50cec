#!/usr/bin/env bash
# Session 36 call 1 (issue 18): the FP8 tl.dot path with the tile dequantised to bf16 before the dot (this
# tree) against .dev_prev (9834d0a: each K step's product scaled after the dot). GPU tests of the skinny FP8
# kernels; fp8.py projections on both trees; micro talker B = 1, 32 interleaved (FP8 both trees, bf16 here).
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
LIMIT=560
LOG=$OUT/log.txt
install_wheels || exit 1
export PYTHONUNBUFFERED=1
SKEL=.gpu/full-skel
make_skeleton "$SKEL" qwen3-omni-30b-a3b >/tmp/make_tiny.log 2>&1
deadline_step 110 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_fp8_gpu.py -k "skinny or gemv_tiles"
for tree in .dev_prev .; do
  (cd $tree && export PYTHONPATH=/tmp/site:$PWD && deadline_step 70 python3 benchmarks/fp8.py $OLDPWD/$SKEL --parts projections --out /tmp/proj_$(basename $(pwd)))
done
OUT=$OUT/talker deadline_step 260 bash benchmarks/h200_ab_micro.sh --trees ".dev_prev@quantization=fp8 .@quantization=fp8 ." \
  --part talker --batches 1,32 --rounds 2 --no-install --run-seconds 75
rm -f "$OUT/talker/runs.tar.gz"
grep -E "passed|failed|Error|GPU-FP8 .* M=32|M=32:|M= 1:|^\| " "$LOG" | cut -c1-300 | tail -60
