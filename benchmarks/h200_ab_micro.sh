#!/usr/bin/env bash
# Same-machine A/B of `benchmarks/micro.py` across trees, interleaved so that drift (clocks, heat, the host)
# falls on every tree alike: ROUNDS rounds, each running every tree once, the order rotated each round.
# A tree is a directory with an omniwalk checkout: `.` (this one) or a copy of another commit, e.g.
#   mkdir .dev_pre && git archive 4ec7e5e | tar -x -C .dev_pre && echo /.dev_pre/ >> .git/info/exclude
# (carry it with .whl). Every tree runs its own micro.py on one skeleton, made by this tree's make-tiny.
# DIR@KEY=VALUE[,KEY=VALUE] gives that tree's runs `--option KEY=VALUE` more: one tree under two settings,
#   bash benchmarks/h200_ab_micro.sh --trees ". .@quantization=fp8" --part thinker --batches 1,32
#
#   bash benchmarks/h200_ab_micro.sh --trees ".dev_pre ." --part talker --batches 1,32 --rounds 3
#   bash benchmarks/h200_ab_micro.sh --trees ". .dev_x" --part thinker --batches 1 -- --option quantization=fp8
#   bash benchmarks/h200_ab_micro.sh --trees ".dev_pre ." --skel /tmp/tiny-skel --no-install --batches 1,2 \
#       -- --device cpu --steps 2 --option random_weights=true        # CPU smoke test (make-tiny --no-weights)
#
# Options [defaults]: --trees "DIR ..." [". "], --part thinker|talker|vocoder|encoders [talker], --batches LIST
# [1,32], --rounds N [3], --skel DIR [.gpu/full-skel, from the qwen3-omni-30b-a3b preset], --run-seconds S
# [90 a run], --compile-seconds S [60 more for each tree's first run, which compiles its Triton kernels cold: such
# runs hit 60-80 s limits in session 36], --no-install; after --, more micro.py arguments (every tree gets the same).
# Writes to $OUT (else ./h200-ab-out): summary.md (per tree and batch: ms of each run, the median, GPU busy and
# span of the profiled step) and runs.tar.gz (each run's micro.md and log). Time: ~25-40 s a run at full size
# (model build + graph capture + 10 timed steps), so 2 trees x 3 rounds ~3-4 min.
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmarks/h200_common.sh
TREES=". "; PART=talker; BATCHES=1,32; ROUNDS=3; SKEL=.gpu/full-skel; RUN_SECONDS=90; COMPILE_SECONDS=60; INSTALL=1
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --trees) TREES=$2; shift 2 ;;
    --part) PART=$2; shift 2 ;;
    --batches) BATCHES=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --skel) SKEL=$2; shift 2 ;;
    --run-seconds) RUN_SECONDS=$2; shift 2 ;;
    --compile-seconds) COMPILE_SECONDS=$2; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "unknown option $1 (see the header)"; exit 2 ;;
  esac
done
OUTDIR=${OUT:-$PWD/h200-ab-out}
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd)
RUNS=$(mktemp -d)
[ "$INSTALL" = 1 ] && { install_wheels || exit 1; }
make_skeleton "$SKEL" qwen3-omni-30b-a3b || exit 1
SKEL=$(cd "$SKEL" && pwd)
read -r -a TREE_LIST <<<"$TREES"
for spec in "${TREE_LIST[@]}"; do
  [ -f "${spec%%@*}/benchmarks/micro.py" ] || { log "${spec%%@*}: no benchmarks/micro.py (not a checkout)"; exit 2; }
done
n=${#TREE_LIST[@]}
for round in $(seq "$ROUNDS"); do
  for i in $(seq 0 $((n - 1))); do
    spec=${TREE_LIST[$(((i + round - 1) % n))]}
    dir=${spec%%@*}
    options=()
    if [ "$dir" != "$spec" ]; then
      IFS=, read -r -a pairs <<<"${spec#*@}"
      for pair in "${pairs[@]}"; do options+=(--option "$pair"); done
    fi
    name=$(basename "$(cd "$dir" && pwd)")
    [ "$dir" = . ] && name=main
    [ "$dir" != "$spec" ] && name="$name@${spec#*@}"
    out="$RUNS/${name}_r$round"
    limit=$RUN_SECONDS
    [ "$round" = 1 ] && limit=$((RUN_SECONDS + COMPILE_SECONDS))
    (cd "$dir" && PYTHONPATH=/tmp/site:$PWD timeout "$limit" python3 benchmarks/micro.py "$SKEL" --parts "$PART" \
      "--$PART-batches" "$BATCHES" --out "$out" "${EXTRA[@]}" "${options[@]}" >"$out.log" 2>&1)
    log "round $round: $name rc=$? $(grep -cE '^\| [0-9]+ \|' "$out/micro.md" 2>/dev/null) rows"
  done
done
python3 - "$RUNS" "$PART" <<'PY' | tee "$OUTDIR/summary.md"
import re, statistics, sys
from pathlib import Path

runs, part = Path(sys.argv[1]), sys.argv[2]
table = {}  # (tree, batch) -> [(ms, busy, span)]
for md in sorted(runs.glob("*/micro.md")):
    tree = md.parent.name.rsplit("_r", 1)[0]
    text = md.read_text()
    steps = {int(b): float(ms) for b, ms in re.findall(r"^\| (\d+) \| ([\d.]+) \|", text, re.M)}
    spans = {int(b): (float(busy), float(span)) for b, busy, span in
             re.findall(rf"^### {part} B=(\d+): \d+ kernels, ([\d.]+) ms busy in a ([\d.]+) ms span", text, re.M)}
    for b, ms in steps.items():
        table.setdefault((tree, b), []).append((ms, *spans.get(b, (float("nan"), float("nan")))))
print(f"# micro.py {part}: ms per step by tree (runs in round order; median), GPU busy / span of the profiled step\n")
print("| tree | batch | runs (ms) | median | busy ms (median) | span ms (median) |\n|---|---|---|---|---|---|")
for (tree, b), rows in sorted(table.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    ms, busy, span = zip(*rows)
    busy_s, span_s = (f"{statistics.median(v):.2f}" if v[0] == v[0] else "-" for v in (busy, span))  # (nan: no profile)
    print(f"| {tree} | {b} | {' / '.join(f'{x:g}' for x in ms)} | {statistics.median(ms):.2f} | {busy_s} | {span_s} |")
PY
tar -czf "$OUTDIR/runs.tar.gz" -C "$RUNS" .
log "done: $OUTDIR/summary.md, runs.tar.gz"
