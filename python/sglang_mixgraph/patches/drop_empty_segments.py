"""SGLANG_OPT_BCG_DROP_EMPTY_SEGMENTS=1: breakable CUDA graphs stop launching empty segments.

Upstream's capture (``BreakableCUDAGraphCapture`` in sglang.srt.model_executor.
runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph) ends a segment at every eager
break and keeps it even when it captured nothing, e.g. between GLM-5's DSA indexer break and
``_eager_bmm_attention``; every replay launches it. Here, just before a segment's capture ends,
the graph under capture is asked for its node count (cuda-python, as upstream's module uses).
An empty segment stays in ``_segments`` (alive, so its hold on the graph memory pool stays; not
instantiated or registered with the dedup registry) and replays run the steps of
``core.graph_segments``: every break in its place, launches only for segments with nodes.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import logging
from collections.abc import Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mixgraph import counters
from sglang_mixgraph.core.graph_segments import num_dropped, replay_steps, run_steps
from sglang_mixgraph.fallback import fallback_once
from sglang_mixgraph.flags import bool_flag
from sglang_mixgraph.registry import Hook, Patch
from sglang_mixgraph.upstream_attrs import (
    GRAPH_DROP_PLAN,
    GRAPH_NEXT_SEGMENT_HAS_NODES,
    GRAPH_SEGMENT_HAS_NODES,
)

logger = logging.getLogger("sglang_mixgraph")

PATCH_ID = "drop_empty_segments"
BCG_MODULE = (
    "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph"
)
CAPTURE = f"{BCG_MODULE}.BreakableCUDAGraphCapture"
GRAPH = f"{BCG_MODULE}.BreakableCUDAGraph"

DROP_FLAG = bool_flag(
    "SGLANG_OPT_BCG_DROP_EMPTY_SEGMENTS",
    False,
    "Breakable CUDA graphs: keep segments that captured no graph node (back-to-back eager "
    "breaks) but never launch them at replay; breaks keep their order.",
)


@functools.cache
def _bcg():
    return importlib.import_module(BCG_MODULE)


def _cuda_runtime():
    """cuda-python's runtime binding, or None (with the reason counted) where it cannot count."""
    from sglang.srt.utils import is_hip, is_xpu

    if is_hip() or is_xpu():
        fallback_once(PATCH_ID, "not an NVIDIA GPU: segments are not checked for nodes")
        return None
    try:
        from cuda.bindings import runtime
    except ImportError:
        fallback_once(
            PATCH_ID, "cuda-python (cuda.bindings) is not importable: segments are not checked"
        )
        return None
    return runtime


def capture_node_count(capture) -> int | None:
    """How many nodes the graph ``capture`` is recording into holds now, or None when unknown."""
    rt = _cuda_runtime()
    if rt is None:
        return None
    stream = _bcg().get_current_stream()
    err, status, _id, graph, *_ = rt.cudaStreamGetCaptureInfo(stream.cuda_stream)
    active = rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusActive
    if err != rt.cudaError_t.cudaSuccess or status != active:
        fallback_once(PATCH_ID, f"capture state unreadable ({err!r}, {status!r})", key="no capture")
        return None
    err, _nodes, count = rt.cudaGraphGetNodes(graph, 0)
    if err != rt.cudaError_t.cudaSuccess:
        fallback_once(PATCH_ID, f"graph nodes unreadable ({err!r})", key="no node count")
        return None
    return int(count)


def around_end_current_segment(original, self, *args, **kwargs):
    """Decide, before the segment's capture ends, whether it holds any node."""
    if not DROP_FLAG.get():
        return original(self, *args, **kwargs)
    nodes = capture_node_count(self)
    container = self.cuda_graph
    setattr(container, GRAPH_NEXT_SEGMENT_HAS_NODES, nodes is None or nodes > 0)
    try:
        return original(self, *args, **kwargs)
    finally:
        container.__dict__.pop(GRAPH_NEXT_SEGMENT_HAS_NODES, None)


def around_append_segment(original, self, graph, needs_instantiate, *args, **kwargs):
    """Store an empty segment as it is: no instantiation, no dedup registration."""
    has_nodes = self.__dict__.pop(GRAPH_NEXT_SEGMENT_HAS_NODES, None)
    if has_nodes is None:  # not decided at the end of this segment: upstream's way
        return original(self, graph, needs_instantiate, *args, **kwargs)
    facts = self.__dict__.setdefault(GRAPH_SEGMENT_HAS_NODES, [])
    if has_nodes:
        original(self, graph, needs_instantiate, *args, **kwargs)
    else:
        self._segments.append(graph)
    facts.append(has_nodes)
    return None


