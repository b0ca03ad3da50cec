#!/usr/bin/env bash
# Session 29, device calls 3 and 4: issue 17's before/after bench on one machine. `.dev_pre/` holds
# `git archive 4ec7e5e | tar -x -C .dev_pre` (the tree before the family lift; carried with .whl); main is the
# checkout. Each tree runs its own h200_sweep.sh (serve + bench) on the same skeleton: s2t, s2s at B = 1, 32,
# N = max(20, 4 B). Call 3: pre first, then main (ORDER="pre main", the default); call 4: ORDER="main pre".
set -uo pipefail
START_EPOCH=$(date +%s.%N)
. benchmarks/h200_common.sh
install_wheels || exit 1
make_skeleton .gpu/full-skel qwen3-omni-30b-a3b || exit 1
ARGS=(--paths s2t,s2s --concurrency 1,32 --min-requests 20 --requests-per-concurrency 4 --max-seconds 255
  --skel "$PWD/.gpu/full-skel" --no-install)
for t in ${ORDER:-pre main}; do
  if [ "$t" = pre ]; then
    (cd .dev_pre && PYTHONPATH=/tmp/site:$PWD bash benchmarks/h200_sweep.sh "${ARGS[@]}" --port 8021 --out /tmp/pre >/tmp/pre.log 2>&1)
  else
    PYTHONPATH=/tmp/site:$PWD bash benchmarks/h200_sweep.sh "${ARGS[@]}" --port 8022 --out /tmp/main >/tmp/main.log 2>&1
  fi
  log "$t done"; grep "^| s2" /tmp/$t/results.md
done
for t in pre main; do cp /tmp/$t/results.md "$OUT/$t.md"; cp /tmp/$t/results.json "$OUT/$t.json"; done
[ "${ORDER:-pre main}" = "pre main" ] && tar -czf "$OUT/logs.tar.gz" -C /tmp pre.log main.log pre/sweep.log main/sweep.log pre/server.log main/server.log
