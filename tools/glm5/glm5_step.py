#!/usr/bin/env python3
"""GLM-5's one-rank prefill step, timed: 78 layers of GLM-5's attention (tiny MoE) on one GPU.

    bash tools/gpu-upstream/device.sh python3 tools/glm5/glm5_step.py --out results/

One Engine per arm, each in a worker process of its own, all started before the first timing
(sequentially: 78 layers of dummy weights, about 31 GB each, and the captures):

* ``eager``: no CUDA graph;
* ``bcg``: SGLang's breakable prefill graph, captured at exactly the timed prompt lengths;
* ``bcg-des``: the same with ``drop_empty_segments`` (SGLANG_OPT_BCG_DROP_EMPTY_SEGMENTS=1).

The Engines start in the order ``--arms`` gives; ``NAME#2`` starts a second Engine of an arm,
and ``summary.same_arm`` gives the two's ratio: how far two processes of one configuration
time apart, the floor under any other ratio of the run.

SGLang 0.5.23 has no piecewise prefill graph (it refuses ``tc_piecewise``: "tc_piecewise was
removed"), so breakable against piecewise is reported as not measurable, with breakable
against eager beside it. Each round sends, for every prompt length (1k and 8k by default), one
fresh random prompt (one new token, radix cache off) to every arm, in an order that rotates with
the round; the step is the Engine's own forward of that prompt (``ModelRunner.forward`` between
two CUDA synchronizations, glm5_step_timer.py). Ratios are paired within a round; the summary
gives the median of the per-round ratios and a distribution-free 95 % interval of that median
(order statistics). The first ``--warmup`` rounds are discarded. Writes ``glm5_step.json`` (a
top-level ``summary``: ``drop_empty_segments_gain``, ``breakable_vs_piecewise_8k``,
``breakable_vs_eager_8k``, the empty segments the des arm dropped, and ``e2e_checks`` /
``e2e_failed`` from ``--e2e-results``) and ``glm5_step.log`` to ``--out``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

WORKER = Path(__file__).resolve()  # what each arm's process runs (the CPU tests swap it)
HERE = WORKER.parent
ROOT = HERE.parents[1]
ARMS = ("eager", "bcg", "bcg-des")
DES_FLAG = "SGLANG_OPT_BCG_DROP_EMPTY_SEGMENTS"
MARK = "GLM5_STEP "  # the worker's protocol lines on stdout; everything else is the Engine's log
VOCAB_LO, VOCAB_HI = 10, 150000  # token ids away from GLM-5's special ids at the top
NOT_PIECEWISE = (
    "SGLang 0.5.23 has no piecewise prefill graph (--cuda-graph-backend-prefill tc_piecewise: "
    "'tc_piecewise was removed'); breakable_vs_eager_8k is measured instead"
)


# ---- arguments ----------------------------------------------------------------------------


def _positive_ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated whole numbers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: positive whole numbers")
    return sorted(set(values))


def base_arm(label: str) -> str:
    """The configuration an arm runs: ``bcg#2`` is a second Engine of ``bcg``."""
    return label.split("#", 1)[0]


def _arms(text: str) -> list[str]:
    arms = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in arms if base_arm(a) not in ARMS or a.count("#") > 1 or a.endswith("#")]
    if bad or not arms or len(set(arms)) != len(arms):
        raise argparse.ArgumentTypeError(
            f"{text!r}: arms among {','.join(ARMS)}, each once (a second Engine of one: NAME#2)"
        )
    return arms  # the order given is the order the Engines start in


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line on stderr, exit status 2
        print(f"glm5_step: {message}", file=sys.stderr)
        sys.exit(2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = _Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "glm5_step_out"))
    ap.add_argument("--layers", type=int, default=78, help="GLM-5's 78 by default")
    ap.add_argument("--lengths", type=_positive_ints, default=[1024, 8192], help="prompt tokens")
    ap.add_argument("--rounds", type=int, default=10, help="timed rounds (each: every arm, length)")
    ap.add_argument("--warmup", type=int, default=2, help="rounds run first and discarded")
    ap.add_argument(
        "--arms",
        type=_arms,
        default=list(ARMS),
        help=f"among {','.join(ARMS)}, started in this order; NAME#2 starts a second Engine of one",
    )
    ap.add_argument("--budget-s", type=float, default=560, help="the whole run's deadline")
    ap.add_argument("--e2e-results", type=Path, help="run_e2e.py's e2e_results.json (GLM-5)")
    ap.add_argument("--worker", choices=ARMS, help=argparse.SUPPRESS)  # an arm's Engine process
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.layers < 2:
        ap.error(f"--layers {args.layers}: at least 2")
    if args.rounds < 1 or args.warmup < 0:
        ap.error(f"--rounds {args.rounds} --warmup {args.warmup}: at least 1 round, warmup >= 0")
    if args.e2e_results is not None and not args.e2e_results.is_file():
        ap.error(f"--e2e-results {args.e2e_results}: no such file")
    return args


