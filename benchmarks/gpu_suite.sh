#!/usr/bin/env bash
# The GPU suite: the GPU tests, then every benchmark behind docs/performance.md's tables, on one CUDA GPU.
#
#   bash benchmarks/gpu_suite.sh OUTDIR [--quick] [--parts LIST]
#
# Parts, in order [all]: tests (pytest -m gpu), qwen3 (Qwen3-Omni-30B-A3B served, bf16 and FP8), qwen25
# (Qwen2.5-Omni-7B served), micro (thinker and talker steps, bf16 and FP8), hf (HF transformers baselines), fp8
# (FP8 logits against bf16), realtime (first audio over /v1/realtime). --quick: fewer requests, steps and rounds,
# to check that every part runs; its figures are not the tables'.
#
# No checkpoint is read: the full-size models run with random bf16 weights built on the GPU, from skeletons that
# `omniwalk make-tiny DIR --config PRESET --no-weights` writes under OUTDIR/skel. Needs a CUDA build of torch with
# Triton and this checkout installed with its extras: pip install -e '.[test,bench,examples]' (transformers for the
# tests and the HF baselines, matplotlib for the bench's charts, openai for the realtime probe). One GPU with
# ~80 GB; the whole suite takes about an hour on an H200, most of it in the served sweeps and the HF baselines.
#
# Writes into OUTDIR: env.txt, gpu_tests.log, served/<model>_<precision>/ (benchmarks/serving/sweep.sh's files),
# micro/<part>_<precision>_r<round>/micro.{json,md}, hf/<model>/, fp8/, realtime/, and summary.md (the figures the
# tables quote, gathered from those files).
set -uo pipefail
[ $# -ge 1 ] && [ "${1#-}" = "$1" ] || { sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2; }
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
shift
QUICK=0
PARTS=tests,qwen3,qwen25,micro,hf,fp8,realtime
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; shift ;;
    --parts) PARTS=$2; shift 2 ;;
    *) echo "unknown option $1 (run without arguments for help)"; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
want() { [[ ",$PARTS," == *",$1,"* ]]; }
step() { echo "=== $(date -u +%H:%M:%S) $*"; }
FAILED=()
check() {  # after each part's command: note a failure, and say whether it failed
  local rc=$?
  [ "$rc" = 0 ] && return 0
  FAILED+=("$1: exit $rc")
  return 1
}

if [ "$QUICK" = 1 ]; then
  MIN_Q3=2; MIN_Q25=2; PER_B=1; STEPS=5; ROUNDS=1; HF_REPEATS=1; HF3=(--repeats 1); PROMPTS=1; TURNS=1
else
  MIN_Q3=8; MIN_Q25=20; PER_B=2; STEPS=30; ROUNDS=2; HF_REPEATS=3; HF3=(); PROMPTS=2; TURNS=4
fi

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  git rev-parse HEAD 2>/dev/null && git status --short | head -20
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

Q3=$OUT/skel/qwen3-omni-30b-a3b
Q25=$OUT/skel/qwen2.5-omni-7b
[ -f "$Q3/config.json" ] || python3 -m omniwalk.cli make-tiny "$Q3" --config qwen3-omni-30b-a3b --no-weights || exit 1
[ -f "$Q25/config.json" ] || python3 -m omniwalk.cli make-tiny "$Q25" --config qwen2.5-omni-7b --no-weights || exit 1

if want tests; then
  step "GPU tests"
  python3 -m pytest -m gpu -q -p no:cacheprovider tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -n 5
  check "GPU tests"
fi

SWEEP=(bash benchmarks/serving/sweep.sh)
if want qwen3; then
  for q in bf16 fp8; do
    flags=(); [ $q = fp8 ] && flags=(--quantization fp8)
    step "Qwen3-Omni-30B-A3B served, $q"
    "${SWEEP[@]}" "$Q3" "$OUT/served/qwen3-omni-30b-a3b_$q" --min-requests "$MIN_Q3" --requests-per-concurrency "$PER_B" \
      -- "${flags[@]}"
    check "served Qwen3-Omni $q"
  done
