#!/usr/bin/env bash
# The GPU checks in one device call, run inside device.sh from the repository root:
#   bash tools/gpu-upstream/device.sh bash tools/gpu-upstream/verify.sh SECONDS [CHECK ...]
# CHECK: gpu_upstream (the GPU-upstream suite), e2e_short (the end-to-end harness, short
# workload, radix cache on, all phases), e2e_pressure (its pressure workload: a small pool,
# retractions, evictions, client aborts); all three by default. SECONDS is shared out 3:4:4
# among the chosen checks (the two end-to-end runs take about 180-200 s each on an H200, the
# suite 40 s with a warm JIT cache, longer while Triton compiles). Few files come back from a GPU machine, so $OUT gets
# one log per check and e2e_runs.tgz (the end-to-end results and phase logs). The end-to-end runs
# use the kit's kernel selection MIXGRAPH_KIT_KERNELS (standin by default; faithful with TileLang
# carried, tools/gpu-upstream/prepare.sh).
set -uo pipefail
[[ $# -ge 1 ]] || { echo "usage: verify.sh SECONDS [gpu_upstream|e2e_short|e2e_pressure ...]" >&2; exit 2; }
TOTAL=$1
shift
CHECKS=("$@")
[[ ${#CHECKS[@]} -gt 0 ]] || CHECKS=(gpu_upstream e2e_short e2e_pressure)
declare -A WEIGHT=([gpu_upstream]=3 [e2e_short]=4 [e2e_pressure]=4)
SUM=0
for c in "${CHECKS[@]}"; do
  [[ -n "${WEIGHT[$c]:-}" ]] || { echo "verify.sh: unknown check '$c'" >&2; exit 2; }
  SUM=$((SUM + WEIGHT[$c]))
done
OUT=${OUT:-/tmp/verify_out}
mkdir -p "$OUT"
for c in "${CHECKS[@]}"; do
  s=$((TOTAL * WEIGHT[$c] / SUM))
  case $c in
    gpu_upstream) cmd=(python3 -m pytest test/gpu_upstream -q -p no:cacheprovider --durations=12) ;;
    # run_e2e.py stops its phases at --budget-s; the timeout only guards against a hang.
    e2e_*) w=${c#e2e_}
      cmd=(python3 test/gpu_e2e/run_e2e.py --workload "$w" --budget-s $((s - 15)) --out "/tmp/$c" --label "verify-$w" \
           --kernels "${MIXGRAPH_KIT_KERNELS:-standin}") ;;
  esac
  timeout -s TERM "$s" "${cmd[@]}" > "$OUT/$c.log" 2>&1
  echo "verify: $c exited $? (limit ${s}s); last lines:"
  tail -n 3 "$OUT/$c.log"
done
ls -d /tmp/e2e_* > /dev/null 2>&1 && tar czf "$OUT/e2e_runs.tgz" -C /tmp $(cd /tmp && ls -d e2e_*)
exit 0
