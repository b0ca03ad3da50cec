# Sourced by cpfold's call scripts (run from .dev_cpfold/new with ../../.whl carried): a deadline for the
# whole call (LIMIT seconds) and `step SECONDS CMD...`, which runs CMD with at most SECONDS (and what is
# left), its output appended to $OUT/log.txt. (session 26's talk/common.sh, copied)
T0=$SECONDS
LOG=$OUT/log.txt
left() { echo $((LIMIT - (SECONDS - T0))); }
step() {
  local want=$1 t
  shift
  t=$(left)
  [ "$want" -lt "$t" ] && t=$want
  if [ "$t" -le 5 ]; then echo "[skip: no time] $*" | tee -a "$LOG"; return 0; fi
  echo "=== [$((SECONDS - T0))s] $* (limit ${t}s)" | tee -a "$LOG"
  timeout "$t" "$@" >>"$LOG" 2>&1
  echo "=== [$((SECONDS - T0))s] rc=$?" | tee -a "$LOG"
}
install() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    ../../.whl/*.whl "$@" || exit 1
}
