"""One rank's profiled forward steps, read from the torch profiler trace SGLang wrote for it.

SGLang 0.5.23 wraps every `ModelRunner.forward` in a span named by `build_step_span_name`
(sglang.srt.utils.profile_utils): `step[MODE bs=N]`, `toks=` for EXTEND, and with the profile's
detailed annotations (`build_detailed_annotation_suffix` in model_executor.step_span_utils)
the request aggregates: `c=` prefill requests and `g=` decode rows of a MIXED step, `c_sq` /
`c_sk` the prefill rows and their KV lengths, `g_sq` / `g_sk` the same for decode rows, and
`forward_id=`. The span is the step's host time; a launch call inside it on its thread is the
step's, and a GPU event with that call's correlation id (all kernels of a graph launch share
it) is the step's GPU work, classed by core.kernel_classes. A step with a graph launch replayed
a CUDA graph. The label is taken at the forward's entry: an eager MIXED step is still MIXED.
"""

from __future__ import annotations

import bisect
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from statistics import median

from sglang_mixgraph.core.kernel_classes import (
    CLASSES,
    FRAME_CATS,
    GRAPH_LAUNCH,
    LAUNCH_CATS,
    busy_ms,
    gpu_events,
    launch_frames,
)

STEP_PREFIX = "step["
_LABEL = re.compile(r"^step\[(?P<mode>[A-Z_0-9]+) bs=(?P<bs>\d+)(?P<rest>[^\]]*)\]$")
_FIELD = re.compile(r"(\w+)=(-?\d+)")
# This plugin's code in a step's frames: its patch modules, as the trace names their files.
_PATCH_FRAME = re.compile(r"sglang_mixgraph/patches/(\w+)")


@dataclass(frozen=True)
class StepLabel:
    """A step span's name: the forward mode, the batch size and the annotation fields."""

    mode: str
    bs: int
    fields: dict[str, int]

    @classmethod
    def parse(cls, name: str) -> StepLabel | None:
        m = _LABEL.match(name)
        if m is None:
            return None
        fields = {k: int(v) for k, v in _FIELD.findall(m.group("rest"))}
        return cls(mode=m.group("mode"), bs=int(m.group("bs")), fields=fields)

    def _get(self, key: str) -> int | None:
        return self.fields.get(key)

    @property
    def decode_rows(self) -> int | None:
        """Running requests decoding one token in this step (None: the label does not say)."""
        return {"DECODE": self.bs, "MIXED": self._get("g"), "EXTEND": 0}.get(self.mode)

    @property
    def prefill_requests(self) -> int | None:
        return {"DECODE": 0, "MIXED": self._get("c"), "EXTEND": self.bs}.get(self.mode)

    @property
    def prefill_rows(self) -> int | None:
        return {"DECODE": 0, "MIXED": self._get("c_sq"), "EXTEND": self._get("toks")}.get(self.mode)

    @property
    def rows(self) -> int | None:
        """The step's token rows (what a CUDA graph bucket must hold)."""
        if self.mode == "DECODE":
            return self._get("g_sq") or self.bs
        pre, dec = self.prefill_rows, self.decode_rows
        return None if pre is None or dec is None else pre + dec

    @property
    def prefill_context(self) -> float | None:
        """The prefill requests' mean context (their KV length: prefix plus chunk)."""
        c, sk = self.prefill_requests, self._get("c_sk")
        return sk / c if c and sk is not None else None

    @property
    def decode_context(self) -> float | None:
        """The decode rows' mean context (the trace has only their sum)."""
        g, sk = self.decode_rows, self._get("g_sk")
        return sk / g if g and sk is not None else None

    @property
    def longest_context_at_least(self) -> int | None:
        """A lower bound of the step's longest context: the larger of the two means (a single
        prefill request's is exact); None without the annotations."""
        means = [m for m in (self.prefill_context, self.decode_context) if m is not None]
        return int(max(means)) if means else None


@dataclass
class Step:
    """One forward on one rank: host span, the GPU work it launched, by kernel class."""

    rank: str
    label: StepLabel
    start_us: float
    host_ms: float
    launches: int = 0  # launch calls that queued GPU work (a graph launch counts once)
    graph_launches: int = 0
    kernels: int = 0
    kernel_ms: float = 0.0  # the GPU's busy time: overlapping work (a graph's side streams) once
    gpu_start_us: float | None = None
    gpu_end_us: float | None = None
    class_ms: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0.0))
    patches_seen: set[str] = field(default_factory=set)
    gpu_idle_after_ms: float | None = None  # until the next step's first GPU work on this rank
    gpu_intervals: list[tuple[float, float]] = field(default_factory=list, repr=False)

    @property
    def mode(self) -> str:
        return self.label.mode

    @property
    def replayed(self) -> bool:
        return self.graph_launches > 0

    @property
    def gpu_span_ms(self) -> float:
        if self.gpu_start_us is None or self.gpu_end_us is None:
            return 0.0
        return (self.gpu_end_us - self.gpu_start_us) / 1e3

    @property
    def wall_ms(self) -> float:
        """The longer of the host span and the GPU span: what the step occupies."""
        return max(self.host_ms, self.gpu_span_ms)

    @property
    def host_bound(self) -> bool:
        """The host took longer to launch the step than its kernels ran: the GPU waited."""
        return self.host_ms > self.kernel_ms


