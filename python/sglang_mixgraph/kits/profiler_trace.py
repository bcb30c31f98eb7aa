"""Chrome traces as torch.profiler exports them, built event by event, for tests and fixtures.

The CPU side (the document's header, ``M`` metadata, ``user_annotation`` / ``python_function``
/ ``cpu_op`` events and their args) follows torch 2.14's own export, which a test compares with
a real CPU profile. The GPU side follows what Kineto writes from CUPTI on a CUDA machine (none
is here): launch calls as ``cuda_runtime`` / ``cuda_driver`` events on the launching thread
carrying a ``correlation`` id, the GPU work as ``kernel`` / ``gpu_memcpy`` events on
``pid`` = device and ``tid`` = stream with the same id (every kernel of a ``cudaGraphLaunch``
shares the launch's), the ``ac2g`` flow arrows between them, ``gpu_user_annotation`` mirrors
of a ``record_function`` span, and ``deviceProperties`` naming the GPU. Times in microseconds.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

# CUPTI callback ids Kineto records in a launch call's args.
CBID = {
    "cudaLaunchKernel": 211,
    "cudaGraphLaunch": 311,
    "cudaMemcpyAsync": 41,
    "cuLaunchKernel": 307,
}
DRIVER_CALLS = ("cuLaunchKernel",)

# deviceProperties entries as Kineto writes them (name, compute capability, memory, SMs).
GPUS = {
    "H200": ("NVIDIA H200", 9, 0, 150_110_011_392, 132),
    "H100": ("NVIDIA H100 80GB HBM3", 9, 0, 85_045_395_456, 132),
    "B200": ("NVIDIA B200", 10, 0, 191_503_138_816, 148),
}


def device_properties(gpu: str, device: int = 0) -> dict:
    name, major, minor, memory, sms = GPUS[gpu]
    return {
        "id": device,
        "name": name,
        "totalGlobalMem": memory,
        "computeMajor": major,
        "computeMinor": minor,
        "maxThreadsPerBlock": 1024,
        "maxThreadsPerMultiprocessor": 2048,
        "regsPerBlock": 65536,
        "warpSize": 32,
        "sharedMemPerBlock": 49152,
        "numSms": sms,
        "regsPerMultiprocessor": 65536,
        "sharedMemPerBlockOptin": 232448,
        "sharedMemPerMultiprocessor": 233472,
    }


@dataclass
class TraceBuilder:
    """One process's trace: CPU events on (``pid``, ``tid``), GPU events on ``device`` /
    ``stream``. ``gpu`` names the card for ``deviceProperties`` (None: a CPU-only export)."""

    gpu: str | None = "H200"
    pid: int = 4242
    tid: int = 4242
    device: int = 0
    stream: int = 7
    events: list = field(default_factory=list)
    _external: int = 0
    _correlation: int = 0
    _python_id: int = 0

    def _next_external(self) -> int:
        self._external += 1
        return self._external

    def cpu(self, cat: str, name: str, ts: float, dur: float, **args) -> None:
        """A complete CPU event: ``python_function`` (``path.py(line): func`` or
        ``nn.Module: Name_0``), ``cpu_op`` or ``user_annotation``."""
        if cat == "python_function":
            self._python_id += 1
            base = {"Python id": self._python_id}
        else:
            base = {"External id": self._next_external(), "Record function id": 0}
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": self.pid,
                "tid": self.tid,
                "ts": float(ts),
                "dur": float(dur),
                "args": {**base, **args},
            }
        )

    def frame(self, name: str, ts: float, dur: float) -> None:
        self.cpu("python_function", name, ts, dur)

    def annotation(self, name: str, ts: float, dur: float, gpu_span: tuple | None = None) -> None:
        """A ``record_function`` span (SGLang's ``step[...]``), and its GPU mirror over
        ``gpu_span`` = (start, end) when given."""
        self.cpu("user_annotation", name, ts, dur)
        if gpu_span is not None:
            start, end = gpu_span
            self.events.append(
                {
                    "ph": "X",
                    "cat": "gpu_user_annotation",
                    "name": name,
                    "pid": self.device,
                    "tid": self.stream,
                    "ts": float(start),
                    "dur": float(end - start),
                    "args": {"External id": self._external},
                }
            )

    def launch(
        self,
        ts: float,
        kernels: list[tuple[str, float, float]],
        call: str = "cudaLaunchKernel",
        dur: float = 4.0,
        nbytes: int | None = None,
    ) -> int:
        """A launch call at ``ts`` and the GPU work it queued: ``kernels`` as (name, start,
        duration); several for a ``cudaGraphLaunch``; a copy's size in ``nbytes``. Returns the
        correlation id."""
        self._correlation += 1
        corr = self._correlation
        external = self._next_external()
        self.events.append(
            {
                "ph": "X",
                "cat": "cuda_driver" if call in DRIVER_CALLS else "cuda_runtime",
                "name": call,
                "pid": self.pid,
                "tid": self.tid,
                "ts": float(ts),
                "dur": float(dur),
                "args": {"External id": external, "cbid": CBID[call], "correlation": corr},
            }
        )
        for name, start, length in kernels:
            memcpy = call == "cudaMemcpyAsync"
            args = {"External id": external, "device": self.device, "context": 1}
            args |= {"stream": self.stream, "correlation": corr}
            if memcpy and nbytes is not None:
                args |= {
                    "bytes": nbytes,
                    "memory bandwidth (GB/s)": nbytes / length / 1e3 if length else 0.0,
                }
            if not memcpy:
                args |= {"registers per thread": 32, "shared memory": 0, "grid": [132, 1, 1]}
                args |= {"block": [128, 1, 1], "est. achieved occupancy %": 25}
            self.events.append(
                {
                    "ph": "X",
                    "cat": "gpu_memcpy" if memcpy else "kernel",
                    "name": name,
                    "pid": self.device,
                    "tid": self.stream,
                    "ts": float(start),
                    "dur": float(length),
                    "args": args,
                }
            )
            self.events.append(
                {"ph": "s", "id": corr, "pid": self.pid, "tid": self.tid, "ts": float(ts)}
                | {"cat": "ac2g", "name": "ac2g"}
            )
            self.events.append(
                {"ph": "f", "id": corr, "pid": self.device, "tid": self.stream}
                | {"ts": float(start), "cat": "ac2g", "name": "ac2g", "bp": "e"}
            )
        return corr

    def document(self) -> dict:
        """The exported document: torch's header keys, then the metadata and the events."""
        meta = [
            {"ph": "M", "name": "process_name", "ts": 0.0, "pid": self.pid, "tid": 0}
            | {"args": {"name": "python3"}},
            {"ph": "M", "name": "process_labels", "ts": 0.0, "pid": self.pid, "tid": 0}
            | {"args": {"labels": "CPU"}},
            {"ph": "M", "name": "thread_name", "ts": 0.0, "pid": self.pid, "tid": self.tid}
            | {"args": {"name": f"thread {self.tid} (python3)"}},
        ]
        if self.gpu is not None:
            meta += [
                {"ph": "M", "name": "process_name", "ts": 0.0, "pid": self.device, "tid": 0}
                | {"args": {"name": "python3"}},
                {"ph": "M", "name": "process_labels", "ts": 0.0, "pid": self.device, "tid": 0}
                | {"args": {"labels": f"GPU {self.device}"}},
                {"ph": "M", "name": "thread_name", "ts": 0.0, "pid": self.device}
                | {"tid": self.stream, "args": {"name": f"stream {self.stream}"}},
            ]
        return {
            "schemaVersion": 1,
            "deviceProperties": [device_properties(self.gpu, self.device)] if self.gpu else [],
            "trace_id": "0" * 32,
            "with_stack": 1,
            "host_name": "gpu-node",
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": 1790000000000000000,
            "traceEvents": meta + self.events,
            "traceName": "",
        }

    def write(self, path: str | Path) -> Path:
        """Write the document, gzip-compressed when ``path`` ends in ``.gz`` (as SGLang names
        its traces, ``*.trace.json.gz``)."""
        path = Path(path)
        text = json.dumps(self.document(), separators=(",", ":"))
        if path.suffix == ".gz":
            # mtime 0: the same trace gives the same bytes (committed fixtures stay stable)
            with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
                f.write(text.encode())
        else:
            path.write_text(text)
        return path
