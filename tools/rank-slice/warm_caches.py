"""One throwaway server visit before a measured `sglang-mixgraph ab` run on a fresh GPU machine.

A fresh machine starts with empty kernel caches: the first SGLang server compiles Triton's
kernels (and SGLang's JIT ones where no cache was carried) while it serves, and runs slower
than every later server, which find them on disk. On the H200 the first visit of a run served
89.4 output tok/s against 106.6-106.8 for the two after it (same configuration otherwise).
This runs the configuration's first visit (its first arm at the first concurrency) with ab's own
runner into a throwaway run directory, so the measured run starts with warm caches.

    python3 tools/rank-slice/warm_caches.py tools/rank-slice/ab_slice.toml [RUN_DIR]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from sglang_mixgraph.ab import config as ab_config
from sglang_mixgraph.ab import runner


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: warm_caches.py CONFIG.toml [RUN_DIR]", file=sys.stderr)
        return 2
    config = ab_config.parse_config(ab_config.read_toml(argv[0]))
    run_dir = Path(argv[1] if len(argv) == 2 else tempfile.mkdtemp(prefix="ab_warm_"))
    first = runner.plan(config)[:1]
    first[0].cells[:] = first[0].cells[:1]
    outcome = runner.run(config, run_dir, first)
    return 0 if not outcome.errors and not outcome.interrupted else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
