#!/usr/bin/env bash
# Session 37 call 4: GPU tests (speech with HF 5.24; the audio fast path, printed; decode graphs from host
# inputs); torch 2.11's varlen_attn with GQA keys (varlen_gqa.py); s2s in process on main (.dev_prev =
# 4d1a44c) and this tree, one after the other (call 3's served s2s B = 1 read 0.882 s against session 31's
# 0.837: this machine, or the change?).
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
LIMIT=580
LOG=$OUT/log.txt
install_wheels || exit 1
export PYTHONUNBUFFERED=1
SKEL=.gpu/qwen25-7b-skel
make_skeleton "$SKEL" qwen2.5-omni-7b >/tmp/skel.log 2>&1
deadline_step 200 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_audio_encoder_merge_gpu.py \
  tests/test_speech_gpu.py tests/test_graphs_gpu.py
deadline_step 40 python3 benchmarks/results/2026-12-04-h200-s37/varlen_gqa.py
for tree in .dev_prev .; do
  (cd $tree && export PYTHONPATH=/tmp/site:$PWD && deadline_step 150 python3 benchmarks/ttft_probe.py \
    $OLDPWD/$SKEL --paths s2s --repeats 3 --whole --out $OUT/s2s_$(basename $(realpath .)))
done
rm -f $OUT/s2s_*/whole-*.json.gz
grep -E "passed|failed|GPU-AUDIO|GPU-GRAPHS|varlen|GQA|repeated|native|add -> end|free:" "$LOG" | cut -c1-250 | tail -40
