#!/usr/bin/env bash
# Session 30, device call 1 (carry .whl .whl_hf and the .dev_* trees below):
#  1. issue 17's bisect of the talker frame at B = 32 (micro.py, h200_ab_micro.sh, 2 rounds, order rotated):
#     .dev_pre = 4ec7e5e (before the lift), .dev_a = d8bfeaf^1 (integ before the code predictor's fold),
#     .dev_fold = 531d53a (the fold, before embed_add), .dev_emb = e5ba9bf (embed_add as a PDL kernel),
#     .dev_nopdl = main with embed_add launched without PDL (an experiment, not committed), . = main.
#     Each .dev_* = `git archive C omniwalk benchmarks pyproject.toml` less benchmarks/results.
#  2. issue 21: the bf16 DiT on the GPU (Qwen2.5 graph + token2wav GPU tests), benchmarks/token2wav.py.
set -uo pipefail
START_EPOCH=$(date +%s.%N)
. benchmarks/h200_common.sh
install_wheels || exit 1
export PYTHONUNBUFFERED=1
record_env >"$OUT/env.txt" 2>&1
make_skeleton .gpu/full-skel qwen3-omni-30b-a3b >/tmp/make_tiny.log 2>&1 || exit 1
OUT=$OUT/ab timeout 390 bash benchmarks/h200_ab_micro.sh --trees ".dev_pre .dev_a .dev_fold .dev_emb .dev_nopdl ." \
  --part talker --batches 32 --rounds 2 --run-seconds 75 --no-install 2>&1 | tail -12
log "bisect done"
left=$((570 - SECONDS))
timeout $((left > 20 ? left - 15 : 5)) python3 -m pytest -q -p no:cacheprovider -m gpu -rfE \
  tests/test_qwen2_5_omni_graphs_gpu.py tests/test_qwen2_5_omni_token2wav_gpu.py >"$OUT/q25_gpu_tests.log" 2>&1
log "q25 GPU tests rc=$?: $(tail -1 "$OUT/q25_gpu_tests.log")"
left=$((585 - SECONDS))
[ $left -gt 20 ] && timeout $left python3 benchmarks/token2wav.py --device cuda --rows 1 32 --repeats 3 \
  >"$OUT/token2wav.txt" 2>&1
log "token2wav rc=$?"; tail -25 "$OUT/token2wav.txt"
