"""Where a replayed step's GPU time goes, against the same step run eagerly, from two torch
profiler traces (chrome JSON) of one forward each. Reads nothing but the traces.

A breakable-graph replay launches its segments with ``cudaGraphLaunch`` and runs eager breaks
between them; an eager step launches every kernel itself, so classes by launch frame do not
compare across the two (``core.kernel_classes`` can class a graph's kernels by name only), and a
replay runs a graph's parallel branches on streams of their own, so the two runs' op orders
differ too. The two runs are therefore compared by what each op is (its name; vendor GEMMs as
one kind, since cuBLAS picks other tiles and layouts at another M), summed per kind: the same
kind on both sides is the same work at another cost, a kind on one side only is work the other
run does not do (the replay's copies into the buffers its segments read, the eager step's own
fills). A kind's class is the eager run's (by launch frame). Every GPU op of the replay is
placed: before the first segment (the replay's prepare), in segment i, or in the break after
segment i. Summed op times count a parallel branch's overlap twice; the GPU's busy time (each
run's ops merged by interval) and its idle gaps, by what the GPU waited for, are given beside
them. Used by ``tools/rank-slice/step_attribution.py``.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from sglang_mixgraph.core.kernel_classes import (
    GRAPH_LAUNCH,
    LAUNCH_CATS,
    gpu_events,
    launch_frames,
    merge_intervals,
)

_COPY = re.compile(r"^(Memcpy \w+|Memset)")
# Vendor GEMM kernels, named by tile and layout (which change with M); SGLang's own kernels that
# say "gemm" in their names (TileLang's mHC, Triton's MoE) keep their names.
VENDOR_GEMM = re.compile(r"^(nvjet|void cutlass|cutlass|sm90_xmma|void cublasLt::|cublas)", re.I)


@dataclass(frozen=True)
class GpuOp:
    """One kernel, copy or memset of a traced step, in execution order."""

    ts: float
    name: str
    ms: float
    cls: str  # core.kernel_classes' class from the op's own trace
    nbytes: int | None  # copies and memsets
    place: str  # "eager", "prepare", "segment i", "break i", "after"
    kind: str  # what pairs it with the other run's op (see `kind_of`)


def kind_of(name: str) -> str:
    """What an op is, for comparing: copies and memsets by direction, vendor GEMMs as one kind,
    other kernels by their full name up to the argument list."""
    m = _COPY.match(name)
    if m:
        return m.group(1)
    if VENDOR_GEMM.match(name):
        return "vendor GEMMs (cuBLAS)"
    return name.split("(", 1)[0][:200]


def gpu_ops(events: list) -> list[GpuOp]:
    """The step's GPU ops in start order, each placed relative to the graph launches."""
    launches = {}
    for ev in events:
        if ev.get("cat") in LAUNCH_CATS and "correlation" in ev.get("args", {}):
            launches[ev["args"]["correlation"]] = (ev["name"], float(ev["ts"]))
    graph_ts = sorted(ts for name, ts in launches.values() if GRAPH_LAUNCH.search(name))
    segment_of = {
        corr: graph_ts.index(ts)
        for corr, (name, ts) in launches.items()
        if GRAPH_LAUNCH.search(name)
    }
    ops = []
    for ev, cls, _ in gpu_events(events, launch_frames(events)):
        corr = ev.get("args", {}).get("correlation")
        if corr in segment_of:
            place = f"segment {segment_of[corr]}"
        elif not graph_ts:
            place = "eager"
        else:
            launched = launches.get(corr, (None, float(ev["ts"])))[1]
            # launched after `before` segments: the prepare, the break after segment
            # before - 1, or after the last segment
            before = sum(ts < launched for ts in graph_ts)
            if before == 0:
                place = "prepare"
            elif before == len(graph_ts):
                place = "after"
            else:
                place = f"break {before - 1}"
        nbytes = ev.get("args", {}).get("bytes")
        ops.append(
            GpuOp(
                ts=float(ev["ts"]),
                name=ev["name"],
                ms=float(ev["dur"]) / 1e3,
                cls=cls,
                nbytes=int(nbytes) if isinstance(nbytes, int | float) else None,
                place=place,
                kind=kind_of(ev["name"]),
            )
        )
    ops.sort(key=lambda op: op.ts)
    return ops


def _place_kind(place: str) -> str:
    return place.split(" ", 1)[0]


