#!/usr/bin/env bash
# Qwen2.5-Omni-7B on one H200 with random bf16 weights: omniwalk's sweep of the four seed paths
# (benchmarks/h200_sweep.sh: `omniwalk serve` + `omniwalk bench`, the bench presets in the model's
# codec frames) and HF transformers' `generate` end to end at B = 1 on the same GPU and work
# (benchmarks/hf_baseline_qwen25.py), then the E2E ratio HF / omniwalk at B = 1 per path.
#
# Usage (from the repo root; on the device with `carry: [".whl", ".whl_hf", <this checkout>]`):
#   bash benchmarks/h200_qwen25.sh                                   # s2t,i2t,s2s,i2s at B = 1, 32
#   bash benchmarks/h200_qwen25.sh --paths s2s --concurrency 1 --min-requests 3 --sweep-seconds 200 \
#       --hf-paths s2s --hf-seconds 120                              # one cell + its HF figure
#   bash benchmarks/h200_qwen25.sh --cpu --paths s2t --concurrency 1 --min-requests 1 --hf-paths s2t
#
# Options [defaults]:
#   --paths LIST / --concurrency LIST   the sweep's cells [s2t,i2t,s2s,i2s / 1,32]
#   --min-requests N / --requests-per-concurrency K   per cell N = max(N, K * B) [8 / 2]
#   --sweep-seconds S    the sweep's guard [420]      --hf-seconds S   HF's guard [240]
#   --hf-paths LIST      HF's paths at B = 1 ["" = the sweep's paths]; "none" skips HF
#   --skel DIR           the 7B skeleton [.gpu/qwen25-7b-skel, made with make-tiny --no-weights]
#   --out DIR            [$OUT, else ./h200-qwen25-out]
#   --cpu                CPU smoke test: the packaged tiny Qwen2.5-Omni config, fp32, no wheels
#   -- SERVE_FLAGS...    passed on to `omniwalk serve` (through h200_sweep.sh)
#
# Time (predicted, not measured): wheels ~15 s, server start with random 7B weights and CUDA graphs
# ~60 s, a B = 1 cell of 8 requests ~10-30 s (s2s/i2s speak 4 s / 10 s), a B = 32 cell ~30-60 s;
# HF: build ~30 s, then per path a warm-up and two timed runs (s2s/i2s ~10-40 s each). The full
# default run needs ~15 min: split it over device calls by --paths / --hf-paths.
# Output in --out: sweep/ (h200_sweep.sh's files), hf/ (hf_baseline_qwen25.json/.md), ratio.md.
set -uo pipefail
cd "$(dirname "$0")/.."
START_EPOCH=$(date +%s.%N)
. benchmarks/h200_common.sh

PATHS=s2t,i2t,s2s,i2s
CONCURRENCY=1,32
MIN_REQUESTS=8
PER_B=2
SWEEP_SECONDS=420
HF_SECONDS=240
HF_PATHS=""
SKEL=.gpu/qwen25-7b-skel
CONFIG=qwen2.5-omni-7b
OUTDIR=${OUT:-$PWD/h200-qwen25-out}
CPU=0
SERVE_EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --paths) PATHS=$2; shift 2 ;;
    --concurrency) CONCURRENCY=$2; shift 2 ;;
    --min-requests) MIN_REQUESTS=$2; shift 2 ;;
    --requests-per-concurrency) PER_B=$2; shift 2 ;;
    --sweep-seconds) SWEEP_SECONDS=$2; shift 2 ;;
    --hf-seconds) HF_SECONDS=$2; shift 2 ;;
    --hf-paths) HF_PATHS=$2; shift 2 ;;
    --skel) SKEL=$2; shift 2 ;;
    --out) OUTDIR=$2; shift 2 ;;
    --cpu) CPU=1; SKEL=/tmp/omniwalk-qwen25-tiny-skel; CONFIG=omniwalk/models/qwen2_5_omni/checkpoint/tiny_config.json; shift ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    --) shift; SERVE_EXTRA+=("$@"); break ;;
    *) echo "unknown option $1 (see --help)"; exit 2 ;;
  esac
done
[ -n "$HF_PATHS" ] || HF_PATHS=$PATHS
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)

if [ "$CPU" = 1 ]; then
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  SWEEP_MODE=(--cpu)
  HF_DEVICE=(--device cpu)
else
  install_wheels || { log "wheel install failed"; exit 1; }
  SWEEP_MODE=(--no-install)
  HF_DEVICE=()
fi
make_skeleton "$SKEL" "$CONFIG" || exit 1

log "omniwalk sweep: paths $PATHS, B $CONCURRENCY"
bash benchmarks/h200_sweep.sh "${SWEEP_MODE[@]}" --skel "$SKEL" --paths "$PATHS" --concurrency "$CONCURRENCY" \
  --min-requests "$MIN_REQUESTS" --requests-per-concurrency "$PER_B" --max-seconds "$SWEEP_SECONDS" \
  --out "$OUTDIR/sweep" -- "${SERVE_EXTRA[@]}"
log "sweep exit $?"

if [ "$HF_PATHS" != none ]; then
  log "HF transformers generate, B = 1: $HF_PATHS"
  timeout -k 5 "$HF_SECONDS" python3 benchmarks/hf_baseline_qwen25.py "$SKEL" --out "$OUTDIR/hf" \
    --paths "$HF_PATHS" "${HF_DEVICE[@]}" 2>&1 | tee "$OUTDIR/hf.log"
  log "HF exit ${PIPESTATUS[0]}"
fi

python3 - "$OUTDIR" <<'EOF' | tee "$OUTDIR/ratio.md"
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
ours = json.loads((out / "sweep/results.json").read_text()) if (out / "sweep/results.json").exists() else {}
hf_file = out / "hf/hf_baseline_qwen25.json"
hf = {r["path"]: r for r in json.loads(hf_file.read_text())["paths"]} if hf_file.exists() else {}
print("# Qwen2.5-Omni-7B E2E at B = 1: HF transformers generate / omniwalk (p50)\n")
print("| path | omniwalk E2E p50 (s) | HF E2E (s) | HF / omniwalk |\n|---|---|---|---|")
for path in sorted(set(hf) | {k.rsplit("@", 1)[0] for k in ours}):
    mine = ours.get(f"{path}@1", {}).get("summary", {}).get("e2e_p50")
    theirs = hf.get(path, {}).get("e2e_s")
    ratio = f"{theirs / mine:.1f}x" if mine and theirs else "-"
    print(f"| {path} | {mine if mine is not None else '-'} | {theirs if theirs is not None else '-'} | {ratio} |")
EOF
log "done; files in $OUTDIR: $(ls "$OUTDIR" | tr '\n' ' ')"
