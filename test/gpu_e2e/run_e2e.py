"""End to end on the GPU: a tiny DeepSeek-V4 served by SGLang's real Engine, the split off and on.

Run on the GPU machine through the kit, from the repository root:

    bash tools/gpu-upstream/device.sh python3 test/gpu_e2e/run_e2e.py [phase ...] [--parallel N]

Each phase (e2e_phases.py: graph mode x split setting, and the read-done variants ``-rd``; by
default the nine ``<graph>-<split>`` phases plus ``bcg-off-rd`` and ``bcg-always-rd``) runs
``sglang.Engine`` in a fresh process (e2e_phase.py) with tools/gpu-upstream/engine first on
``PYTHONPATH`` (stand-ins for four binary-only kernels, loud stubs) and the step log
(e2e_step_log.py). The baselines (``<graph>-off``) run first, side by side, with the radix cache
on (``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python``); if one fails they run again with it off
for the whole run, and the log says why. The other phases follow, side by side. The checks are
in e2e_checks.py; ``adaptive`` is checked against the cost model (sm90 coefficients, the tiny
model's top-k and compress ratios) at the shapes the step log recorded. The exit status is 1
when a check fails. ``--workload pressure`` runs the phases against a small KV pool with client
aborts (e2e_workload.py); the pool log (e2e_pool_log.py) then has to show retractions and
evictions. ``--workload boundary`` puts decode rows of MIXED steps across the SWA window, the page and
the c4 top-k threshold, and checks from the step log that they crossed. ``--model glm5`` runs the tiny GLM-5 instead, with the phases and checks of
e2e_glm5.py (graph mode x ``drop_empty_segments``, the probe e2e_glm5_probe.py in every process;
``glm5-eager`` is the baseline) and writes ``e2e_tiny_glm5.log``. ``--dp N --workload dp`` runs every phase with attention data parallelism over N GPUs
and adds per-rank checks (e2e_checks.py). ``spec`` (or ``spec-<graph>-<split>[-tail][-noovl][-online]`` by
name) runs the eight speculative phases: EAGLE over the tiny model's one next-n layer
(``tiny_dsv4_mtp_config.json``), each compared with eager upstream (``spec-eager-off``, or
``spec-eager-off-noovl`` with the overlap scheduler off, ``spec-eager-off-online`` with upstream's
online c128 MTP compression) in tokens and accept length; their
workloads end with a return_logprob request, and ``--workload boundary`` is the speculative one
(e2e_spec_boundary.py: every request at once, 10 running, so ``max_running_requests`` >= 10).
Writes ``e2e_tiny_dsv4.log``, ``e2e_results.json`` and ``phase_logs.tgz`` to ``$OUT`` (or
``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict
from importlib import metadata

import e2e_checks as C
import e2e_glm5 as G
import e2e_phases as P
import e2e_pool_log as PL
import e2e_workload as W

from sglang_mixgraph.kits import gpu_machine

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# The phases run this checkout's plugin, first on their PYTHONPATH, also when the driver runs from
# a copy of the repository (the driver itself imports it from PYTHONPATH: device.sh puts it there).
PYTHON_DIR = os.path.join(ROOT, "python")
ENGINE_DIR = str(gpu_machine.ENGINE_DIR)
_STANDINS = gpu_machine.engine_standins()
STANDIN_MARK, STUB_MARK = _STANDINS.STANDIN_MARK, _STANDINS.STUB_MARK

COUNTER_INTERVAL_S = "0.5"
MODELS = {"dsv4": "DeepSeek-V4", "glm5": "GLM-5"}
HOLD_FLAG = "SGLANG_MIXGRAPH_BCG_HOLD_BREAK_INPUTS"  # hold_break_inputs' switch
PHASE_SCRIPT = os.path.join(HERE, "e2e_phase.py")  # the CPU test of this driver swaps it


class Log:
    """Print to stdout and to the run's log file."""

    def __init__(self, path):
        self.f = open(path, "w")

    def __call__(self, *parts):
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


