"""Start-up hook of a rank-slice arm (``MIXGRAPH_E2E_STARTUP=slice_probe``): per-step timings,
capture memory per prefill bucket, and a torch-profiler kernel table of chosen steps.

Installed in every process of the arm by tools/gpu-upstream/engine/sitecustomize.py; only the
scheduler process runs forwards. Writes to ``$SLICE_PROBE_DIR``:

* ``steps_<pid>.jsonl``: one line per ``ModelRunner.forward``: the mode at entry (the eager runner
  relabels MIXED to EXTEND inside), rows, batch size, decode rows (trailing 1-token extends),
  prefill tokens, the longest context, whether a graph ran, host ms (entry to return: what the
  host spends preparing and launching) and wall ms (the GPU synchronized on both sides, so the
  step's own time; this serializes steps, so it is a probe, not a serving number), and the
  Python garbage collector's pauses inside it (``gc_ms``, ``gc_full``: collections of the oldest
  generation), and what the scheduler thread did with the host ms (``ThreadMeter``: its own CPU
  time ``cpu_ms``, its wait for a CPU ``runq_ms``, its voluntary and involuntary context switches
  ``vcsw``/``ivcsw``): host ms well above ``cpu_ms`` is waiting, not work), the caching
  allocator's device calls inside it (``alloc_retries``: every cached block freed and malloced
  again, each free synchronizing the device; ``device_alloc``, ``device_free``); under attention DP also
  the rank and the synced per-rank tokens (``gpu_machine.dp_step_fields``);
* ``capture_<pid>.jsonl``: one line per captured prefill shape, free device memory before/after
  (``PrefillCudaGraphRunner.capture_one_shape``) and, under attention DP, the rank;
* ``profile_<pid>_<k>.json``: for the k-th MIXED step of ``$SLICE_PROFILE_MIXED`` (comma list;
  ``profile_<pid>_d<k>.json`` for the k-th DECODE step of ``$SLICE_PROFILE_DECODE``), CUDA kernel
  time by kernel name from ``torch.profiler`` over that one forward, the kernel time by class
  (``sglang_mixgraph.core.kernel_classes.class_table``, each kernel classed by the Python that
  launched it), and the host side of it: self CPU time by op and the launch calls (kernels,
  graphs) the host made; the chrome trace itself as ``trace_<pid>_<k>.json.xz``. The profiler's
  own overhead (Python stacks are recorded) inflates that step's host ms; the other steps are
  not profiled. Writing all this takes seconds after the step's wall is read; the step's line
  carries them as ``export_s``.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _out(name: str) -> str:
    return os.path.join(os.environ["SLICE_PROBE_DIR"], f"{name}_{os.getpid()}")


def _append(path: str, rec: dict) -> None:
    try:
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")
    except OSError as e:  # a probe line must never break a step
        sys.stderr.write(f"[slice probe] {e!r}\n")


def step_shape(forward_batch) -> dict:
    """Rows, decode rows and prefill tokens of a batch, from the host copies it already holds."""
    ext = list(forward_batch.extend_seq_lens_cpu or ())
    ndec = 0
    for n in reversed(ext):
        if int(n) != 1:
            break
        ndec += 1
    seq = forward_batch.seq_lens_cpu
    return {
        "bs": int(forward_batch.batch_size),
        "rows": int(forward_batch.input_ids.shape[0]) if forward_batch.input_ids is not None else 0,
        "n_dec": ndec if ext else None,
        "prefill_tokens": int(sum(int(n) for n in ext)) - ndec if ext else None,
        "seq_max": int(seq.max()) if seq is not None and len(seq) else None,
    }


def _time_by_name(events, device: str, micros, limit: int) -> tuple[float, list[dict]]:
    """(total ms, the ``limit`` largest ``{name, ms, count}``) of the events on ``device``,
    each timed by ``micros(event)``."""
    by = {}
    for ev in events:
        if getattr(ev, "device_type", None) is None or device not in str(ev.device_type):
            continue
        n, c = by.get(ev.name, (0.0, 0))
        by[ev.name] = (n + micros(ev) / 1e3, c + 1)
    rows = sorted(by.items(), key=lambda kv: -kv[1][0])
    return round(sum(v[0] for v in by.values()), 3), [
        {"name": k[:160], "ms": round(v[0], 3), "count": v[1]} for k, v in rows[:limit]
    ]


def _device_micros(ev) -> float:
    return ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total


def kernel_table(prof, limit: int = 60) -> dict:
    """CUDA kernel time by name over a profiled region (ms), the largest first."""
    total, rows = _time_by_name(prof.events(), "CUDA", _device_micros, limit)
    return {"kernel_ms_total": total, "kernels": rows}


# CUDA runtime calls that put work on the GPU: how many the host issued in a profiled step.
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cudaMemcpyAsync")
# The CPU's pace in a profiled step: the median self time of ops whose work no patch changes
# (tensor metadata only), so visits whose host times differ can be told a slower CPU apart.
PACE_OPS = ("aten::view", "aten::empty")


def _pace_us(events) -> dict[str, float]:
    import statistics

    times = {op: [] for op in PACE_OPS}
    for ev in events:
        if ev.name in times and "CPU" in str(getattr(ev, "device_type", "")):
            times[ev.name].append(ev.self_cpu_time_total)
    return {op: round(statistics.median(t), 3) for op, t in times.items() if t}


def host_table(prof, limit: int = 40) -> dict:
    """Self CPU time by op over a profiled region (ms), the largest first, launch counts, and
    the CPU's pace (``PACE_OPS``' median self time, us)."""
    events = list(prof.events())
    total, rows = _time_by_name(events, "CPU", lambda ev: ev.self_cpu_time_total, limit)
    launches = {
        call: sum(
            1
            for ev in events
            if "CPU" in str(getattr(ev, "device_type", "")) and ev.name.startswith(call)
        )
        for call in LAUNCH_CALLS
    }
    return {
        "host_self_ms_total": total,
        "host_ops": rows,
        "launches": launches,
        "pace_us": _pace_us(events),
    }


def _class_table(prof, trace_path: str) -> dict:
    """Kernel time by class of a profiled step (``core.kernel_classes``), from its chrome trace,
    which is kept beside it xz-compressed."""
    import lzma

    from sglang_mixgraph.core.kernel_classes import class_table, load_trace

    try:
        prof.export_chrome_trace(trace_path)
        events = load_trace(trace_path)
        with open(trace_path, "rb") as src, lzma.open(trace_path + ".xz", "wb", preset=6) as dst:
            dst.write(src.read())
        os.remove(trace_path)
        return class_table(events)
    except Exception as e:  # noqa: BLE001 -- a probe must never break a step
        return {"error": repr(e)}


class GcPauses:
    """Milliseconds the garbage collector paused the process, and its full collections, summed
    from ``gc.callbacks``: a host-time cost no profiler row shows (it lands inside whatever op
    runs when a collection starts)."""

    def __init__(self) -> None:
        self.ms = 0.0
        self.full = 0
        self._t0 = None

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.ms += (time.perf_counter() - self._t0) * 1e3
            self.full += info.get("generation") == 2
            self._t0 = None

    def install(self) -> GcPauses:
        import gc

        gc.callbacks.append(self)
        return self


# The caching allocator's counters whose growth inside a step means device calls in its host
# time: a retry frees every cached block (cudaFree synchronizes the device) and mallocs again.
ALLOCATOR_COUNTERS = ("num_alloc_retries", "num_device_alloc", "num_device_free")


def allocator_counts(stats: dict) -> dict[str, int]:
    """The `ALLOCATOR_COUNTERS` of one `torch.cuda.memory_stats()` reading (0 where absent)."""
    return {k: int(stats.get(k, 0)) for k in ALLOCATOR_COUNTERS}


def allocator_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k.removeprefix("num_"): after[k] - before[k] for k in ALLOCATOR_COUNTERS}


class ThreadMeter:
    """The calling thread's CPU time, run-queue wait and context switches, read before and
    after a step: whether a slow host step was slow work (``cpu_ms`` up), a thread kept off the
    CPU (``runq_ms``, ``ivcsw``) or a thread blocked on the device or a lock (``vcsw`` up, host ms
    above ``cpu_ms + runq_ms``). Linux only for the run queue (``/proc/thread-self/schedstat``,
    nanoseconds on a CPU, waiting on a run queue, slices); None where it cannot be read."""

    @staticmethod
    def _runq_ns() -> int | None:
        try:
            with open("/proc/thread-self/schedstat") as f:
                return int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            return None

    def read(self) -> tuple:
        import resource

        ru = resource.getrusage(resource.RUSAGE_THREAD)
        return time.thread_time(), self._runq_ns(), ru.ru_nvcsw, ru.ru_nivcsw

    @staticmethod
    def delta(before: tuple, after: tuple) -> dict:
        runq = None if None in (before[1], after[1]) else round((after[1] - before[1]) / 1e6, 3)
        return {
            "cpu_ms": round((after[0] - before[0]) * 1e3, 3),
            "runq_ms": runq,
            "vcsw": after[2] - before[2],
            "ivcsw": after[3] - before[3],
        }


def _wrap_forward(model_runner_module) -> None:
    import torch

    from sglang_mixgraph.kits.gpu_machine import dp_step_fields

    cls = model_runner_module.ModelRunner
    forward = cls.forward
    steps = _out("steps") + ".jsonl"
    wanted = {
        mode: {int(k) for k in os.environ.get(var, "").split(",") if k.strip()}
        for mode, var in (("MIXED", "SLICE_PROFILE_MIXED"), ("DECODE", "SLICE_PROFILE_DECODE"))
    }
    seen = {"MIXED": 0, "DECODE": 0}
    pauses = GcPauses().install()
    meter = ThreadMeter()

    def probed_forward(self, forward_batch, *args, **kwargs):
        mode = getattr(forward_batch.forward_mode, "name", str(forward_batch.forward_mode))
        try:
            shape = dict(step_shape(forward_batch), **dp_step_fields(forward_batch))
        except Exception as e:  # noqa: BLE001
            shape = {"shape_error": repr(e)}
        prof = None
        if mode in seen:
            seen[mode] += 1
            if seen[mode] in wanted[mode]:
                acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
                prof = torch.profiler.profile(activities=acts, with_stack=True)
        torch.cuda.synchronize()
        alloc0 = allocator_counts(torch.cuda.memory_stats())  # read outside the timed window
        if prof is not None:
            prof.__enter__()
        gc0 = (pauses.ms, pauses.full)
        th0 = meter.read()
        t0 = time.perf_counter()
        out = forward(self, forward_batch, *args, **kwargs)
        t1 = time.perf_counter()
        thread = meter.delta(th0, meter.read())
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        rec = {
            "mode": mode,
            **shape,
            "graph": bool(getattr(out, "can_run_graph", False)),
            "host_ms": round((t1 - t0) * 1e3, 3),
            "wall_ms": round((t2 - t0) * 1e3, 3),
            "gc_ms": round(pauses.ms - gc0[0], 3),
            "gc_full": pauses.full - gc0[1],
            **thread,
            **allocator_delta(alloc0, allocator_counts(torch.cuda.memory_stats())),
        }
        if prof is not None:
            e0 = time.perf_counter()
            prof.__exit__(None, None, None)
            tag = f"{'' if mode == 'MIXED' else 'd'}{seen[mode]}"
            rec["profiled"] = tag
            table = {"step": rec, **kernel_table(prof), **host_table(prof)}
            table["classes"] = _class_table(prof, f"{_out('trace')}_{tag}.json")
            with open(f"{_out('profile')}_{tag}.json", "w") as f:
                json.dump(table, f)
            # Outside the timed window but inside the burst: 5-25 s a step, so a burst that
            # profiled a step is read with this taken off.
            rec["export_s"] = round(time.perf_counter() - e0, 2)
        _append(steps, rec)
        return out

    cls.forward = probed_forward


def _wrap_capture(runner_module) -> None:
    import torch

    cls = runner_module.PrefillCudaGraphRunner
    capture_one_shape = cls.capture_one_shape
    path = _out("capture") + ".jsonl"

    from sglang_mixgraph.kits.gpu_machine import dp_rank_fields

    def measured_capture_one_shape(self, size, *args, **kwargs):
        try:
            rank = dp_rank_fields()
        except Exception as e:  # noqa: BLE001
            rank = {"rank_error": repr(e)}
        torch.cuda.synchronize()
        free0, _ = torch.cuda.mem_get_info()
        reserved0 = torch.cuda.memory_reserved()
        t0 = time.perf_counter()
        capture_one_shape(self, size, *args, **kwargs)
        torch.cuda.synchronize()
        free1, _ = torch.cuda.mem_get_info()
        _append(
            path,
            {
                "size": int(size),
                "variant": kwargs.get("prefix_num_chunks", 0),
                "device_mib": round((free0 - free1) / 2**20, 1),
                "torch_reserved_mib": round((torch.cuda.memory_reserved() - reserved0) / 2**20, 1),
                "free_after_gib": round(free1 / 2**30, 2),
                "seconds": round(time.perf_counter() - t0, 2),
                **rank,
            },
        )

    cls.capture_one_shape = measured_capture_one_shape


def install() -> None:
    if not os.environ.get("SLICE_PROBE_DIR"):
        return
    from engine_standins import AfterImport  # tools/gpu-upstream/engine, first on PYTHONPATH

    sys.meta_path.insert(0, AfterImport("sglang.srt.model_executor.model_runner", _wrap_forward))
    sys.meta_path.insert(
        0,
        AfterImport("sglang.srt.model_executor.runner.prefill_cuda_graph_runner", _wrap_capture),
    )
