#!/usr/bin/env bash
# Session 32, call 3: the decode attention at B = 1 (7.4 µs of the 7B's ~132 µs layer on the critical path,
# call 2's traces). (1) benchmarks/paged_decode.py at B = 1 with more block shapes, the 7B's and Qwen3's
# thinker heads; (2) in process, s2t add -> end p50 (ttft_probe --whole) with the kernel's defaults
# (blocks, programs) replaced: (64, 4)/128 (the tree), (32, 4)/128, (32, 4)/256, (16, 4)/256.
set -uo pipefail
cd "$(dirname "$0")/../../.."
. benchmarks/h200_common.sh
install_wheels || exit 1
export PYTHONUNBUFFERED=1
SKEL=$PWD/.gpu/qwen25-7b-skel
make_skeleton "$SKEL" qwen2.5-omni-7b >/tmp/skel.log 2>&1
log "paged_decode micro"
timeout -k 5 120 python3 - <<'PY' >"$OUT/micro.log" 2>&1
import sys
sys.path.insert(0, "benchmarks")
sys.argv = ["paged_decode.py", "--out", sys.argv[0] if False else "/tmp/pdm", "--batches", "1"]
import paged_decode as pd
pd.SHAPES = {"7b thinker": (28, 4, 16, [207, 512]), "thinker": (32, 4, 16, [207, 512])}
pd.BLOCKS = [(64, 4), (32, 4), (16, 4), (32, 2), (64, 8), (128, 8)]
pd.PROGRAMS = [0, 128, 256]
pd.main()
PY
grep -E "keys= 207" "$OUT/micro.log" | sort -t: -k2 -n | head -12
variant() {  # NAME BLOCKS PROGRAMS
  log "variant $1"
  timeout -k 5 100 python3 - benchmarks/ttft_probe.py "$SKEL" --paths s2t --whole --out "$OUT/$1" >"$OUT/$1.log" 2>&1 <<PY
import runpy, sys
sys.path.insert(0, "benchmarks")
from omniwalk.layers import paged_decode as pd
pd.paged_decode_triton.__defaults__ = (None, $2, $3)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
PY
  grep -E "add -> end" "$OUT/$1/ttft.md" || tail -5 "$OUT/$1.log"
}
variant base "(64, 4)" 128
variant b32 "(32, 4)" 128
variant b32p256 "(32, 4)" 256
variant b16p256 "(16, 4)" 256
variant base2 "(64, 4)" 128
log done
cd "$OUT" && for v in base b32 b32p256 b16p256 base2; do mv $v/ttft.md $v.md; done && tar czf call3.tar.gz base b32 b32p256 b16p256 base2 *.log && rm -rf base b32 b32p256 b16p256 base2 *.log
