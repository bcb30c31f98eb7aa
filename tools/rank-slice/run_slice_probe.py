"""Probe the one-rank slice on the GPU: per-step host and wall time by step kind, capture memory
per prefill bucket, a kernel profile of chosen MIXED steps, and token equality between arms.

Run on the GPU machine through the kit, from the repository root:

    bash tools/gpu-upstream/device.sh python3 tools/rank-slice/run_slice_probe.py \\
        upstream bcg-auto bcg-auto-ctx --requests 64 --input-len 2048 --output-len 32

Arms (slice_arms.py) run one after another, each ``sglang.Engine`` in a fresh process
(slice_arm.py) with the kit's Engine stand-ins and the step probe (slice_probe.py). The model
directory is generated (make_slice_model.py) unless ``--model-dir`` names one. Steps are timed
with the GPU synchronized on both sides: this serializes the scheduler, so these are per-step
costs, not serving throughput (``sglang-mixgraph ab`` measures that). Writes
``rank_slice_probe.log``, ``rank_slice_probe.json`` and ``arm_logs.tgz`` to ``--out``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time

import slice_arms as A

from sglang_mixgraph.kits.gpu_machine import (
    ENGINE_DIR,
    KERNEL_ENV,
    KIT_FP8_GEMM_ENV,
    KIT_KERNELS_ENV,
    NO_MULTICAST_ENV,
    RADIX_CORE_ENV,
    plugin_not_found,
)

HERE = os.path.dirname(os.path.abspath(__file__))
COUNTERS_INTERVAL_S = "1"
ROOT = os.path.dirname(os.path.dirname(HERE))


def log_to(path):
    f = open(path, "w")

    def log(*parts):
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        f.write(line + "\n")
        f.flush()

    return log


def arm_env(
    arm: A.Arm,
    probe_dir: str,
    profile: str,
    radix: bool,
    profile_decode: str = "",
    kernels: str = "standin",
    fp8_gemm: str = "sglang",
) -> dict:
    env = dict(os.environ)
    env.update(NO_MULTICAST_ENV)
    env.update(KERNEL_ENV[kernels])
    env[KIT_KERNELS_ENV] = kernels
    env[KIT_FP8_GEMM_ENV] = fp8_gemm
    if radix:
        env[RADIX_CORE_ENV] = "python"  # the Rust radix core is built for another torch
    env.update(arm.env)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(ROOT, "python"), str(ENGINE_DIR), HERE, env.get("PYTHONPATH", "")]
    )
    env["MIXGRAPH_E2E_STARTUP"] = "slice_probe"
    env["SLICE_PROBE_DIR"] = probe_dir
    env["SLICE_PROFILE_MIXED"] = profile
    env["SLICE_PROFILE_DECODE"] = profile_decode
    # A line a second while counts change; the arm waits for the last one before shutting down
    # (SGLang's Engine.shutdown can end the scheduler before its exit handlers run).
    env["SGLANG_MIXGRAPH_COUNTERS_LOG_INTERVAL"] = COUNTERS_INTERVAL_S
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_arm(arm, d, kwargs, workload, env, deadline, log_path) -> dict:
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(env["SLICE_PROBE_DIR"])
    with open(os.path.join(d, "arm.json"), "w") as f:
        json.dump({"engine": kwargs, "workload": workload}, f)
    t0 = time.time()
    with open(log_path, "w") as logf:
        proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "slice_arm.py"), d],
            stdout=logf,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            cwd=ROOT,
        )
        while proc.poll() is None and time.time() < deadline:
            time.sleep(1)
        timed_out = proc.poll() is None
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the Engine's children too
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    res = {}
    if os.path.exists(os.path.join(d, "result.json")):
        with open(os.path.join(d, "result.json")) as f:
            res = json.load(f)
    if timed_out:
        res["error"] = f"killed at the run's deadline after {time.time() - t0:.0f}s"
    res["wall_s"] = round(time.time() - t0, 1)
    return res


def _jsonl(pattern):
    rows = []
    for fn in sorted(glob.glob(pattern)):
        with open(fn) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def _stats(v):
    v = sorted(v)
    return {
        "n": len(v),
        "median": round(statistics.median(v), 2),
        "p90": round(v[int(0.9 * (len(v) - 1))], 2),
        "sum": round(sum(v), 1),
    }


def step_summary(steps) -> dict:
    by = {}
    for s in steps:
        by.setdefault(f"{s['mode']}/{'graph' if s['graph'] else 'eager'}", []).append(s)
    out = {}
    for k, rows in sorted(by.items()):
        out[k] = {"host_ms": _stats([r["host_ms"] for r in rows])}
        out[k]["wall_ms"] = _stats([r["wall_ms"] for r in rows])
        for field in (
            "gc_ms",
            "gc_full",
            "cpu_ms",
            "runq_ms",
            "vcsw",
            "ivcsw",
            "alloc_retries",
            "device_alloc",
            "device_free",
        ):
            if all(r.get(field) is not None for r in rows):  # older probes, or no /proc
                out[k][field] = _stats([r[field] for r in rows])
        if k.startswith("MIXED"):
            out[k]["decode_rows"] = _stats([r["n_dec"] or 0 for r in rows])
            out[k]["prefill_tokens"] = _stats([r["prefill_tokens"] or 0 for r in rows])
    return out


def profile_export_s(steps) -> float:
    """Seconds the profiled steps spent writing their traces and tables: inside the burst,
    outside every timed step (an eager 2k step's trace takes about 24 s, a replayed one's 5)."""
    return round(sum(s.get("export_s", 0.0) for s in steps), 2)


def mixed_series(steps) -> dict:
    """The MIXED steps' host, wall and thread CPU ms and allocator retries in step order: whether
    a slow visit is slow throughout or in a stretch of it (a summary's median cannot tell)."""
    mixed = [s for s in steps if s["mode"] == "MIXED"]
    fields = ("host_ms", "wall_ms", "cpu_ms", "alloc_retries", "n_dec")
    return {f: [s.get(f) for s in mixed] for f in fields}


def steps_by_rank(steps) -> dict:
    """``step_summary`` per attention-DP rank (the probe's ``dp_rank``); {} without DP."""
    ranks = sorted({s["dp_rank"] for s in steps if "dp_rank" in s})
    return {str(r): step_summary([s for s in steps if s.get("dp_rank") == r]) for r in ranks}


def capture_by_rank(records) -> dict:
    """Capture memory (MiB), shapes and seconds per attention-DP rank (each rank captures on its
    own GPU); {} without DP."""
    ranks = sorted({c["dp_rank"] for c in records if "dp_rank" in c})
    out = {}
    for r in ranks:
        mine = [c for c in records if c.get("dp_rank") == r]
        out[str(r)] = {
            "shapes": len(mine),
            "device_mib": round(sum(c["device_mib"] for c in mine), 1),
            "seconds": round(sum(c["seconds"] for c in mine), 2),
        }
    return out


def counters(log_text: str) -> dict:
    from sglang_mixgraph.counters import parse_line

    last = {}
    for line in log_text.splitlines():
        snap = parse_line(line)
        if snap is not None:
            last = snap
    return last


def token_equality(arms: dict) -> list[str]:
    """Greedy tokens of each finished arm against upstream's where it ran, else the first arm's
    (a patch's own baseline arm)."""
    ref = "upstream" if "upstream" in arms else next(iter(arms), None)
    lines = []
    for n, a in arms.items():
        if n != ref:
            same = sum(x == y for x, y in zip(a["outputs"], arms[ref]["outputs"], strict=False))
            lines.append(f"tokens equal to {ref}: {n}: {same}/{len(a['outputs'])} requests")
    return lines


def visit_keys(names: list[str]) -> list[str]:
    """One key per arm visit: an arm's name, then ``name#2``, ``name#3`` for its repeats, so an
    A/B block (``upstream bcg-auto bcg-auto upstream``) keeps every visit apart."""
    seen: dict[str, int] = {}
    keys = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        keys.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    return keys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "arms", nargs="+", help=f"of {sorted(A.ARMS)}; an arm named again is visited again"
    )
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=2048)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument(
        "--shared-prefix",
        type=int,
        default=0,
        help="the prompts' first N ids are common to all (long contexts through the radix cache)",
    )
    ap.add_argument("--context-length", type=int, default=8192)
    ap.add_argument(
        "--chunk",
        type=int,
        default=A.CHUNK,
        help=f"chunked prefill per rank, decode rows included (default {A.CHUNK}: "
        f"{A.CHUNK - A.RUNNING} prefill tokens next to {A.RUNNING} decode rows)",
    )
    ap.add_argument("--radix", choices=("on", "off"), default="on")
    ap.add_argument("--profile-mixed", default="8", help="MIXED step ordinals to profile")
    ap.add_argument("--profile-decode", default="", help="DECODE step ordinals to profile")
    ap.add_argument(
        "--kernels",
        choices=("standin", "faithful"),
        default="standin",
        help="the kit's kernel selection: faithful = SGLang's TileLang/JIT/Triton kernels "
        "(TileLang on the machine), standin = torch stand-ins",
    )
    ap.add_argument(
        "--fp8", action="store_true", help="an FP8 block-128 slice (make_slice_model --fp8)"
    )
    ap.add_argument(
        "--fp8-gemm",
        choices=("sglang", "torch"),
        default="sglang",
        help="an FP8 slice's block-128 linears: SGLang's choice (its Triton GEMM without "
        "DeepGEMM) or torch's block-scaled scaled_mm (the Engine stand-ins)",
    )
    ap.add_argument("--layers", type=int, default=61, help="the slice's first N layers")
    ap.add_argument("--model-dir", default="")
    ap.add_argument("--out", default=os.environ.get("OUT") or "/tmp/rank_slice_out")
    ap.add_argument("--work", default="/tmp/rank_slice")
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument(
        "--dp", type=int, default=1, help="ranks of the reference deployment, one per GPU"
    )
    args = ap.parse_args(argv)
    if args.dp < 1:
        ap.error(f"--dp {args.dp}: at least 1")
    if args.fp8_gemm != "sglang" and not args.fp8:
        ap.error("--fp8-gemm chooses the GEMM of an FP8 slice: add --fp8")
    if not 0 <= args.shared_prefix < args.input_len:
        ap.error(f"--shared-prefix {args.shared_prefix}: from 0 to below --input-len")
    if args.chunk < A.RUNNING + A.PAGE:
        ap.error(
            f"--chunk {args.chunk}: at least {A.RUNNING + A.PAGE}, so that a page of prefill "
            f"fits next to {A.RUNNING} decode rows"
        )
    if args.shared_prefix and args.radix == "off":
        ap.error("--shared-prefix needs the radix cache (--radix on)")
    with_plugin = [a.name for a in A.parse(args.arms) if A.NO_PLUGIN.items() - a.env.items()]
    why = plugin_not_found() if with_plugin else None
    if why:
        ap.error(f"arms {', '.join(with_plugin)}: {why}")
    return args


