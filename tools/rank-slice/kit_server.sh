#!/usr/bin/env bash
# Launch prefix for `sglang-mixgraph ab` on the GPU machine, inside tools/gpu-upstream/device.sh:
# puts the kit's Engine stand-ins (tools/gpu-upstream/engine) first on PYTHONPATH, then runs the
# server command it is given.
#   [server] launch_prefix = ["bash", "tools/rank-slice/kit_server.sh"]
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="$ROOT/tools/gpu-upstream/engine:$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
exec "$@"
