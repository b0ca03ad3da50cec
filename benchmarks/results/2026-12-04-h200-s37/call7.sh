#!/usr/bin/env bash
# Session 37 call 7 (issue 21): HF transformers generate at B = 1 on the four seed paths with the fixed method (a
# full-length warm-up run, then 3 timed runs, every run kept): call 6 found the old 2-token warm-up left the first
# timed run 2-3x slow, and the old 2-run median is the mean of that run and the next.
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
LIMIT=340
LOG=$OUT/log.txt
install_wheels || exit 1
export PYTHONUNBUFFERED=1
SKEL=.gpu/qwen25-7b-skel
make_skeleton "$SKEL" qwen2.5-omni-7b >/tmp/skel.log 2>&1
uptime >>"$LOG"
deadline_step 320 python3 benchmarks/hf_baseline_qwen25.py "$SKEL" --paths s2t,i2t,s2s,i2s --repeats 3 --out "$OUT/hf"
uptime >>"$LOG"
grep -E "load average|HF (s2t|i2t|s2s|i2s)" "$LOG" | cut -c1-300
