#!/usr/bin/env bash
# One device call of the regime map: a cell's visits of `upstream` (eager) and `bcg-auto-lean`
# (replayed), alternating, as regime_map.py plans them to fit one call. Inside device.sh, from
# the repository root, on a machine with the kit and TileLang (carry .gpu-tilelang and
# python/sglang_mixgraph.egg-info):
#   bash tools/gpu-upstream/device.sh bash tools/rank-slice/regime_map.sh CELL [CALL]
# CELL is PREFILLxCONTEXT (1024x2k ... 4096x8k: `python3 tools/rank-slice/regime_map.py plan`);
# CALL (default 1) numbers the calls of a cell planned over two. The probe's report and logs go
# to $OUT/CELL-CALL/.
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: regime_map.sh CELL [CALL]" >&2; exit 2; }
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CELL=$1 CALL=${2:-1}
ARGS=$(python3 "$HERE/regime_map.py" args "$CELL" "$CALL")
DEST="${OUT:-/tmp/rank_slice_out}/$CELL-$CALL"
echo "regime map $CELL call $CALL: run_slice_probe.py $ARGS"
# shellcheck disable=SC2086  # the planned arguments, one word each
python3 "$HERE/run_slice_probe.py" $ARGS --out "$DEST"
