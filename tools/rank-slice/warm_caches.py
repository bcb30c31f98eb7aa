"""One throwaway server visit before a measured `sglang-mixgraph ab` run on a fresh GPU machine.

A fresh machine starts with empty kernel caches: the first SGLang server compiles kernels while it
serves and runs slower than every later one. On the H200 the first measured visit served 89.4,
87.1 and 92.3 output tok/s against 106.5-106.8 for every later visit. The cause, from SGLang's
own log ("took 1.37 s to compile after serving started"): DeepSeek-V4's metadata kernel
`_expand_prefill_causally_kernel` is compiled per power of two of the step's request count
(`BS_P2`), so each new range of running requests (17-32, 33-64, 65-128) compiles it mid-run. A
short warm-up cell of 16 prompts never reached those counts and did not help; this serves one
whole cell of the configuration (its first load point, same prompts and lengths) with one arm
(by default the first; use an eager one: a breakable-graph visit did not warm the eager path),
through ab's own runner into a throwaway run directory.

    python3 tools/rank-slice/warm_caches.py CONFIG.toml [--arm NAME] [RUN_DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from sglang_mixgraph.ab import config as ab_config
from sglang_mixgraph.ab import runner


def warm_config(raw: dict, arm: str | None) -> ab_config.Config:
    """The configuration with `arm` first and one repeat, its cells unchanged."""
    config = ab_config.parse_config(raw)
    names = [a.name for a in config.arms]
    if arm is not None and arm not in names:
        raise ab_config.ConfigError(f"--arm {arm!r}: the configuration's arms are {names}")
    chosen = arm or names[0]
    # The chosen arm first (ab wants two arms; only the first visit is served).
    raw = dict(raw, arm=sorted(raw["arm"], key=lambda t: t["name"] != chosen))
    raw["sweep"] = dict(raw["sweep"], repeats=1)
    raw.pop("gate", None)
    raw["gsm8k"] = {"enabled": False}
    return ab_config.parse_config(raw)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="warm_caches.py", description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("run_dir", nargs="?")
    parser.add_argument("--arm", help="the arm to serve (default: the first)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        config = warm_config(ab_config.read_toml(args.config), args.arm)
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
