#!/usr/bin/env python3
"""`sglang-mixgraph advise` with its defaults against a live SGLang server of the slice, in one
device call (inside tools/gpu-upstream/device.sh, from the repository root):

    bash tools/gpu-upstream/device.sh python3 tools/rank-slice/advise_real.py [--layers N] [--budget-s S]
        [--config TOML --arm NAME --fp8] [--server-log] [--load-args 'ARGS']

Writes the slice model (`make_slice_model.py --layers N [--fp8]`), starts it through
`sglang-mixgraph ab`'s own launcher (`ab.server.launch`: the process group, the health wait,
the stop) with an `ab` configuration's server (`ab_slice.toml` unless --config; one source for
both) plus SGLang's breakable prefill graph, or as the configuration's arm NAME (--arm: advise
against an arm a serving A/B measured), then runs `advise --url URL --load --json` with nothing
else on its command line, as a user would (`--server-log`: and the server's log;
`--load-args`: and the burst's shape).
Records in $OUT (or --out): `timeline.log` (what happened when), `advise.json`, `advise.err`,
`server.log`. Exit 0 when advise exited 0 with a MIXED step among its rows; 1 otherwise, and the
timeline says which step failed. The server is stopped (its whole process group) on every path.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
AB_CONFIG = REPO / "tools" / "rank-slice" / "ab_slice.toml"


class Timeline:
    def __init__(self, out: Path) -> None:
        self.t0 = time.monotonic()
        self.path = out / "timeline.log"

    def __call__(self, line: str) -> None:
        text = f"[advise-real {time.monotonic() - self.t0:5.0f}s] {line}"
        print(text, flush=True)
        with open(self.path, "a") as f:
            f.write(text + "\n")


def slice_server(
    model: Path, health_timeout_s: float, config: Path = AB_CONFIG, arm_name: str | None = None
):
    """An `ab` configuration's server for `model`, as `ab` reads it, and one arm: the
    configuration's `arm_name`, or one that adds SGLang's breakable prefill graph (0.5.23's
    default bucket list). An arm the configuration lacks is a one-line SystemExit."""
    from sglang_mixgraph.ab.config import ConfigError, read_toml
    from sglang_mixgraph.ab.config_schema import validated

    try:
        document = read_toml(config)
    except ConfigError as e:
        raise SystemExit(f"advise_real: {e}") from None
    server = document["server"]  # the server only: no sweep runs here
    server = {**server, "model_path": str(model), "health_timeout_s": health_timeout_s}
    arm = {"name": "breakable", "args": ["--cuda-graph-backend-prefill", "breakable"]}
    if arm_name is not None:
        arms = {a.get("name"): a for a in document.get("arm", [])}
        if arm_name not in arms:
            raise SystemExit(
                f"advise_real: {config.name} has no arm {arm_name!r} (its arms: "
                f"{', '.join(map(str, arms)) or 'none'})"
            )
        arm = arms[arm_name]
    # The schema's checks only: parse_config's are about runs of two arms or a GSM8K gate.
    config = validated({"server": server, "arm": [arm]})
    return config, config.arms[0]


def missing_for_http() -> str | None:
    """What an HTTP server of DeepSeek-V4 needs that an Engine run does not: SGLang builds
    DeepSeek's chat encoder at start and exits without it (after about a minute)."""
    if importlib.util.find_spec("deepseek_recipe") is None:
        return (
            "deepseek-recipe is not installed: carry .gpu-upstream/chat/ (its own call: the whole kit "
            "and the tree overflow the carry limit) "
            "(tools/gpu-upstream/prepare.sh puts the wheel there)"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4, help="slice layers (default 4: a quick start)")
    p.add_argument("--budget-s", type=float, default=280, help="stop everything after this")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/advise_real")))
    p.add_argument("--config", type=Path, default=AB_CONFIG, help="the ab configuration's server")
    p.add_argument("--arm", help="serve this arm of --config (default: a breakable-graph arm)")
    p.add_argument("--fp8", action="store_true", help="the FP8 slice (make_slice_model --fp8)")
    p.add_argument(
        "--server-log",
        action="store_true",
        help="give advise the server's log (--server-log): the eager host priced unprofiled",
    )
    p.add_argument(
        "--load-args",
        default="",
        help="advise's --load-args (the burst's shape, e.g. the serving A/B's lengths)",
    )
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    log = Timeline(args.out)
    deadline = time.monotonic() + args.budget_s
    if problem := missing_for_http():
        log(problem)
        return 1
    model = Path(f"/tmp/rank_slice/model_l{args.layers}{'_fp8' if args.fp8 else ''}")
    slice_server(model, 10.0, args.config, args.arm)  # a wrong --config or --arm before any work
    made = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools/rank-slice/make_slice_model.py"),
            str(model),
            "--layers",
            str(args.layers),
            *(["--fp8"] if args.fp8 else []),
        ],
        capture_output=True,
        text=True,
    )
    log(f"slice model ({args.layers} layers) rc={made.returncode}: {made.stdout.strip()[-200:]}")
    if made.returncode:
        log(made.stderr.strip()[-400:])
        return 1
    from sglang_mixgraph.ab.server import ServerError, launch, launch_argv

    timeout = max(10.0, deadline - time.monotonic() - 60)
    config, arm = slice_server(model, timeout, args.config, args.arm)
    url = f"http://{config.server.host}:{config.server.port}"
    log(f"server: {' '.join(launch_argv(config, arm))}")
    try:
        server = launch(config, arm, args.out / "server.log")
    except ServerError as e:
        log(f"server not healthy: {e}")
        return 1
    log("server healthy")
    try:
        advise = [
            sys.executable,
            "-m",
            "sglang_mixgraph.cli",
            "advise",
            "--url",
            url,
            "--load",
            "--json",
        ]
        if args.server_log:
            advise += ["--server-log", str(args.out / "server.log")]
        if args.load_args:
            advise += ["--load-args", args.load_args]
        t = time.monotonic()
        try:
            res = subprocess.run(
                advise,
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=max(10.0, deadline - time.monotonic()),
            )
            rc, stdout, stderr = res.returncode, res.stdout, res.stderr
        except subprocess.TimeoutExpired as e:
            rc, stdout, stderr = "timeout", e.stdout or "", (e.stderr or "") + "\n(budget ran out)"
            stdout = stdout.decode() if isinstance(stdout, bytes) else stdout
            stderr = stderr.decode() if isinstance(stderr, bytes) else stderr
        (args.out / "advise.json").write_text(stdout)
        (args.out / "advise.err").write_text(stderr)
        log(
            f"advise {' '.join(advise[3:])}: rc={rc} in {time.monotonic() - t:.0f}s; "
            f"stderr: {stderr.strip()[-300:]}"
        )
        try:
            answer = json.loads(stdout)
        except ValueError as e:
            log(f"advise JSON unreadable: {e!r}")
            return 1
        log(f"profile {json.dumps(answer.get('profile'))}")
        rows = answer.get("steps", [])
        for row in rows:
            log(f"steps row {json.dumps(row)}")
        for v in answer.get("verdicts", []):
            log(f"verdict {json.dumps(v)[:400]}")
        mixed = any(r.get("mode") == "MIXED" for r in rows)
        log(f"MIXED step profiled: {mixed}")
        return 0 if rc == 0 and mixed else 1
    finally:
        server.stop()
        log("server stopped")


if __name__ == "__main__":
    sys.exit(main())