def _version(dist, where=None):
    """The version of ``dist`` as installed, or (``where``) of the one in that folder."""
    if where is not None:
        found = next(metadata.distributions(name=dist, path=[where]), None)
        return found.version if found else "not installed"
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def stack(log) -> dict:
    import torch
    import triton

    s = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "sglang": _version("sglang"),
        "sgl-flash-mla": _version("sgl-flash-mla"),
        "sglang-mixgraph": _version("sglang-mixgraph"),
        "sglang_kernel (metadata only)": _version("sglang_kernel", ENGINE_DIR),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
    }
    log("stack:", json.dumps(s))
    return s


def patch_flag_off_values() -> dict:
    from sglang_mixgraph.patches import all_patches

    return {f.name: f.off_value for p in all_patches() for f in p.flags}


def _phase_env(
    phase,
    off_values,
    radix,
    steps_dir,
    workload,
    dp=1,
    kernels="standin",
    churn=False,
    hold_break_inputs=False,
):
    env = dict(os.environ)
    env.update(gpu_machine.NO_MULTICAST_ENV)
    if dp > 1:
        # Upstream prints each logits gather's buffer shape (logits_processor._trace_e2e_logits).
        env[C.LOGITS_TRACE_ENV] = "1"
    env["MIXGRAPH_E2E_WORKLOAD"] = workload
    env.update(W.engine_env(workload))
    env.update(phase.env(off_values, radix=radix, kernels=kernels))
    env["PYTHONPATH"] = os.pathsep.join([PYTHON_DIR, ENGINE_DIR, HERE, env.get("PYTHONPATH", "")])
    # GLM-5 phases add their probe (split-op runs, breakable segments, guards in the scheduler).
    probe = ",e2e_glm5_probe" if isinstance(phase, G.Glm5Phase) else ""
    env["MIXGRAPH_E2E_STARTUP"] = "e2e_step_log,e2e_pool_log" + probe
    if churn:  # the ordinary allocator churned after every forward (e2e_churn_probe.py)
        env["MIXGRAPH_E2E_STARTUP"] += ",e2e_churn_probe"
        env["MIXGRAPH_E2E_CHURN"] = "1"
    if hold_break_inputs:
        env[HOLD_FLAG] = "1"
    env["MIXGRAPH_E2E_STEP_LOG"] = steps_dir
    env["SGLANG_MIXGRAPH_COUNTERS_LOG_INTERVAL"] = COUNTER_INTERVAL_S
    env["PYTHONUNBUFFERED"] = "1"
    return env


def model_dir(phase) -> str:
    """The phase's model folder under the work folder: speculative phases load the config with
    the next-n layer (SGLang's draft is the same path, ``speculative_draft_model_path``)."""
    return "model_mtp" if getattr(phase, "spec", False) else "model"


def _kill_group(proc):
    # The phase started its own session; end what is left of it (Engine children) and no more.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_wave(
    phases,
    *,
    radix,
    work,
    logs,
    off_values,
    deadline,
    parallel,
    log,
    workload,
    override,
    dp=1,
    kernels="standin",
    churn=False,
    hold_break_inputs=False,
) -> dict:
    pending = list(enumerate(phases))
    running = {}
    results = {}
    while pending or running:
        while pending and len(running) < parallel:
            slot, phase = pending.pop(0)
            d = os.path.join(work, phase.name)
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(os.path.join(d, "steps"))
            kwargs = phase.engine_kwargs(
                os.path.join(work, model_dir(phase)), radix=radix, slot=slot, dp=dp, kernels=kernels
            )
            # The workload's own arguments (the pressure workload's pool), then the command line's.
            kwargs.update(W.engine_overrides(workload, spec=getattr(phase, "spec", False)))
            kwargs.update(override)
            with open(os.path.join(d, "kwargs.json"), "w") as f:
                json.dump(kwargs, f)
            env = _phase_env(
                phase,
                off_values,
                radix,
                os.path.join(d, "steps"),
                workload,
                dp,
                kernels,
                churn=churn,
                hold_break_inputs=hold_break_inputs,
            )
            logf = open(os.path.join(logs, f"{phase.name}.log"), "w")
            proc = subprocess.Popen(
                [
                    sys.executable,
                    PHASE_SCRIPT,
                    os.path.join(d, "kwargs.json"),
                    os.path.join(d, "out.json"),
                ],
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                cwd=ROOT,
            )
            running[phase.name] = (phase, proc, logf, time.time())
            log(f"== {phase.name}: started (radix cache {'on' if radix else 'off'})")
        time.sleep(1)
        for name, (phase, proc, logf, t0) in list(running.items()):
            timed_out = time.time() > deadline
            if proc.poll() is None and not timed_out:
                continue
            if proc.poll() is None:
                log(f"== {name}: killed at the run's deadline")
            _kill_group(proc)
            proc.wait()
            logf.close()
            del running[name]
            results[name] = collect(
                phase,
                work,
                logs,
                time.time() - t0,
                timed_out,
                workload,
                dp=dp,
                hold_break_inputs=hold_break_inputs,
            )
            r = results[name]
            log(
                f"== {name}: {'ok' if r['record'].ran else 'FAILED'} in {time.time() - t0:.0f}s "
                f"{r['timings']} {r['record'].error[:300]}"
            )
    return results


