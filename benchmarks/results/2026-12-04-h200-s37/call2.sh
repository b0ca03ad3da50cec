#!/usr/bin/env bash
# Session 37 call 2 (issue 21): GPU tests of what changed (audio encoder fast path, decode graphs' host
# inputs, prefill graphs from 128 tokens, prefix pages through the engine, host syncs), then ttft_probe s2t
# --whole on this tree (its warm-up requests key the system prompt's pages: the measured ones take them).
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
LIMIT=560
LOG=$OUT/log.txt
install_wheels || exit 1
export PYTHONUNBUFFERED=1
SKEL=.gpu/qwen25-7b-skel
make_skeleton "$SKEL" qwen2.5-omni-7b >/tmp/skel.log 2>&1
deadline_step 330 python3 -m pytest -q -x -p no:cacheprovider -m gpu tests/test_audio_encoder_merge_gpu.py \
  tests/test_graphs_gpu.py tests/test_qwen2_5_omni_graphs_gpu.py tests/test_engine_async_gpu.py \
  tests/test_sync_gpu.py tests/test_encoder_graphs_gpu.py tests/test_thinker_gpu.py tests/test_speech_gpu.py
deadline_step 200 python3 benchmarks/ttft_probe.py "$SKEL" --paths s2t --whole --out "$OUT/ttft"
cat "$OUT/ttft/ttft.md" | cut -c1-400 | head -60
grep -E "passed|failed|error|GPU-AUDIO|GPU-GRAPHS" "$LOG" | tail -30