# ---- arms ---------------------------------------------------------------------------------


def engine_kwargs(arm: str, model_dir: str, lengths: list[int]) -> dict:
    """One request at a time, one EXTEND step per prompt (the chunk holds the longest), the
    radix cache off (every prompt prefilled whole), the breakable graph captured at exactly
    the timed lengths (no padding); the kit's GLM-5 kernels."""
    from sglang_mixgraph.kits.gpu_machine import GLM5_ENGINE

    longest = max(lengths)
    kwargs = dict(
        model_path=model_dir,
        skip_tokenizer_init=True,
        load_format="dummy",
        tp_size=1,
        chunked_prefill_size=longest,
        max_running_requests=4,
        max_total_tokens=4 * longest,
        moe_runner_backend="triton",
        # The arms' Engines start one after another on one GPU, each SGLang check seeing only
        # what the earlier ones left: at 0.6 the third 78-layer Engine (37.4 GB of weights)
        # was refused on the H200 (it needed > 0.615); the KV pool is capped by
        # max_total_tokens either way.
        mem_fraction_static=0.85,
        random_seed=1,
        disable_radix_cache=True,
        log_level="info",
        **GLM5_ENGINE,
    )
    if arm == "eager":
        kwargs["disable_cuda_graph"] = True
    else:
        kwargs.update(
            cuda_graph_backend_prefill="breakable",
            cuda_graph_backend_decode="full",
            cuda_graph_bs_prefill=list(lengths),
            cuda_graph_max_bs_decode=4,
        )
    return kwargs


def arm_env(arm: str, log_dir: str) -> dict:
    from sglang_mixgraph.kits import gpu_machine
    from sglang_mixgraph.patches import all_patches

    env = dict(os.environ)
    env.update(gpu_machine.NO_MULTICAST_ENV)
    env.update(gpu_machine.GLM5_ENV)
    env.update({f.name: f.off_value for p in all_patches() for f in p.flags})
    env[DES_FLAG] = "1" if arm == "bcg-des" else "0"
    env["SGLANG_MIXGRAPH_COUNTERS_LOG_INTERVAL"] = "1"
    paths = [
        str(ROOT / "python"),
        str(gpu_machine.ENGINE_DIR),
        str(HERE),
        env.get("PYTHONPATH", ""),
    ]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["MIXGRAPH_E2E_STARTUP"] = "glm5_step_timer"
    env["GLM5_STEP_LOG"] = log_dir
    env["PYTHONUNBUFFERED"] = "1"
    return env


def schedule(arms: list[str], lengths: list[int], rounds: int) -> list[tuple[int, int, str]]:
    """(round, length, arm) in run order: every arm at every length each round, the arms'
    order rotated by one each round so no arm always goes first after another."""
    out = []
    for r in range(rounds):
        order = arms[r % len(arms) :] + arms[: r % len(arms)]
        out += [(r, n, a) for n in lengths for a in order]
    return out