# A phase's log line that says why its process died, and what the driver says of it.
DEATH_CAUSES = (
    (
        "CUDA out of memory",
        "CUDA out of memory (the phases side by side share one GPU: a lower --parallel fits)",
    ),
)


def death_cause(log_text: str) -> str | None:
    """Why a phase process that wrote no result died, when its log says so (else None)."""
    return next((said for mark, said in DEATH_CAUSES if mark in log_text), None)


_CAPTURE_END = re.compile(
    r"Capture target (?P<kind>prefill|decode) CUDA graph end\..*mem usage=(?P<gb>-?[0-9.]+) GB"
)


def capture_memory(log_text: str) -> dict[str, float]:
    """SGLang's own capture lines (``Capture target prefill|decode CUDA graph end ... mem
    usage=X GB``, the free GPU memory the capture took): GB per kind, summed over the log's
    schedulers. Another process allocating meanwhile moves it, so it is the capture's memory
    only where the phase had the GPU to itself (``--parallel 1``)."""
    out: dict[str, float] = {}
    for m in _CAPTURE_END.finditer(log_text):
        out[m["kind"]] = round(out.get(m["kind"], 0.0) + float(m["gb"]), 2)
    return out


def collect(
    phase, work, logs, seconds, timed_out, workload="full", dp=1, hold_break_inputs=False
) -> dict:
    from sglang_mixgraph.counters import parse_line

    d = os.path.join(work, phase.name)
    out = {}
    if os.path.exists(os.path.join(d, "out.json")):
        with open(os.path.join(d, "out.json")) as f:
            out = json.load(f)
    steps, pool_events = [], []
    for fn in sorted(os.listdir(os.path.join(d, "steps"))):
        with open(os.path.join(d, "steps", fn)) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        if fn.startswith((G.CAPTURES_PREFIX, G.GUARDS_PREFIX)):
            continue  # the GLM-5 probe's files: read_probe below
        if fn.startswith(PL.FILE_PREFIX):
            pool_events.extend(lines)
        else:  # steps_<pid>.jsonl: the process (a DP rank's scheduler) each step ran in
            pid = int(fn.rsplit("_", 1)[-1].split(".")[0])
            steps.extend(dict(line, pid=pid) for line in lines)
    snapshots, standins, stubs, fallbacks, radix_lines, gathers = [], [], [], [], [], []
    with open(os.path.join(logs, f"{phase.name}.log"), errors="replace") as f:
        text = f.read()
    for line in text.splitlines():
        snap = parse_line(line)
        if snap is not None:
            snapshots.append(snap)
        elif STANDIN_MARK in line:
            standins.append(line.split(STANDIN_MARK, 1)[1].split(" (pid")[0])
        elif STUB_MARK in line:
            stubs.append(line.split(STUB_MARK, 1)[1][:300])
        elif "falls back to upstream" in line:
            fallbacks.append(line.split("sglang-mixgraph: ", 1)[-1][:300])
        elif C.LOGITS_TRACE_ENV in line:
            rows = C.logits_gather_rows(line)
            if rows is not None:
                gathers.append(rows)
        elif "TreeCore" in line or "radix" in line.lower():
            radix_lines.append(line[:300])
    error = out.get("error", "")
    if timed_out:
        error = f"timed out after {seconds:.0f}s; {error}"
    elif not out:
        died = (
            f"the phase process died: {cause}"
            if (cause := death_cause(text))
            else "the phase process died"
        )
        error = error or f"no result written ({died}); see its log"
    record = C.PhaseRecord(
        name=phase.name,
        split=phase.split,
        read_done=phase.read_done,
        drop_empty=phase.drop_empty,
        live_width=phase.live_width,
        lean=getattr(phase, "lean", False),
        tail_graphs=getattr(phase, "tail_graphs", False),
        no_overlap=getattr(phase, "no_overlap", False),
        swing_accept=getattr(phase, "swing_accept", False),
        online_c128=getattr(phase, "online_c128", False),
        hold_break_inputs=hold_break_inputs,
        ran=bool(out.get("ok")),
        error=error,
        outputs=out.get("outputs", {}),
        expected_lens=out.get("expected_lens", {}),
        steps=steps,
        counters=C.merge_counters(snapshots),
        counters_by_pid=C.last_counters_by_pid(snapshots),
        graph=phase.graph,
        dp=dp,
        logits_gather_rows=gathers,
        max_running=int(kwargs_of(d).get("max_running_requests", 0)),
        stub_calls=stubs,
        abort_targets=out.get("abort_targets", {}),
        finish_reasons=out.get("finish_reasons", {}),
        pool=PL.summarize(pool_events),
        pool_pressure=workload == W.PRESSURE,
        boundary_lens=W.boundary_lens() if workload == W.BOUNDARY else (),
        logprob_rids=W.logprob_rids(workload, getattr(phase, "spec", False)),
        logprobs=out.get("logprobs", {}),
        probe=G.read_probe(os.path.join(d, "steps")),
        spec=getattr(phase, "spec", False),
        spec_counts=out.get("spec", {}),
    )
    return {
        "record": record,
        "timings": out.get("timings", {}),
        "wall_s": round(seconds, 1),
        "standins": sorted(set(standins)),
        "fallback_lines": sorted(set(fallbacks)),
        "capture_mem_gb": capture_memory(text),
        "radix_lines": radix_lines[:20],
        "traceback": out.get("traceback", ""),
        "shutdown_error": out.get("shutdown_error"),
        "log_tail": "" if out.get("ok") else text[-3000:],
    }