@dataclass(frozen=True)
class Gpu:
    name: str
    major: int
    minor: int

    @property
    def arch(self) -> str:
        return f"sm{self.major}{self.minor}"


@dataclass
class RankTrace:
    rank: str
    gpu: Gpu | None
    with_stack: bool
    steps: list[Step]


def _gpu_of(doc: dict) -> Gpu | None:
    props = doc.get("deviceProperties") or []
    if not props or not isinstance(props[0], dict) or "computeMajor" not in props[0]:
        return None
    p = props[0]
    return Gpu(str(p.get("name", "unknown GPU")), int(p["computeMajor"]), int(p["computeMinor"]))


class _Spans:
    """The step spans of one thread, to find the one enclosing a time."""

    def __init__(self, steps: list[tuple[float, float, Step]]):
        self.steps = sorted(steps, key=lambda s: s[0])
        self.starts = [s[0] for s in self.steps]

    def at(self, ts: float) -> Step | None:
        i = bisect.bisect_right(self.starts, ts) - 1
        # Spans of one thread do not overlap in SGLang; look back a little in case one nests.
        for j in range(i, max(i - 4, -1), -1):
            start, end, step = self.steps[j]
            if start <= ts <= end:
                return step
        return None


def read_steps(doc: dict, rank: str) -> RankTrace:
    """The steps of one rank's trace document (core.kernel_classes.read_trace), in host order,
    each with its GPU work and the GPU's idle time before the next step's."""
    events = doc["traceEvents"]
    by_tid: dict = defaultdict(list)
    for ev in events:
        name = ev.get("name", "")
        if ev.get("cat") == "user_annotation" and name.startswith(STEP_PREFIX) and "dur" in ev:
            label = StepLabel.parse(name)
            if label is None:
                continue
            ts, dur = _time(ev, "ts"), _time(ev, "dur")
            step = Step(rank=rank, label=label, start_us=ts, host_ms=dur / 1e3)
            by_tid[ev.get("tid")].append((ts, ts + dur, step))
    spans = {tid: _Spans(steps) for tid, steps in by_tid.items()}
    steps = [s for tid_steps in spans.values() for _, _, s in tid_steps.steps]
    if not steps:
        return RankTrace(rank, _gpu_of(doc), bool(doc.get("with_stack")), [])

    launch_step: dict = {}
    graph_calls: set = set()
    for ev in events:
        cat = ev.get("cat")
        if cat in LAUNCH_CATS:
            corr = ev.get("args", {}).get("correlation")
            where = spans.get(ev.get("tid"))
            step = where.at(float(ev["ts"])) if where is not None and corr is not None else None
            if step is not None:
                launch_step[corr] = step
                if GRAPH_LAUNCH.search(ev.get("name", "")):
                    graph_calls.add(corr)
        elif cat in FRAME_CATS and "sglang_mixgraph/" in ev.get("name", ""):
            where = spans.get(ev.get("tid"))
            step = where.at(float(ev["ts"])) if where is not None else None
            m = _PATCH_FRAME.search(ev["name"])
            if step is not None and m:
                step.patches_seen.add(m.group(1))

    counted: set = set()
    for ev, cls, _ in gpu_events(events, launch_frames(events)):
        corr = ev.get("args", {}).get("correlation")
        step = launch_step.get(corr)
        if step is None:
            continue  # GPU work launched outside any step (the scheduler's own copies)
        if corr not in counted:
            counted.add(corr)
            step.launches += 1
            step.graph_launches += corr in graph_calls
        start, dur = _time(ev, "ts"), _time(ev, "dur")
        ms = dur / 1e3
        step.kernels += 1
        step.gpu_intervals.append((start, start + dur))
        step.class_ms[cls] += ms
        step.gpu_start_us = start if step.gpu_start_us is None else min(step.gpu_start_us, start)
        end = start + dur
        step.gpu_end_us = end if step.gpu_end_us is None else max(step.gpu_end_us, end)

    for step in steps:
        step.kernel_ms = busy_ms(step.gpu_intervals)
    steps.sort(key=lambda s: s.start_us)
    timed = [s for s in steps if s.gpu_start_us is not None]
    for cur, nxt in zip(timed, timed[1:], strict=False):
        cur.gpu_idle_after_ms = max(0.0, (nxt.gpu_start_us - cur.gpu_end_us) / 1e3)
    return RankTrace(rank, _gpu_of(doc), bool(doc.get("with_stack")), steps)


def _time(ev: dict, key: str) -> float:
    """A span's start or duration; NaN or infinity is a malformed trace, never a figure."""
    value = float(ev[key])
    if not math.isfinite(value):
        raise ValueError(f"{ev.get('name', 'an event')!r} has {key} {value}")
    return value


def med(values) -> float | None:
    """The median of the values that are not None (None when none is)."""
    vals = [v for v in values if v is not None]
    return float(median(vals)) if vals else None
