#!/usr/bin/env bash
# talk's device call 3 (<= 58 s, fresh machine): after reverting the fused attention, the engine's graphs on
# vs off (ids, logprobs, codes, audio equal) on the final tree. Run from .dev_talk/new: bash ../call3.sh
set -uo pipefail
LIMIT=${LIMIT:-56}
. ../common.sh
install
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
step 50 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_graphs_gpu.py -k "graph_replay_equals_eager or padding_rows"
grep -vE "^cuda graphs" "$LOG" | cut -c1-200 | tail -15
echo "[$((SECONDS - T0))s] done"