def _side(ops: list[GpuOp]) -> dict:
    sizes = [op.nbytes for op in ops if op.nbytes is not None]
    return {
        "count": len(ops),
        "ms": round(sum(op.ms for op in ops), 3),
        "bytes": sum(sizes) if sizes else None,
    }


def busy_and_idle(ops: list[GpuOp]) -> tuple[float, dict[str, float]]:
    """The GPU's busy time over ``ops`` (ms, overlap counted once) and its idle time inside the
    step, per place of the op the GPU waited for (a gap before a break's first op is the GPU
    waiting on the host's break)."""
    spans = merge_intervals((op.ts, op.ts + op.ms * 1e3) for op in ops)
    first_at: dict[float, GpuOp] = {}
    for op in ops:
        first_at.setdefault(op.ts, op)
    idle: dict[str, float] = defaultdict(float)
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        idle[_place_kind(first_at[start].place)] += (start - end) / 1e3
    return sum(e - s for s, e in spans) / 1e3, dict(idle)


def attribute(eager_events: list, replay_events: list, top: int = 16) -> dict:
    """The replay's GPU time against the eager step's, per kind of op (``by_kind``, the largest
    differences first; ``top`` of them) and per class (a kind takes the class the eager run gave
    most of its time), and the replay's time by place. The kinds' differences add up to
    ``delta_ms``. ``busy_ms`` is the time the GPU was busy in each run (overlap counted once) and
    ``idle_ms`` its gaps between the step's first op and its last."""
    eager, replay = gpu_ops(eager_events), gpu_ops(replay_events)
    kinds: dict[str, dict[str, list[GpuOp]]] = defaultdict(lambda: {"eager": [], "replay": []})
    for side, ops in (("eager", eager), ("replay", replay)):
        for op in ops:
            kinds[op.kind][side].append(op)
    rows = []
    for kind, sides in kinds.items():
        by_cls = defaultdict(float)
        for op in sides["eager"] or sides["replay"]:
            by_cls[op.cls] += op.ms
        places = defaultdict(int)
        for op in sides["replay"]:
            places[_place_kind(op.place)] += 1
        e, r = _side(sides["eager"]), _side(sides["replay"])
        rows.append(
            {
                "kind": kind,
                "class": max(by_cls, key=by_cls.get),
                "eager": e,
                "replay": {**r, "places": dict(places)},
                "delta_ms": round(r["ms"] - e["ms"], 3),
            }
        )
    rows.sort(key=lambda row: -abs(row["delta_ms"]))
    by_class = defaultdict(lambda: {"eager_ms": 0.0, "replay_ms": 0.0})
    for row in rows:
        by_class[row["class"]]["eager_ms"] += row["eager"]["ms"]
        by_class[row["class"]]["replay_ms"] += row["replay"]["ms"]
    places = defaultdict(float)
    for op in replay:
        places[_place_kind(op.place)] += op.ms
    eager_ms, replay_ms = sum(op.ms for op in eager), sum(op.ms for op in replay)
    (eager_busy, eager_idle), (replay_busy, replay_idle) = (
        busy_and_idle(eager),
        busy_and_idle(replay),
    )
    return {
        "eager_ms": round(eager_ms, 3),
        "replay_ms": round(replay_ms, 3),
        "delta_ms": round(replay_ms - eager_ms, 3),
        "busy_ms": {
            "eager": round(eager_busy, 3),
            "replay": round(replay_busy, 3),
            "delta": round(replay_busy - eager_busy, 3),
        },
        "idle_ms": {
            "eager": round(sum(eager_idle.values()), 3),
            "replay": round(sum(replay_idle.values()), 3),
            "replay_waiting_for": {p: round(ms, 3) for p, ms in sorted(replay_idle.items())},
        },
        "ops": {"eager": len(eager), "replay": len(replay)},
        "by_class": {
            c: {
                "eager_ms": round(v["eager_ms"], 3),
                "replay_ms": round(v["replay_ms"], 3),
                "delta_ms": round(v["replay_ms"] - v["eager_ms"], 3),
            }
            for c, v in sorted(by_class.items())
        },
        "by_kind": rows[:top],
        "kinds": len(rows),
        "replay_by_place": {p: round(ms, 3) for p, ms in sorted(places.items())},
        "segments": len({op.place for op in replay if op.place.startswith("segment")}),
    }
