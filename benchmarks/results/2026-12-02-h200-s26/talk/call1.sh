#!/usr/bin/env bash
# talk's device call 1 (~70 s): the GPU tests of the kernels this branch touched and of graphs on vs off,
# before any measurement. Run from .dev_talk/new: bash ../call1.sh
set -uo pipefail
LIMIT=${LIMIT:-80}
. ../common.sh
install
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
PYTEST="python3 -m pytest -q -s -p no:cacheprovider -m gpu"
step 55 $PYTEST tests/test_fused_gpu.py tests/test_graphs_gpu.py
step 30 $PYTEST tests/test_engine_async_gpu.py tests/test_sync_gpu.py
grep -E "passed|failed|error" "$LOG" | tail -5
grep -E "^(FAILED|ERROR)|GPU-FUSED (q/k|qkv|MoE)" "$LOG" | cut -c1-200 | head -40
echo "[$((SECONDS - T0))s] done"
