#!/usr/bin/env bash
# Session 31, call 3: (1) ttft_probe.py s2t, i2t (where B = 1's time to first text goes, step by step);
# (2) profile_walk i2t@1, s2t@1 free windows: the tree (A), o/down unsplit at one row so the next norm
# folds into the GEMV (B, variant_unsplit.json), the norm folded over 2-4 partial parts (C,
# MAX_FOLDED_PARTS = 4); (3) the media decode of the bench image on this machine's CPU; (4) GPU tests of
# the skinny GEMM (the 7B's shapes) and of Qwen2.5-Omni's graphs.
set -uo pipefail
cd "$(dirname "$0")/../../.."
D=benchmarks/results/2026-12-02-h200-s31
. benchmarks/h200_common.sh
install_wheels || exit 1
export PYTHONUNBUFFERED=1
SKEL=.gpu/qwen25-7b-skel
make_skeleton "$SKEL" qwen2.5-omni-7b >/tmp/skel.log 2>&1
log "ttft_probe"
timeout -k 5 150 python3 benchmarks/ttft_probe.py "$SKEL" --paths s2t,i2t --out "$OUT/ttft" >"$OUT/ttft.log" 2>&1
grep -E "free:|profiled:" "$OUT/ttft/ttft.md"
WALK=(benchmarks/profile_walk.py "$SKEL" --cells i2t@1,s2t@1 --windows free --steps 200)
log "variant A"
timeout -k 5 120 python3 "${WALK[@]}" --out "$OUT/A" >"$OUT/A.log" 2>&1
log "variant B"
timeout -k 5 120 python3 benchmarks/skinny_gemm.py --apply $D/variant_unsplit.json "${WALK[@]}" --out "$OUT/B" >"$OUT/B.log" 2>&1
log "variant C"
timeout -k 5 120 python3 - "${WALK[@]}" --out "$OUT/C" >"$OUT/C.log" 2>&1 <<'PY'
import runpy, sys
from omniwalk.layers import skinny_gemm as sg
sg.MAX_FOLDED_PARTS = 4
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
PY
for v in A B C; do echo "=== $v"; grep -E "free-running|engine TTFT" "$OUT/$v/profile.md"; done
log "media decode"
python3 - <<'PY'
import base64, time
from omniwalk.bench.workload import PRESETS, request_body
from omniwalk.media.patch_spec import PatchSpec
from omniwalk.media.preprocess import preprocess
body = request_body(PRESETS["i2t"], "m", 0)
url = next(c["image_url"]["url"] for m in body["messages"] if isinstance(m["content"], list) for c in m["content"] if c.get("type") == "image_url")
data = base64.b64decode(url.split(",", 1)[1])
spec = PatchSpec(patch_size=14, merge_size=2)
for name, f in [("decode", lambda: preprocess("image", data)), ("decode+resize", lambda: preprocess("image", data, spec=spec))]:
    f(); t = time.perf_counter()
    for _ in range(20): f()
    print(f"media {name}: {(time.perf_counter() - t) / 20 * 1e3:.2f} ms")
PY
log "GPU tests"
timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_skinny_gemm_gpu.py \
  tests/test_qwen2_5_omni_graphs_gpu.py >"$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log"
log done
cd "$OUT" && tar czf call3.tar.gz ttft A B C *.log && rm -rf ttft A B C *.log
