#!/usr/bin/env bash
# One device call's share of a long `sglang-mixgraph ab` run on the GPU machine, resumable across
# calls (a call is limited to minutes, a run of the slice takes longer). Inside device.sh, from
# the repository root:
#   bash tools/gpu-upstream/device.sh bash tools/rank-slice/device_ab.sh CONFIG RUN.tgz SECONDS [AB ARGS]
# - restores the cells of earlier calls from RUN.tgz when it exists (e.g. ab_runs/slice.tgz:
#   carry ab_runs);
# - the configuration's `[sweep] warm_visit` serves one discarded visit first on a machine that
#   has served nothing of the run (ab's own rule: a fresh machine's first eager server ran 13-18%
#   slower than later ones, compiling DSV4's metadata kernel per range of running requests);
#   give `--max-blocks 1` (and `--machine ID` where host and boot do not tell machines apart) to
#   measure one block per machine;
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
# The slice model, built here when missing: FP8 where the configuration runs the kit's FP8 GEMM
# stand-in (MIXGRAPH_KIT_FP8_GEMM), which a bf16 model would leave unused without a word.
read -r MODEL FP8 < <(python3 -c "import sys,tomllib; s=tomllib.load(open(sys.argv[1],'rb'))['server']; print(s['model_path'], '--fp8' if 'MIXGRAPH_KIT_FP8_GEMM' in s.get('env', {}) else '')" "$CONFIG")
[[ -f "$MODEL/config.json" ]] || python3 "$ROOT/tools/rank-slice/make_slice_model.py" "$MODEL" $FP8 > /dev/null
LEFT=$((SECONDS_LEFT - ($(date +%s) - T0)))
timeout -s TERM "$LEFT" python3 -m sglang_mixgraph.cli ab run "$CONFIG" --run-dir "$RUNS/$NAME" "$@"
echo "device_ab: ab exited $?"
tar czf "$OUT/$NAME.tgz" -C "$RUNS" "$NAME" && echo "device_ab: $OUT/$NAME.tgz"
