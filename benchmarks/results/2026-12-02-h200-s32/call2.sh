#!/usr/bin/env bash
# Session 32, call 2: the decode-step changes A/B on s2t at B = 1, in process (ttft_probe --whole: add -> end
# p50 over 10 requests, then one request profiled). Trees/variants: P = main before the session (.dev_prev,
# a3f1b55), N = this tree (norms folded over split-K partials, paged decode's early reads, cached tables,
# L2 prefetch <= 32 MB), N-pf0 = N without the prefetch, N-fold1 = N with MAX_FOLDED_PARTS = 1. Then the
# GPU tests of the touched kernels, a wave-upload micro-test, served s2t B = 1 (N = 30) on this tree.
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
install_wheels || exit 1
export PYTHONUNBUFFERED=1
SKEL=$PWD/.gpu/qwen25-7b-skel
make_skeleton "$SKEL" qwen2.5-omni-7b >/tmp/skel.log 2>&1
variant() {  # NAME TREE PATCH
  local name=$1 tree=$2 patch=$3
  log "variant $name"
  (cd "$tree" && PYTHONPATH=/tmp/site:$PWD timeout -k 5 110 python3 - benchmarks/ttft_probe.py "$SKEL" --paths s2t \
    --whole --out "$OUT/$name" >"$OUT/$name.log" 2>&1 <<PY
import runpy, sys
sys.path.insert(0, "benchmarks")
from omniwalk.layers import skinny_gemm as sg
$patch
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
PY
  )
  grep -E "free:|add -> end|whole request" "$OUT/$name/ttft.md" | cut -c1-200 || tail -5 "$OUT/$name.log"
}
variant N . "pass"
variant P .dev_prev "pass"
variant N-pf0 . "sg.PREFETCH_L2_BYTES = 0"
variant N-fold1 . "sg.MAX_FOLDED_PARTS = 1"
log "GPU tests"
timeout -k 5 100 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_skinny_gemm_gpu.py tests/test_graphs_gpu.py \
  tests/test_qwen2_5_omni_graphs_gpu.py >"$OUT/tests.log" 2>&1
grep -E "GPU-PREFETCH.*False|GPU-FOLD7B|passed|failed" "$OUT/tests.log" | tail -8
log "wave upload"
python3 - <<'PY'
import time, numpy as np, torch
from omniwalk.device import to_device
wave = np.random.randn(64000).astype(np.float32)
for name, fn in [("pinned to_device", lambda: to_device(torch.from_numpy(wave), "cuda")),
                 ("pageable .to", lambda: torch.from_numpy(wave).to("cuda"))]:
    for _ in range(5): fn()
    torch.cuda.synchronize(); ts = []
    for _ in range(50):
        t = time.perf_counter(); fn(); ts.append((time.perf_counter() - t) * 1e6)
    torch.cuda.synchronize(); ts.sort(); print(f"{name}: p50 {ts[25]:.0f} us, max {ts[-1]:.0f} us (host)")
PY
log "served"
timeout -k 5 150 bash benchmarks/h200_qwen25.sh --paths s2t --concurrency 1 --min-requests 30 --sweep-seconds 130 \
  --hf-paths none --out "$OUT/q25" >"$OUT/q25.log" 2>&1
grep -E "phases" "$OUT/q25/sweep/sweep.log"; grep -E "^\| (s2t|i2t)" "$OUT/q25/sweep/results.md"
log done
cd "$OUT" && for v in N P N-pf0 N-fold1; do mv $v/ttft.md $v.md; done && tar czf call2.tar.gz N P N-pf0 N-fold1 q25 *.log && rm -rf N P N-pf0 N-fold1 q25 *.log
