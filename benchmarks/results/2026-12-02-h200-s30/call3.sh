#!/usr/bin/env bash
# Session 30, device call 3 (main with the DiT fast path and the tail span; carry .whl, .whl_hf):
#  1. the GPU tests of what changed since session 29's full GPU run (main 2a2fe19: 258 passed): the DiT fast path
#     (tests/test_dit_gpu.py, new), Qwen2.5's token2wav and graphs, the FP8 and skinny GEMVs (x-layout change);
#  2. Qwen2.5-Omni-7B s2s and i2s at B = 1 (benchmarks/h200_qwen25.sh; HF's figures are session 27's);
#  3. benchmarks/token2wav.py on the GPU: the bf16 DiT's RK step, reference vs fast path, eager and graphed;
#  4. while time is left: benchmarks/profile_walk.py s2s@32 with --python (the token2wav stage's host time).
set -uo pipefail
START_EPOCH=$(date +%s.%N)
. benchmarks/h200_common.sh
install_wheels || exit 1
export PYTHONUNBUFFERED=1
record_env >"$OUT/env.txt" 2>&1
make_skeleton .gpu/qwen25-7b-skel qwen2.5-omni-7b >/dev/null 2>&1 &
TOTAL=${TOTAL:-470}
timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/test_dit_gpu.py \
  tests/test_qwen2_5_omni_token2wav_gpu.py tests/test_qwen2_5_omni_graphs_gpu.py tests/test_fp8_gpu.py \
  tests/test_skinny_gemm_gpu.py >"$OUT/gpu_tests.log" 2>&1
log "GPU tests rc=$?: $(tail -1 "$OUT/gpu_tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | cut -c1-200 | head -20
wait
timeout 200 bash benchmarks/h200_qwen25.sh --paths s2s,i2s --concurrency 1 --min-requests 5 --sweep-seconds 190 \
  --hf-paths none --out /tmp/q25 >/tmp/q25.log 2>&1
log "qwen25 sweep rc=$?"; grep -E "^\| (s2s|i2s) " /tmp/q25/sweep/results.md | cut -c1-170
tar -czf "$OUT/q25.tar.gz" -C /tmp q25 q25.log 2>/dev/null
left=$((TOTAL - 20 - SECONDS))
[ $left -gt 30 ] && timeout $left python3 benchmarks/token2wav.py --device cuda --rows 1 32 --repeats 5 \
  --dit-dtypes bfloat16 --paths reference fast --accuracy-codes 96 >"$OUT/token2wav.txt" 2>&1
log "token2wav rc=$?"; grep -E '"(variant|rows|step_s|graph_step_s|kernels_per_step|wave_cosine)"' "$OUT/token2wav.txt" | tr -d ' \n'; echo
left=$((TOTAL - SECONDS))
[ $left -gt 60 ] && timeout $left python3 benchmarks/profile_walk.py .gpu/qwen25-7b-skel --cells s2s@32 --python \
  --windows free --steps 60 --out "$OUT/profile" >/tmp/profile.log 2>&1
log "profile rc=$?"