def visit_engine_kwargs(args: argparse.Namespace, model: str, arm: A.Arm) -> dict:
    """The Engine arguments of one visit of ``arm`` under the command line's workload."""
    return A.engine_kwargs(
        model,
        arm,
        requests=args.requests,
        input_len=args.input_len,
        output_len=args.output_len,
        radix=args.radix == "on",
        context_length=args.context_length,
        dp=args.dp,
        kernels=args.kernels,
        shared_prefix=args.shared_prefix,
        chunk=args.chunk,
    )


def main() -> int:
    args = parse_args()
    deadline = time.time() + args.budget_s
    arms = A.parse(args.arms)
    os.makedirs(args.out, exist_ok=True)
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(os.path.join(args.work, "logs"))
    log = log_to(os.path.join(args.out, "rank_slice_probe.log"))
    model = args.model_dir or os.path.join(args.work, "model")
    if not args.model_dir:
        subprocess.run(
            [
                sys.executable,
                os.path.join(HERE, "make_slice_model.py"),
                model,
                "--layers",
                str(args.layers),
            ]
            + (["--fp8"] if args.fp8 else []),
            check=True,
        )
    with open(os.path.join(model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    workload = {
        "requests": args.requests,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "seed": 7,
        "vocab": vocab,
        "shared_prefix": args.shared_prefix,
    }
    import torch

    log(
        f"rank-slice probe {time.strftime('%Y-%m-%d %H:%M:%S %Z')} on {torch.cuda.get_device_name()}"
    )
    log(
        f"torch {torch.__version__}; workload {json.dumps(workload)}; radix {args.radix}; "
        f"chunk {args.chunk}"
    )
    log(f"kernel selection {args.kernels}: {json.dumps(KERNEL_ENV[args.kernels])}")
    report = {
        "workload": workload,
        "arms": {},
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "chunk": args.chunk,
        "kernels": args.kernels,
        "fp8": args.fp8,
        "fp8_gemm": args.fp8_gemm,
        "layers": args.layers,
    }
    for key, arm in zip(visit_keys([a.name for a in arms]), arms, strict=True):
        d = os.path.join(args.work, key)
        kwargs = visit_engine_kwargs(args, model, arm)
        env = arm_env(
            arm,
            os.path.join(d, "probe"),
            args.profile_mixed,
            args.radix == "on",
            args.profile_decode,
            args.kernels,
            args.fp8_gemm,
        )
        log(f"== {key}: {arm.what}; env {json.dumps(arm.env)}; engine {json.dumps(kwargs)}")
        log_path = os.path.join(args.work, "logs", f"{key}.log")
        res = run_arm(arm, d, kwargs, workload, env, deadline, log_path)
        with open(log_path, errors="replace") as f:
            text = f.read()
        probe = os.path.join(d, "probe")
        steps = _jsonl(os.path.join(probe, "steps_*.jsonl"))
        capture = _jsonl(os.path.join(probe, "capture_*.jsonl"))
        entry = {
            "what": arm.what,
            "env": arm.env,
            "engine": kwargs,
            "ok": bool(res.get("ok")),
            "error": res.get("error", ""),
            "engine_start_s": res.get("engine_start_s"),
            "burst_s": res.get("burst_s"),
            "profile_export_s": profile_export_s(steps),
            "output_tokens": res.get("output_tokens"),
            "steps": step_summary(steps),
            "mixed_series": mixed_series(steps),
            "steps_by_rank": steps_by_rank(steps),
            "capture": capture,
            "capture_by_rank": capture_by_rank(capture),
            "profiles": [json.load(open(p)) for p in sorted(glob.glob(probe + "/profile_*.json"))],
            "counters": counters(text),
            "fallback_lines": sorted(
                {
                    ln.split("sglang-mixgraph: ", 1)[-1][:240]
                    for ln in text.splitlines()
                    if "falls back" in ln
                }
            ),
            "outputs": res.get("outputs", []),
            "log_tail": "" if res.get("ok") else text[-4000:],
        }
        report["arms"][key] = entry
        log(
            f"   ok {entry['ok']} start {entry['engine_start_s']}s burst {entry['burst_s']}s "
            f"(of which {entry['profile_export_s']}s the profiler's export) "
            f"{entry['error'][:300]}"
        )
        log(f"   steps {json.dumps(entry['steps'])}")
        if capture:
            total = sum(c["device_mib"] for c in capture)
            log(f"   capture {total:.0f} MiB over {len(capture)} shapes: {json.dumps(capture)}")
        if entry["capture_by_rank"]:
            log(f"   capture by rank {json.dumps(entry['capture_by_rank'])}")
        for p in entry["profiles"]:
            top = ", ".join(f"{k['name'][:60]} {k['ms']}" for k in p["kernels"][:12])
            log(
                f"   profile step {json.dumps(p['step'])}: kernels {p['kernel_ms_total']} ms; {top}"
            )
            if isinstance(p.get("classes"), dict) and "classes" in p["classes"]:
                c = p["classes"]
                per = ", ".join(f"{k} {v['ms']}" for k, v in c["classes"].items())
                busy = f"; GPU busy {c['busy_ms']} ms of {c['kernel_ms']}" if "busy_ms" in c else ""
                log(f"   classes ({c['with_frames']}/{c['kernels']} with frames): {per}{busy}")
            if "host_ops" in p:
                host = ", ".join(
                    f"{k['name'][:60]} {k['ms']} x{k['count']}" for k in p["host_ops"][:12]
                )
                log(
                    f"   host {p['host_self_ms_total']} ms self CPU; launches {json.dumps(p['launches'])}; {host}"
                )
                log(f"   CPU pace (median self us) {json.dumps(p.get('pace_us', {}))}")
        if entry["counters"]:
            log(f"   counters {json.dumps(entry['counters'])}")
        if not entry["ok"]:
            log(f"   log tail: {entry['log_tail'][-2500:]}")
    ok = {n: a for n, a in report["arms"].items() if a["ok"]}
    for line in token_equality(ok):
        log(line)
    with open(os.path.join(args.out, "rank_slice_probe.json"), "w") as f:
        json.dump(report, f)
    with tarfile.open(os.path.join(args.out, "arm_logs.tgz"), "w:gz") as tar:
        tar.add(os.path.join(args.work, "logs"), arcname="logs")
    traces = sorted(glob.glob(os.path.join(args.work, "*", "probe", "trace_*.json.xz")))
    if traces:  # one file back from the GPU machine: the profiled steps' traces, by arm
        with tarfile.open(os.path.join(args.out, "traces.tar"), "w") as tar:
            for t in traces:
                arm_name = os.path.relpath(t, args.work).split(os.sep)[0]
                tar.add(t, arcname=f"{arm_name}/{os.path.basename(t)}")
    return 0 if len(ok) == len(arms) else 1


if __name__ == "__main__":
    sys.exit(main())