fi
if want qwen25; then
  step "Qwen2.5-Omni-7B served, bf16"
  "${SWEEP[@]}" "$Q25" "$OUT/served/qwen2.5-omni-7b_bf16" --min-requests "$MIN_Q25" --requests-per-concurrency "$PER_B"
  check "served Qwen2.5-Omni"
fi

if want micro; then
  mkdir -p "$OUT/micro"
  # bf16 and FP8 alternate within each round, so that drift in the machine falls on both alike.
  for r in $(seq "$ROUNDS"); do
    for part in thinker talker; do
      for q in bf16 fp8; do
        opts=(); [ $q = fp8 ] && opts=(--option quantization=fp8)
        step "micro $part $q round $r"
        python3 benchmarks/engine/micro.py "$Q3" --parts "$part" "--$part-batches" 1,32 --steps "$STEPS" \
          --out "$OUT/micro/${part}_${q}_r$r" "${opts[@]}" >"$OUT/micro/${part}_${q}_r$r.log" 2>&1
        check "micro $part $q round $r" || tail -n 20 "$OUT/micro/${part}_${q}_r$r.log"
      done
    done
  done
fi

if want hf; then
  step "HF transformers, Qwen3-Omni-30B-A3B"
  python3 benchmarks/baselines/hf_baseline.py "$Q3" "${HF3[@]}" --out "$OUT/hf/qwen3-omni-30b-a3b"
  check "HF Qwen3-Omni"
  step "HF transformers, Qwen2.5-Omni-7B"
  python3 benchmarks/baselines/hf_baseline_qwen25.py "$Q25" --paths s2t,i2t,s2s,i2s --repeats "$HF_REPEATS" \
    --out "$OUT/hf/qwen2.5-omni-7b"
  check "HF Qwen2.5-Omni"
fi

if want fp8; then
  step "FP8 logits against bf16"
  python3 benchmarks/kernels/fp8.py "$Q3" --parts accuracy --prompts "$PROMPTS" --out "$OUT/fp8"
  check "FP8 accuracy"
fi

if want realtime; then
  step "realtime: first audio after the end of speech"
  "${SWEEP[@]}" "$Q3" "$OUT/realtime" --command "python3 benchmarks/realtime/realtime_latency.py --base-url \$BASE_URL \
    --sessions 1,16 --turns $TURNS --out $OUT/realtime/realtime_latency.json"
  check "realtime"
fi

python3 - "$OUT" <<'EOF' | tee "$OUT/summary.md"
import json, statistics, sys
from pathlib import Path

out = Path(sys.argv[1])
print("# GPU suite summary\n")
for run in sorted((out / "served").glob("*/results.json")):
    cells = json.loads(run.read_text())
    print(f"## served {run.parent.name}\n\n| cell | req/s | TTFT text p50 (s) | E2E p50 (s) | RTF p50 |\n|---|---|---|---|---|")
    for key, cell in cells.items():
        s = cell["summary"]
        rtf = s.get("rtf_p50")
        print(f"| {key} | {s['req_per_s']:.2f} | {s['ttft_text_p50']:.3f} | {s['e2e_p50']:.3f} | "
              f"{'-' if rtf is None else f'{rtf:.3f}'} |")
    print()
runs = {}
for f in sorted((out / "micro").glob("*/micro.json")):
    part, q, _ = f.parent.name.split("_")
    for row in json.loads(f.read_text()).get(part, []):
        runs.setdefault((part, q, row["batch"]), []).append(row["ms"])
if runs:
    print("## micro.py steps (ms, median of the rounds)\n\n| part | precision | B | runs | median |\n|---|---|---|---|---|")
    for (part, q, b), ms in sorted(runs.items()):
        print(f"| {part} | {q} | {b} | {' / '.join(f'{m:.2f}' for m in ms)} | {statistics.median(ms):.2f} |")
    print()
for md in sorted((out / "hf").glob("*/*.md")) + sorted((out / "fp8").glob("*.md")):
    print(f"## {md.relative_to(out)}\n\n{md.read_text()}")
EOF
if [ ${#FAILED[@]} -gt 0 ]; then
  printf 'failed: %s\n' "${FAILED[@]}" | tee -a "$OUT/summary.md"
  exit 1
fi
