#!/usr/bin/env bash
# Session 37 call 3 (issue 21): served Qwen2.5-Omni-7B (random bf16) on this tree: s2t, i2t, s2s at B = 1 (N = 30)
# and 32 (N = 64), HF transformers' s2t generate at B = 1 on the same GPU; then the speech GPU tests with HF 5.24
# (.whl_hf: call 2's run lacked it, its HF-parity test failed on the image's transformers 5.17 API).
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
LIMIT=570
LOG=$OUT/log.txt
export PYTHONUNBUFFERED=1
deadline_step 420 bash benchmarks/h200_qwen25.sh --paths s2t,i2t,s2s --concurrency 1,32 --min-requests 30 \
  --sweep-seconds 330 --hf-paths s2t --hf-seconds 80 --out "$OUT/q25"
deadline_step 120 python3 -m pytest -q -s -x -p no:cacheprovider -m gpu tests/test_speech_gpu.py tests/test_audio_encoder_merge_gpu.py
grep -E "phases|^\| (s2t|i2t|s2s)" "$OUT/q25/sweep/sweep.log" "$OUT/q25/sweep/results.md" | cut -c1-300
cat "$OUT/q25/ratio.md"
grep -E "passed|failed|GPU-AUDIO|Error" "$LOG" | tail -8
