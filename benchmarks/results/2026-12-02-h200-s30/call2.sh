#!/usr/bin/env bash
# Session 30, device call 2 (carry .whl, .dev_pre = git archive 4ec7e5e as in call 1):
#  1. issue 17's served A/B: each tree's own h200_sweep.sh (serve + bench) on one skeleton, s2t and s2s at
#     B = 1, 32, N = max(20, 8 B), four sweeps alternating pre main main pre (drift falls on both alike).
#  2. issue 21: benchmarks/profile_walk.py on the Qwen2.5-Omni-7B skeleton, s2s at B = 1 and 32 (bf16 DiT).
set -uo pipefail
START_EPOCH=$(date +%s.%N)
. benchmarks/h200_common.sh
install_wheels || exit 1
export PYTHONUNBUFFERED=1
make_skeleton .gpu/full-skel qwen3-omni-30b-a3b >/dev/null || exit 1
make_skeleton .gpu/qwen25-7b-skel qwen2.5-omni-7b >/dev/null || exit 1
ARGS=(--paths s2t,s2s --concurrency 1,32 --min-requests 20 --requests-per-concurrency 8 --max-seconds 140
  --skel "$PWD/.gpu/full-skel" --no-install)
i=0
for t in pre main main pre; do
  i=$((i + 1))
  if [ "$t" = pre ]; then
    (cd .dev_pre && PYTHONPATH=/tmp/site:$PWD timeout 150 bash benchmarks/h200_sweep.sh "${ARGS[@]}" --port 802$i --out /tmp/s$i >/tmp/s$i.log 2>&1)
  else
    PYTHONPATH=/tmp/site:$PWD timeout 150 bash benchmarks/h200_sweep.sh "${ARGS[@]}" --port 802$i --out /tmp/s$i >/tmp/s$i.log 2>&1
  fi
  log "sweep $i ($t) done"; grep "^| s2" /tmp/s$i/results.md | cut -c1-160
  mkdir -p /tmp/ab; cp /tmp/s$i/results.md /tmp/ab/${i}_$t.md; cp /tmp/s$i/results.json /tmp/ab/${i}_$t.json
done
tar -czf "$OUT/ab.tar.gz" -C /tmp ab
left=$((590 - SECONDS))
timeout $((left > 30 ? left : 5)) python3 benchmarks/profile_walk.py .gpu/qwen25-7b-skel --cells s2s@1,s2s@32 \
  --out "$OUT/profile" >/tmp/profile.log 2>&1
log "profile rc=$?"; tail -5 /tmp/profile.log; cp /tmp/profile.log "$OUT/profile_log.txt"
