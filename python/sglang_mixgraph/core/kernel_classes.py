"""GPU kernel time by class, read from a torch profiler trace (the chrome JSON it exports).

Classes: attention (FlashMLA and the rest of the attention path: KV store, compressor,
metadata), dequant (the sparse-prefill workspace's KV-cache dequantization: DeepSeek-V4's and
DSA's ``dequant_k_cache`` kernels), indexer (the c4 indexer's projections, logits and top-k),
mhc (hyper-connection pre and post, their GEMMs included), norm, gemm (the dense projections),
moe (router, experts, shared expert), elementwise (copies, casts, fills), other. A kernel is
classed by the Python that launched it where the trace has stacks (``with_stack=True``: its
launch call is matched by correlation id, then the ``python_function`` frames around that call
on its thread are read), and by its own name otherwise (graph replays launch every kernel from
one ``cudaGraphLaunch``). Reads nothing but the trace: no torch, no sglang, no GPU. Used by
``sglang-mixgraph advise`` and ``tools/rank-slice/step_classes.py``.
"""

from __future__ import annotations

import gzip
import json
import lzma
import re
from collections import defaultdict
from collections.abc import Iterator

CLASSES = ("attention", "dequant", "indexer", "mhc", "norm", "gemm", "moe", "elementwise", "other")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
FRAME_CATS = ("python_function", "cpu_op", "user_annotation")
# The host call that replays a captured graph (runtime `cudaGraphLaunch`, driver `cuGraphLaunch`).
GRAPH_LAUNCH = re.compile(r"GraphLaunch", re.I)

# Kernels whose name alone says their class, whoever launched them.
FLASHMLA = re.compile(
    r"flash_?mla|flash_fwd_splitkv_mla|sparse_?attn|splitkv_mla|mla_combine", re.I
)
# The workspace dequantization: sglang.kernels.ops.attention.dsv4.dequant_k_cache (its Triton
# kernels, and the SM90 Q8KV8 gather) and dsa.dequant_k_cache (GLM-5). Other dequantizations
# (weights, activations) are not the workspace's and keep their scope's class.
DEQUANT = re.compile(r"dequant(?:ize)?_k_cache|gather_dequant_requant", re.I)
GEMM_NAME = re.compile(r"gemm|nvjet|cutlass|xmma|cublas|matmul|scaled_mm|_mm_|wgmma|sm90_", re.I)
# The Python that launched a kernel: file paths, functions and nn.Module names in its frames,
# read from the innermost frame out; the first frame that names a class decides. A compressor or
# a linear layer names none: it belongs to the attention or indexer around it.
SCOPE_RULES = (
    ("dequant", DEQUANT),
    ("mhc", re.compile(r"mhc|hc_pre|hc_post|hyper_?conn|sinkhorn", re.I)),
    ("moe", re.compile(r"moe|experts|router", re.I)),
    ("indexer", re.compile(r"indexer|mqa_logits|topk_transform|dsv4/topk", re.I)),
    ("norm", re.compile(r"layernorm|rmsnorm|norm\.py", re.I)),
    ("attention", re.compile(r"attention|flash_mla|dsv4|kv_cache|memory_pool", re.I)),
)
# Scopes whose GEMMs count as theirs; elsewhere a GEMM kernel is a dense projection (gemm).
OWN_GEMMS = ("mhc", "moe", "indexer")
# Kernel names when no frame decides (graph replays, traces without stacks).
NAME_RULES = (
    ("mhc", re.compile(r"mhc|sinkhorn|hc_(pre|post|split)", re.I)),
    ("indexer", re.compile(r"indexer|mqa_logits|topk|top_k", re.I)),
    ("moe", re.compile(r"moe|expert|align_block|sum_reduce", re.I)),
    ("norm", re.compile(r"norm", re.I)),
    ("attention", re.compile(r"store_cache|compress|page_table|swa|causal|rope", re.I)),
    (
        "elementwise",
        re.compile(r"elementwise|copy|memcpy|memset|fill|cast|cat_|reduce|index", re.I),
    ),
)


