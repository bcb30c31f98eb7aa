"""One throwaway server visit before a measured `sglang-mixgraph ab` run on a fresh GPU machine.

A fresh machine starts with empty kernel caches: the first SGLang server compiles Triton's
kernels (and SGLang's JIT ones where no cache was carried) while it serves, and runs slower
than every later server, which find them on disk. On the H200 the first visit of a run served
89.4 output tok/s against 106.6-106.8 for the two after it (same configuration otherwise).
This serves one short cell of one arm (by default the first) with ab's own runner into a
throwaway run directory, so the measured run starts with warm caches. Warm with an eager arm:
on the H200 a visit of a breakable-graph arm did not warm the eager path (the eager `upstream`
visit after it served 85.8 tok/s, the eager `split-eager` visit after that 106.8).

    python3 tools/rank-slice/warm_caches.py CONFIG.toml [--arm NAME] [--prompts N] [RUN_DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from sglang_mixgraph.ab import config as ab_config
from sglang_mixgraph.ab import runner


def warm_config(raw: dict, arm: str | None, prompts: int) -> ab_config.Config:
    """The configuration with `arm` first, one repeat and `prompts` short prompts."""
    config = ab_config.parse_config(raw)
    names = [a.name for a in config.arms]
    if arm is not None and arm not in names:
        raise ab_config.ConfigError(f"--arm {arm!r}: the configuration's arms are {names}")
    chosen = arm or names[0]
    # The chosen arm first (ab wants two arms; only the first visit is served).
    raw = dict(raw, arm=sorted(raw["arm"], key=lambda t: t["name"] != chosen))
    sweep = {
        k: v for k, v in raw["sweep"].items() if k not in ("prompts_per_concurrency", "min_prompts")
    }
    sweep.update(num_prompts=prompts, warmup_requests=1, repeats=1)
    sweep["output_len"] = min(int(sweep.get("output_len", 16)), 16)
    raw["sweep"] = sweep
    raw.pop("gate", None)
    raw["gsm8k"] = {"enabled": False}
    return ab_config.parse_config(raw)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="warm_caches.py", description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("run_dir", nargs="?")
    parser.add_argument("--arm", help="the arm to serve (default: the first)")
    parser.add_argument("--prompts", type=int, default=16, help="prompts in the cell (default 16)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        config = warm_config(ab_config.read_toml(args.config), args.arm, args.prompts)
    except ab_config.ConfigError as exc:
        print(f"warm_caches.py: {exc}", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="ab_warm_"))
    first = runner.plan(config)[:1]
    first[0].cells[:] = first[0].cells[:1]
    outcome = runner.run(config, run_dir, first)
    return 0 if not outcome.errors and not outcome.interrupted else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
