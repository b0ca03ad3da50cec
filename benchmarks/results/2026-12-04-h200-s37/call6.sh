#!/usr/bin/env bash
# Session 37 call 6 (issue 21): HF's s2t figure moved from 0.713 s (call 3) to 0.993 s (call 5), ours stayed
# 0.077 s: HF s2t at B = 1 with 9 timed runs each (runs kept), before and after our served s2t B = 1 (N = 30),
# the machine's load beside each.
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
LIMIT=400
LOG=$OUT/log.txt
install_wheels || exit 1
export PYTHONUNBUFFERED=1
SKEL=.gpu/qwen25-7b-skel
make_skeleton "$SKEL" qwen2.5-omni-7b >/tmp/skel.log 2>&1
uptime >>"$LOG"
deadline_step 80 python3 benchmarks/hf_baseline_qwen25.py "$SKEL" --paths s2t --repeats 9 --out "$OUT/hf1"
uptime >>"$LOG"
deadline_step 200 bash benchmarks/h200_qwen25.sh --paths s2t --concurrency 1 --min-requests 30 --sweep-seconds 150 \
  --hf-paths none --out "$OUT/q25"
uptime >>"$LOG"
deadline_step 80 python3 benchmarks/hf_baseline_qwen25.py "$SKEL" --paths s2t --repeats 9 --out "$OUT/hf2"
(cd "$OUT/q25" && tar czf sweep.tar.gz sweep && rm -rf sweep)
grep -E "load average|HF s2t|^\| s2t" "$LOG" | cut -c1-300
grep -h runs_s -A12 "$OUT"/hf*/hf_baseline_qwen25.json | tr -d ' \n'; echo