def read_trace(path: str) -> dict:
    """The whole trace document (``traceEvents``, ``deviceProperties``, ...): a chrome-trace
    JSON, optionally gzip or xz compressed; a bare list of events comes back as
    ``{"traceEvents": [...]}``."""
    opener = gzip.open if path.endswith(".gz") else lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    if isinstance(data, list):
        return {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ValueError("no traceEvents list: not a chrome trace")
    return data


def load_trace(path: str) -> list:
    """The trace's events (see :func:`read_trace`)."""
    return read_trace(path)["traceEvents"]


def launch_frames(events: list) -> dict:
    """For each launch call (correlation id), the names of the CPU frames enclosing it on its
    thread, outermost first."""
    by_tid = defaultdict(list)
    launches = []
    for ev in events:
        cat = ev.get("cat")
        if cat in FRAME_CATS and "dur" in ev:
            by_tid[ev.get("tid")].append(
                (float(ev["ts"]), float(ev["ts"]) + float(ev["dur"]), ev["name"])
            )
        elif cat in LAUNCH_CATS and "correlation" in ev.get("args", {}):
            launches.append((ev.get("tid"), float(ev["ts"]), ev["args"]["correlation"]))
    by_launch_tid = defaultdict(list)
    for tid, ts, corr in launches:
        by_launch_tid[tid].append((ts, corr))
    out = {}
    for tid, calls in by_launch_tid.items():
        frames = sorted(by_tid.get(tid, ()), key=lambda f: (f[0], -f[1]))
        stack, i = [], 0
        # One sweep in time order: the open frames at each call are those started before it and
        # not yet ended (frames of one thread nest, so the open ones stay few).
        for ts, corr in sorted(calls):
            while i < len(frames) and frames[i][0] <= ts:
                stack = [f for f in stack if f[1] >= frames[i][0]]
                stack.append(frames[i])
                i += 1
            stack = [f for f in stack if f[1] >= ts]
            out[corr] = [f[2] for f in stack]
    return out


def scope_of(frames: list) -> str | None:
    """The class the innermost frame that names one gives, or None."""
    for frame in reversed(frames):
        for cls, rule in SCOPE_RULES:
            if rule.search(frame):
                return cls
    return None


def classify(kernel: str, frames: list) -> str:
    """The class of one kernel, from its name and the frames (outermost first) that launched it."""
    if FLASHMLA.search(kernel):
        return "attention"
    if DEQUANT.search(kernel):
        return "dequant"
    scope = scope_of(frames)
    if GEMM_NAME.search(kernel) and scope not in OWN_GEMMS:
        return "gemm"
    if scope is not None:
        return scope
    for cls, rule in NAME_RULES:
        if rule.search(kernel):
            return cls
    return "other"


def gpu_events(events: list, frames: dict | None = None) -> Iterator[tuple[dict, str, bool]]:
    """Every timed GPU event (kernel, memcpy, memset) with its class and whether its launch had
    frames to read; ``frames`` is :func:`launch_frames` of the same events (computed when
    not given)."""
    frames = launch_frames(events) if frames is None else frames
    for ev in events:
        if ev.get("cat") not in GPU_CATS or "dur" not in ev:
            continue
        launched_by = frames.get(ev.get("args", {}).get("correlation"), [])
        yield ev, classify(ev["name"], launched_by), bool(launched_by)


def merge_intervals(intervals) -> list[tuple[float, float]]:
    """(start, end) intervals merged where they overlap or touch, in start order: the spans in
    which the GPU was busy. A replayed graph runs its parallel branches on streams of their own,
    so summed durations exceed the GPU's busy time; these spans count the overlap once."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def busy_ms(intervals) -> float:
    """The GPU's busy time (ms) over (start, end) intervals in microseconds, overlap once."""
    return sum(end - start for start, end in merge_intervals(intervals)) / 1e3


def class_table(events: list, top: int = 5) -> dict:
    """Kernel ms, kernel count and the largest kernels of each class; the total (summed, and the
    GPU's busy time with overlapping kernels counted once); and how many kernels had launch
    frames to read (``with_stack``)."""
    rows = {c: {"ms": 0.0, "count": 0, "kernels": defaultdict(float)} for c in CLASSES}
    total, with_frames, spans = 0.0, 0, []
    for ev, cls, framed in gpu_events(events):
        with_frames += framed
        ms = float(ev["dur"]) / 1e3
        spans.append((float(ev["ts"]), float(ev["ts"]) + float(ev["dur"])))
        rows[cls]["ms"] += ms
        rows[cls]["count"] += 1
        rows[cls]["kernels"][ev["name"][:120]] += ms
        total += ms
    table = {}
    for c, r in rows.items():
        largest = sorted(r["kernels"].items(), key=lambda kv: -kv[1])[:top]
        table[c] = {
            "ms": round(r["ms"], 3),
            "count": r["count"],
            "share": round(r["ms"] / total, 4) if total else 0.0,
            "largest": [{"name": n, "ms": round(m, 3)} for n, m in largest],
        }
    kernels = sum(r["count"] for r in rows.values())
    return {
        "kernel_ms": round(total, 3),
        "busy_ms": round(busy_ms(spans), 3),
        "kernels": kernels,
        "with_frames": with_frames,
        "classes": table,
    }