# ---- statistics ---------------------------------------------------------------------------


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def median_interval(xs: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """(lo, hi, coverage): the widest order statistics x_(k), x_(n+1-k) whose interval holds
    the median with probability >= ``level`` (binomial, distribution-free); with too few values
    for that, the extremes and their (lower) coverage."""
    s = sorted(xs)
    n = len(s)
    if n == 0:
        raise ValueError("no values")

    def below(k: int) -> float:  # P(Binomial(n, 1/2) < k)
        return sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= (n + 1) // 2 and 1 - 2 * below(k + 1) >= level:
        k += 1
    return s[k - 1], s[n - k], 1 - 2 * below(k)


def ratio_stats(num: list[float], den: list[float]) -> dict:
    """Per-round ratios num/den (paired by round): their median and its interval."""
    if len(num) != len(den) or not num:
        raise ValueError(f"paired samples needed: {len(num)} and {len(den)}")
    ratios = [a / b for a, b in zip(num, den, strict=True)]
    lo, hi, coverage = median_interval(ratios)
    return {
        "ratio": round(median(ratios), 5),
        "lo": round(lo, 5),
        "hi": round(hi, 5),
        "coverage": round(coverage, 4),
        "rounds": len(ratios),
    }


def summarize(samples: dict, lengths: list[int], arms: list[str], host: dict | None = None) -> dict:
    """``samples[arm][length]``: the timed rounds' step ms, in round order; ``host`` the same
    shape, the host's part of each step (the per-arm medians only)."""

    def medians(a: str, n: int) -> dict:
        out = {"median_ms": round(median(samples[a][n]), 3)}
        if host and host[a][n]:
            out["host_median_ms"] = round(median(host[a][n]), 3)
        return out

    per = {a: {str(n): medians(a, n) for n in lengths if samples[a][n]} for a in arms}

    def ratio(num: str, den: str, n: int, definition: str) -> dict:
        if num in arms and den in arms and samples[num][n] and samples[den][n]:
            # a run stopped at its deadline may have timed one arm a round more: pair what both have
            m = min(len(samples[num][n]), len(samples[den][n]))
            pair = samples[num][n][:m], samples[den][n][:m]
            return dict(ratio_stats(*pair), prompt=n, definition=definition)
        return {"ratio": None, "lo": None, "hi": None, "prompt": n, "why": f"needs {num} and {den}"}

    short, long_ = min(lengths), max(lengths)
    same_arm = {
        twin: ratio(base_arm(twin), twin, short, f"{base_arm(twin)} step ms / {twin} step ms")
        for twin in arms
        if twin != base_arm(twin)
    }
    return {
        "drop_empty_segments_gain": ratio(
            "bcg", "bcg-des", short, "bcg step ms / bcg-des step ms (> 1: dropping is faster)"
        ),
        "drop_empty_segments_gain_long": ratio(
            "bcg", "bcg-des", long_, "bcg step ms / bcg-des step ms (> 1: dropping is faster)"
        ),
        "breakable_vs_piecewise_8k": {"ratio": None, "lo": None, "hi": None, "why": NOT_PIECEWISE},
        "breakable_vs_eager_8k": ratio(
            "eager",
            "bcg",
            long_,
            "eager step ms / bcg step ms (> 1: the breakable graph is faster)",
        ),
        "per_arm": per,
        # Two Engines of one configuration: how far apart two processes of the same arm time.
        "same_arm": same_arm,
    }


def e2e_counts(path: Path | None) -> dict:
    """``e2e_checks`` / ``e2e_failed`` of a run_e2e.py results file, or nulls without one."""
    if path is None:
        return {"e2e_checks": None, "e2e_failed": None}
    report = json.loads(path.read_text())
    total = sum(len(p.get("checks", [])) for p in report.get("phases", {}).values())
    return {"e2e_checks": total, "e2e_failed": int(report["checks_failed"])}


# ---- the worker (one arm's Engine) --------------------------------------------------------


def _say(out, kind: str, **fields) -> None:
    out.write(MARK + json.dumps(dict(fields, kind=kind)) + "\n")
    out.flush()


def worker(args: argparse.Namespace) -> int:
    # The protocol keeps the original stdout; the Engine and its processes write to stderr (the
    # arm's log), so their output can never fill the pipe the driver reads answers from.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import sglang as sgl

    log_dir = os.environ["GLM5_STEP_LOG"]
    t0 = time.time()
    engine = sgl.Engine(**engine_kwargs(args.worker, str(args.model), args.lengths))
    _say(out, "ready", start_s=round(time.time() - t0, 1))
    for line in sys.stdin:
        n, seed = (int(x) for x in line.split())
        rng = random.Random(seed)
        prompt = [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(n)]
        engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 1, "temperature": 0})
        steps = []
        for fn in sorted(os.listdir(log_dir)):
            with open(os.path.join(log_dir, fn)) as f:
                steps += [json.loads(x) for x in f if x.strip()]
        mine = [s for s in steps if s["mode"] == "EXTEND" and s["rows"] == n]
        last = mine[-1] if mine else {}
        _say(
            out,
            "step",
            ms=last.get("ms"),
            host_ms=last.get("host_ms"),
            graph=bool(last.get("graph")),
        )
        for fn in os.listdir(log_dir):  # the next prompt's line is then the only one
            os.remove(os.path.join(log_dir, fn))
    engine.shutdown()
    return 0


# ---- the driver ---------------------------------------------------------------------------


