#!/usr/bin/env bash
# One device call's share of a long `sglang-mixgraph ab` run on the GPU machine, resumable across
# calls (a call is limited to minutes, a run of the slice takes longer). Inside device.sh, from
# the repository root:
#   bash tools/gpu-upstream/device.sh bash tools/rank-slice/device_ab.sh CONFIG RUN.tgz SECONDS [AB ARGS]
# - restores the cells of earlier calls from RUN.tgz when it exists (e.g. ab_runs/slice.tgz:
#   carry ab_runs);
# - unless this machine's Triton cache says it has served CONFIG already (a marker file in the
#   cache, so it also travels in a carried triton_cache.txz), first serves one throwaway visit
#   of one whole cell (warm_caches.py; WARM_ARM=NAME picks its arm, default the first): a fresh
#   machine's first eager server ran 13-18% slower than later ones, compiling a metadata kernel
#   per range of running requests that a shorter warm-up never reached. A cache warmed by another model does
#   not count (other kernel shapes), nor did a breakable-graph arm's visit warm the eager arms
#   on the H200, so keep an eager arm first or as WARM_ARM;
# - runs `ab run` until SECONDS have passed, then SIGTERM: ab stops the server, keeps finished
#   cells and writes its report;
# - packs the run directory into $OUT/NAME.tgz, NAME being RUN.tgz's (a device call returns few
#   files, two folders deep). Next call: copy that file to RUN.tgz and run the same command.
set -uo pipefail
[[ $# -ge 3 ]] || { echo "usage: device_ab.sh CONFIG RUN.tgz SECONDS [AB ARGS]" >&2; exit 2; }
CONFIG=$1 RESUME=$2 SECONDS_LEFT=$3 NAME=$(basename "$2" .tgz)
shift 3
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT=${OUT:-/tmp/device_ab_out}
RUNS=${TMPDIR:-/tmp}/ab_runs
T0=$(date +%s)
mkdir -p "$RUNS" "$OUT"
[[ -f "$RESUME" ]] && tar xzf "$RESUME" -C "$RUNS" \
  && echo "device_ab: restored $(ls "$RUNS/$NAME/cells"/*/ 2>/dev/null | grep -c jsonl) cell files"
MODEL=$(python3 -c "import sys,tomllib; print(tomllib.load(open(sys.argv[1],'rb'))['server']['model_path'])" "$CONFIG")
[[ -f "$MODEL/config.json" ]] || python3 "$ROOT/tools/rank-slice/make_slice_model.py" "$MODEL" > /dev/null
# SGLang points Triton's cache into its own cache directory (environ.third_party_cache_defaults).
WARMED="${SGLANG_CACHE_DIR:-$HOME/.cache/sglang}/triton/mixgraph_warmed_by_$(basename "$CONFIG" .toml)"
if [[ ! -f "$WARMED" ]]; then
  echo "device_ab: this machine's Triton cache has not served $CONFIG: one throwaway visit first"
  timeout -s TERM $((SECONDS_LEFT / 2)) python3 "$ROOT/tools/rank-slice/warm_caches.py" "$CONFIG" ${WARM_ARM:+--arm "$WARM_ARM"}
  rc=$?
  echo "device_ab: warm-up visit done (rc $rc)"
  [[ $rc -eq 0 ]] && mkdir -p "$(dirname "$WARMED")" && touch "$WARMED"
fi
LEFT=$((SECONDS_LEFT - ($(date +%s) - T0)))
if [[ $LEFT -gt 60 ]]; then
  timeout -s TERM "$LEFT" python3 -m sglang_mixgraph.cli ab run "$CONFIG" --run-dir "$RUNS/$NAME" "$@"
  echo "device_ab: ab exited $?"
else
  echo "device_ab: ${LEFT}s left after the warm-up: no measured visit this call"
fi
tar czf "$OUT/$NAME.tgz" -C "$RUNS" "$NAME" && echo "device_ab: $OUT/$NAME.tgz"