def kwargs_of(phase_dir) -> dict:
    try:
        with open(os.path.join(phase_dir, "kwargs.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def radix_unusable(results) -> str:
    """Why the radix cache must be off for the run ("" when the off phases ran with it and made
    MIXED steps). Seen on the H200 (2026-11-30): with the Python radix core the Engine ran but
    admitted one request at a time, so no MIXED step formed."""
    failed = {n: r["record"].error[:300] for n, r in results.items() if not r["record"].ran}
    if failed:
        return f"{sorted(failed)} failed with it on: {failed}"
    if not any(s["mode"] == "MIXED" for r in results.values() for s in r["record"].steps):
        return (
            "with it on the off phases ran but made no MIXED step (nothing for the split to act on)"
        )
    return ""


def step_times(steps):
    by = {}
    for s in steps:
        by.setdefault(f"{s['mode']}/{'graph' if s['graph'] else 'eager'}", []).append(s["ms"])
    return {
        k: {"n": len(v), "median_ms": round(statistics.median(v), 2)} for k, v in sorted(by.items())
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "phases",
        nargs="*",
        help="e.g. eager-off bcg-always-rd (default: the eleven); spec (the eight speculative "
        "phases) or spec-bcg-always, spec-eager-always-tail-noovl; glm5-bcg-des with --model glm5",
    )
    ap.add_argument(
        "--model",
        choices=MODELS,
        default="dsv4",
        help="dsv4: the tiny DeepSeek-V4 and the split's phases; glm5: the tiny GLM-5 and its "
        "graph x drop_empty_segments phases (e2e_glm5.py)",
    )
    ap.add_argument("--out", default=os.environ.get("OUT") or "/tmp/mixgraph_e2e_out")
    ap.add_argument("--work", default="/tmp/mixgraph_e2e")
    ap.add_argument(
        "--radix",
        choices=("on", "auto", "off"),
        default="on",
        help="on: the radix cache (Python tree core) in every phase; auto: on unless the baselines "
        "fail or make no MIXED step with it",
    )
    ap.add_argument("--parallel", type=int, default=6, help="phases run side by side")
    ap.add_argument("--budget-s", type=float, default=520, help="the whole run's deadline")
    ap.add_argument("--label", default="", help="recorded in the log (e.g. the commit)")
    ap.add_argument(
        "--workload",
        choices=W.WORKLOADS,
        default="full",
        help="short: no long segment; pressure: a small pool, retractions, evictions and aborts; "
        "boundary: decode rows across the SWA window, the page and the c4 top-k threshold",
    )
    ap.add_argument(
        "--kernels",
        choices=tuple(gpu_machine.KERNEL_ENV),
        default="standin",
        help="the kit's kernel selection: faithful = SGLang's TileLang/JIT kernels (TileLang "
        "carried), standin = torch stand-ins",
    )
    ap.add_argument(
        "--engine-override", default="{}", help="JSON merged into every phase's Engine arguments"
    )
    ap.add_argument(
        "--dp",
        type=int,
        default=1,
        help="attention data parallel over this many GPUs (tp = dp); use with --workload dp",
    )
    ap.add_argument(
        "--churn",
        action="store_true",
        help="churn the ordinary allocator after every forward of every phase (NaN-filled "
        "blocks, e2e_churn_probe.py): a replay that reads memory it does not own shows",
    )
    ap.add_argument(
        "--hold-break-inputs",
        action="store_true",
        help=f"{HOLD_FLAG}=1 in every phase (breakable graphs hold break inputs from outside "
        "their memory pool)",
    )
    args = ap.parse_args()
    t_start = time.time()
    deadline = t_start + args.budget_s
    os.makedirs(args.out, exist_ok=True)
    shutil.rmtree(args.work, ignore_errors=True)
    logs = os.path.join(args.work, "logs")
    os.makedirs(logs)
    os.makedirs(os.path.join(args.work, "model"))
    glm5 = args.model == "glm5"
    config_path = str(G.TINY_CONFIG) if glm5 else os.path.join(HERE, "tiny_dsv4_config.json")
    shutil.copy(config_path, os.path.join(args.work, "model", "config.json"))
    if not glm5:
        os.makedirs(os.path.join(args.work, "model_mtp"))
        shutil.copy(
            os.path.join(HERE, P.MTP_CONFIG), os.path.join(args.work, "model_mtp", "config.json")
        )
    log = Log(os.path.join(args.out, f"e2e_tiny_{args.model}.log"))
    log(f"e2e tiny {MODELS[args.model]}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')} {args.label}")
    import sglang_mixgraph

    log(f"plugin under test: {os.path.dirname(sglang_mixgraph.__file__)}")
    versions = stack(log)
    try:
        phases = G.parse(args.phases) if glm5 else P.parse(args.phases)
    except ValueError as e:
        ap.error(str(e))
    why = gpu_machine.plugin_not_found()
    if why:
        ap.error(why)
    off_values = patch_flag_off_values()
    if args.dp < 1:
        ap.error(f"--dp {args.dp}: at least 1")
    if glm5 and (args.dp != 1 or args.kernels != "standin"):
        ap.error(
            "--model glm5 runs on one GPU with the stand-in kernels (--dp 1 --kernels standin)"
        )
    spec = any(getattr(p, "spec", False) for p in phases)
    if spec and args.workload == W.BOUNDARY and not all(p.spec for p in phases):
        ap.error("--workload boundary differs under speculation: run the spec phases apart")
    segs = W.build(chunk=P.CHUNK, workload=args.workload, dp=args.dp, spec=spec)
    with open(config_path) as f:
        config = json.load(f)
    policy = None if glm5 else C.AdaptivePolicy.for_model(config)
    cmdline = json.loads(args.engine_override)
    # The workload's own arguments (the pressure workload's pool), then the command line's.
    override = dict(W.engine_overrides(args.workload, spec=spec), **cmdline)
    needed = W.concurrent_requests(args.workload, segs, spec=spec)
    running = int(override.get("max_running_requests", P.MAX_RUNNING))
    if needed > running:
        ap.error(
            f"--workload {args.workload} needs {needed} requests running at once, "
            f"max_running_requests is {running}: raise it with --engine-override"
        )
    log(
        f"phases: {[p.name for p in phases]}; chunk {P.CHUNK}, max running {P.MAX_RUNNING}, "
        f"{len(W.all_requests(segs))} requests in segments "
        f"{[(s.name, len(s.first), len(s.then)) for s in segs]}, peak {W.peak_tokens(segs)} tokens"
    )
    log(f"kernel selection {args.kernels}: {json.dumps(gpu_machine.KERNEL_ENV[args.kernels])}")
    switched = (
        "drop_empty_segments' (on in -des phases)"
        if glm5
        else f"the split's (and in -rd phases {json.dumps(P.READ_DONE_ENV)})"
    )
    if args.hold_break_inputs:
        switched += f" and {HOLD_FLAG} (1 in every phase, below)"
    log(f"patch flags at their off value except {switched}: {json.dumps(off_values)}")
    if glm5:
        log(
            f"GLM-5: {config['num_hidden_layers']} layers, {G.indexer_layers(config)} with the DSA "
            f"indexer (top-{config['index_topk']}); kit kernels {json.dumps(gpu_machine.GLM5_ENV)}"
        )
    else:
        log(
            f"adaptive checked against the cost model {policy.coeffs.arch} (margin "
            f"{policy.coeffs.margin}), top-k {policy.topk}, ratios {sorted(policy.ratios)}"
        )
    if spec:
        log(
            f"speculative phases: {json.dumps(P.SPEC_KWARGS)} over {P.MTP_CONFIG} (one next-n "
            f"layer), each compared with {P.SPEC_REFERENCE} (accept length within "
            f"{C.ACCEPT_LENGTH_TOLERANCE:.0%})"
        )
    example = dict(
        phases[0].engine_kwargs(
            "<model>", radix=args.radix != "off", slot=0, dp=args.dp, kernels=args.kernels
        ),
        **override,
    )
    log(
        f"workload {args.workload}; engine kwargs (bcg/dgraph/eager differ in graph settings; "
        f"overrides {override}): {json.dumps(example)}"
    )

    wave = dict(
        work=args.work,
        logs=logs,
        off_values=off_values,
        parallel=args.parallel,
        log=log,
        workload=args.workload,
        override=cmdline,
        dp=args.dp,
        kernels=args.kernels,
        churn=args.churn,
        hold_break_inputs=args.hold_break_inputs,
    )
    if args.churn or args.hold_break_inputs:
        log(
            f"allocator churn after every forward: {'on' if args.churn else 'off'}; "
            f"{HOLD_FLAG}={'1' if args.hold_break_inputs else '0'} in every phase"
        )
    baselines = [p for p in phases if p.is_baseline]
    rest = [p for p in phases if not p.is_baseline]
    if args.radix != "auto":
        # Nothing to decide first: every phase side by side.
        radix = args.radix == "on"
        log(f"radix cache {'ON' if radix else 'OFF'} (--radix {args.radix})")
        results = run_wave(phases, radix=radix, deadline=deadline, **wave)
    else:
        radix = True
        results = run_wave(baselines, radix=True, deadline=deadline, **wave)
        why = radix_unusable(results)
        if why:
            log(
                f"radix cache (SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python) OFF for this run: {why}"
            )
            for n in results:
                os.replace(os.path.join(logs, f"{n}.log"), os.path.join(logs, f"{n}.radix_on.log"))
            radix = False
            results = run_wave(baselines, radix=False, deadline=deadline, **wave)
        else:
            log("radix cache ON (SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python) for every phase")
        results.update(run_wave(rest, radix=radix, deadline=deadline, **wave))

    checks = []
    report = {
        "model": args.model,
        "stack": versions,
        "label": args.label,
        "kernels": args.kernels,
        "radix_cache": radix,
        "phases": {},
    }
    for phase in phases:
        r = results[phase.name]
        rec = r["record"]
        if glm5:
            records = {n: res["record"] for n, res in results.items()}
            phase_checks = G.check_phase(rec, phase, records, G.indexer_layers(config))
        else:
            base = None if phase.is_baseline else results.get(phase.baseline, {}).get("record")
            # A speculative split arm is also read against the split-off arm of its graph mode.
            upstream = (
                results.get(phase.upstream_arm, {}).get("record")
                if getattr(phase, "spec", False) and phase.split != "off"
                else None
            )
            phase_checks = C.check_phase(rec, base, policy, upstream)
        checks += phase_checks
        log(f"\n--- {phase.name} ({r['wall_s']}s; {r['timings']})")
        for line in C.summarize(rec):
            log("   " + line)
        log(f"   step times: {step_times(rec.steps)}")
        log(f"   stand-ins used: {r['standins']}")
        if r["capture_mem_gb"]:
            alone = "alone on the GPU" if args.parallel == 1 else "other phases beside it"
            log(f"   graph capture memory, SGLang's log ({alone}): {r['capture_mem_gb']} GB")
        if r["fallback_lines"]:
            log(f"   fallback log lines: {r['fallback_lines']}")
        for c in phase_checks:
            log(f"   [{'ok' if c.ok else 'FAILED'}] {c.name}{': ' + c.detail if c.detail else ''}")
        if not rec.ran:
            log(f"   traceback: {r['traceback'][-2500:]}\n   log tail: {r['log_tail'][-2500:]}")
        report["phases"][phase.name] = {
            "ran": rec.ran,
            "error": rec.error,
            "wall_s": r["wall_s"],
            "timings": r["timings"],
            "steps_by_mode": C.steps_by_mode(rec.steps),
            "step_times": step_times(rec.steps),
            "counters": rec.counters,
            "counters_by_pid": rec.counters_by_pid if rec.dp > 1 else {},
            "logits_gather_rows": sorted(set(rec.logits_gather_rows)),
            "pool": rec.pool,
            "finish_reasons": rec.finish_reasons,
            "standins": r["standins"],
            "stub_calls": rec.stub_calls,
            "fallback_lines": r["fallback_lines"],
            "capture_mem_gb": r["capture_mem_gb"],
            "capture_alone": args.parallel == 1,
            "shutdown_error": r["shutdown_error"],
            "checks": [asdict(c) for c in phase_checks],
            "outputs": rec.outputs,
            "expected_lens": rec.expected_lens,
            "steps": rec.steps,
            "probe": rec.probe,
            "accept_length": C.accept_length(rec),
            "spec_counts": rec.spec_counts,
        }
    distinct = {
        n: len({tuple(v) for v in r["record"].outputs.values()}) for n, r in results.items()
    }
    log(
        f"\ndistinct token sequences per phase (of {len(W.all_requests(segs))} requests): {distinct}"
    )
    offs = [p.name for p in baselines if results[p.name]["record"].ran]
    for i, a in enumerate(offs):
        for b in offs[i + 1 :]:
            mism = C.compare_tokens(results[a]["record"].outputs, results[b]["record"].outputs)
            log(
                f"across graph modes (information, not a check): {a} vs {b}: {len(mism)} requests differ"
            )
    bad = [c for c in checks if not c.ok]
    report["checks_failed"] = len(bad)
    with open(os.path.join(args.out, "e2e_results.json"), "w") as f:
        json.dump(report, f)
    with tarfile.open(os.path.join(args.out, "phase_logs.tgz"), "w:gz") as tar:
        tar.add(logs, arcname="logs")
    log(f"\nE2E: {len(checks)} checks, {len(bad)} failed; driver {time.time() - t_start:.0f}s")
    for c in bad:
        log(f"FAILED {c.phase}: {c.name}: {c.detail}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