class Arm:
    """A worker process: its Engine, a pipe for prompts, its log."""

    def __init__(self, name: str, args: argparse.Namespace, model_dir: str, work: Path):
        self.name = name
        self.log_path = work / f"{file_name(name)}.log"
        steps = work / f"{file_name(name)}_steps"
        steps.mkdir()
        cmd = [
            sys.executable,
            str(WORKER),
            "--worker",
            base_arm(name),
            "--model",
            model_dir,
        ]
        cmd += ["--lengths", ",".join(map(str, args.lengths))]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(self.log_path, "w"),
            env=arm_env(base_arm(name), str(steps)),
            text=True,
            start_new_session=True,
        )

    def read(self, deadline: float) -> dict:
        """The worker's next protocol line."""
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{self.name}: worker ended (see its log)")
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
        raise TimeoutError(f"{self.name}: no answer before the deadline")

    def step(self, n: int, seed: int, deadline: float) -> dict:
        self.proc.stdin.write(f"{n} {seed}\n")
        self.proc.stdin.flush()
        return self.read(deadline)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self) -> str:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()
            self.proc.wait()
        return self.log_path.read_text(errors="replace")


def file_name(label: str) -> str:
    """An arm's label as a file name ('#' does not travel back from the GPU machine)."""
    return label.replace("#", "-")


def _generator():
    """make_tiny_glm5.py beside this script, loaded from its file (no import path edits)."""
    spec = importlib.util.spec_from_file_location("make_tiny_glm5", HERE / "make_tiny_glm5.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dropped_segments(log_text: str) -> int | None:
    """drop_empty_segments' ``segments_dropped`` from an arm's last counter line, or None."""
    from sglang_mixgraph.counters import parse_line

    last = None
    for line in log_text.splitlines():
        snap = parse_line(line)
        if snap is not None:
            last = snap
    if last is None:
        return None
    return int((last.get("events") or {}).get("drop_empty_segments", {}).get("segments_dropped", 0))


def run(args: argparse.Namespace) -> int:
    from sglang_mixgraph.kits import gpu_machine

    why = gpu_machine.plugin_not_found()
    if why:
        print(f"glm5_step: {why}", file=sys.stderr)
        return 2
    deadline = time.time() + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="glm5_step_"))
    model_dir = str(_generator().write(work / "model", args.layers).parent)
    logf = open(args.out / "glm5_step.log", "w")

    def log(*parts) -> None:
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        logf.write(line + "\n")

    log(
        f"glm5 step timing {time.strftime('%Y-%m-%d %H:%M:%S %Z')}: {args.layers} layers, arms "
        f"{args.arms}, prompts {args.lengths}, {args.rounds} rounds after {args.warmup} warm-up"
    )
    arms, status = {}, "complete"
    samples = {a: {n: [] for n in args.lengths} for a in args.arms}
    host = {a: {n: [] for n in args.lengths} for a in args.arms}  # the host's part of each step
    # At the deadline every worker is killed: a blocked read then ends, and what was timed is kept.
    watchdog = threading.Timer(args.budget_s, lambda: [a.kill() for a in list(arms.values())])
    watchdog.daemon = True
    watchdog.start()
    try:
        for name in args.arms:  # one at a time: each needs the memory the others left
            arms[name] = Arm(name, args, model_dir, work)
            log(f"{name}: ready {arms[name].read(deadline)}")
        seed = 0
        for r, n, name in schedule(args.arms, args.lengths, args.warmup + args.rounds):
            seed += 1
            got = arms[name].step(n, seed, deadline)
            if got.get("ms") is None or (base_arm(name) != "eager") != got.get("graph"):
                raise RuntimeError(f"{name} at {n}: no EXTEND step of its kind logged ({got})")
            if r >= args.warmup:
                samples[name][n].append(got["ms"])
                if got.get("host_ms") is not None:
                    host[name][n].append(got["host_ms"])
    except (RuntimeError, TimeoutError) as e:
        status = f"stopped: {e}"
        log(status)
    watchdog.cancel()
    logs = {name: arm.stop() for name, arm in arms.items()}
    timed = min((len(v) for a in samples.values() for v in a.values()), default=0)
    summary = summarize(samples, args.lengths, args.arms, host) if timed else {}
    summary["empty_segments_dropped"] = dropped_segments(logs.get("bcg-des", ""))
    summary.update(e2e_counts(args.e2e_results))
    result = {
        "summary": summary,
        "status": status,
        "layers": args.layers,
        "lengths": args.lengths,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "samples_ms": {a: {str(n): v for n, v in s.items()} for a, s in samples.items()},
        "host_ms": {a: {str(n): v for n, v in s.items()} for a, s in host.items()},
        "engine_kwargs": {
            a: engine_kwargs(base_arm(a), "<model>", args.lengths) for a in args.arms
        },
        "kit_env": gpu_machine.GLM5_ENV,
    }
    (args.out / "glm5_step.json").write_text(json.dumps(result, indent=1) + "\n")
    log(f"summary: {json.dumps(summary)}")
    for name, text in logs.items():
        (args.out / f"glm5_step_{file_name(name)}.log").write_text(text[-200000:])
    return 0 if status == "complete" else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