def around_capture_exit(original, self, *args, **kwargs):
    """After a capture: the replay plan, and one log line with how many segments were dropped."""
    result = original(self, *args, **kwargs)
    container = self.cuda_graph
    facts = container.__dict__.pop(GRAPH_SEGMENT_HAS_NODES, None)
    if facts is None or (args and args[0] is not None):  # not decided, or the capture failed
        return result
    segments, breaks = len(container._segments), len(container._break_fns)
    if len(facts) != segments:
        fallback_once(
            PATCH_ID, "segments stored outside the capture's own ends: replayed as upstream"
        )
        return result
    dropped = num_dropped(facts)
    counters.count(PATCH_ID, "captures_checked")
    logger.info(
        "sglang-mixgraph: breakable CUDA graph captured: %d segments, %d eager breaks; "
        "%d empty segments dropped from replay",
        segments,
        breaks,
        dropped,
    )
    if dropped:
        counters.count(PATCH_ID, "segments_dropped", dropped)
        setattr(
            container, GRAPH_DROP_PLAN, (replay_steps(facts, breaks), segments, breaks, dropped)
        )
    return result


def around_replay(original, self, *args, **kwargs):
    """Run the plan's steps when the capture dropped a segment; upstream's replay otherwise."""
    plan = self.__dict__.get(GRAPH_DROP_PLAN)
    if plan is None:
        return original(self, *args, **kwargs)
    steps, segments, breaks, dropped = plan
    if len(self._segments) != segments or len(self._break_fns) != breaks:
        fallback_once(PATCH_ID, "segments or breaks changed after capture: replayed as upstream")
        return original(self, *args, **kwargs)
    bcg = _bcg()
    token = bcg._current_stream_var.set(bcg.get_device_module().current_stream())
    try:
        run_steps(steps, self._segments, self._break_fns)
    finally:
        bcg._current_stream_var.reset(token)
    counters.count(PATCH_ID, "replays_with_drops")
    counters.count(PATCH_ID, "launches_skipped", dropped)
    return None


def explain_for_deployment(plan) -> str:
    """For `plan`: which of the deployment's graphs (a graph_plan.GraphPlan) the patch acts on."""
    from sglang_mixgraph.planner.graph_plan import breakable_phases

    phases = breakable_phases(plan)
    if not phases:
        return "no breakable CUDA graph in this deployment: nothing to drop"
    return (
        f"{' and '.join(phases)} graphs are breakable: segments that capture no node (two eager "
        "breaks back to back, e.g. the DSA indexer split op then the bmm+attention break) are "
        "kept but not launched at replay; the count is logged per capture"
    )


HOOKS = (
    Hook(
        f"{CAPTURE}._end_current_segment",
        "method",
        "self",
        HookType.AROUND,
        around_end_current_segment,
    ),
    Hook(
        f"{GRAPH}._append_segment",
        "method",
        "self, graph, needs_instantiate",
        HookType.AROUND,
        around_append_segment,
    ),
    Hook(f"{CAPTURE}.__exit__", "method", "self, *args", HookType.AROUND, around_capture_exit),
    Hook(f"{GRAPH}.replay", "method", "self", HookType.AROUND, around_replay),
)

PATCH = Patch(
    id=PATCH_ID,
    summary="breakable CUDA graphs keep empty segments but never launch them (breaks in order)",
    flags=(DROP_FLAG,),
    hooks=HOOKS,
    is_enabled=lambda: bool(DROP_FLAG.get()),
    explain=explain_for_deployment,
    why=(
        "upstream's BreakableCUDAGraphCapture ends a segment at every eager break and keeps it "
        "even when it captured nothing (GLM-5: one per layer, between the DSA indexer break and "
        "_eager_bmm_attention); every replay launches it"
    ),
    how=(
        "just before a segment's capture ends, the graph under capture is asked for its node "
        "count; an empty segment stays alive (its hold on the graph memory pool stays) but is "
        "neither instantiated nor registered, and replays run every break in its place and "
        "launch only segments with nodes (core.graph_segments)"
    ),
    upstream_pr=(
        "SGLang PR #27053 (breakable CUDA graphs for GLM-5) carried an earlier implementation: "
        "_end_current_segment(drop_empty=...) -> bool decides emptiness at capture and the "
        "replay skips empty segments (54.6 ms -> 54.0 ms per 1k/1k prefill step)"
    ),
    retired_by=(
        "upstream's BreakableCUDAGraphCapture._end_current_segment decides emptiness itself and "
        "its replay skips empty segments while keeping break order; the registry check still "
        "passes then (the keyword is optional), so look for it on each upstream bump"
    ),
    docs_page="docs/empty-segments.md",
    reads=(
        (f"{BCG_MODULE}._current_stream_var", contextvars.ContextVar),
        (f"{BCG_MODULE}.get_current_stream", Callable),
        (f"{BCG_MODULE}.get_device_module", Callable),
    ),
)
