# Sourced after gpu_env.sh by the benchmarks/gpu_*.sh scripts on the lent H200: one log per call
# ($OUT/NAME.log, starting with the versions gpu_env.sh found) and `step`, which runs one command
# under a time limit and appends its exit status, its seconds and the tail of its output (JSON
# lines and warnings left out; STEP_TAIL lines, 40 by default) to the log.
#   gpu_log NAME
#   step SECONDS NAME COMMAND...
gpu_log() {
  log="$OUT/$1.log"
  cat "$OUT/env.txt" >>"$log" && rm -f "$OUT/env.txt" "$OUT/install.log"
}
step() {
  local limit=$1 name=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
  echo "== $name: exit $?, $((SECONDS - t0)) s" | tee -a "$log"
  grep -v '^{' "$OUT/$name.txt" | grep -v -i warn | tail -n "${STEP_TAIL:-40}" >>"$log"
  rm -f "$OUT/$name.txt"
}
