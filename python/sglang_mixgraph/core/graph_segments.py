"""Which segments of a breakable CUDA graph a replay launches, and in what order.

Upstream's replay (``BreakableCUDAGraph.replay`` in sglang.srt.model_executor.
runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph) walks the captured segments in
order and runs eager break *i* right after segment *i*; a break with no segment before it never
runs. A segment that captured no graph node does nothing when launched, yet each launch costs
host and device time. :func:`replay_steps` writes a replay as explicit steps: every break
upstream runs, in the same place, and a launch only for the segments with nodes, so the call
sequence equals upstream's minus the empty launches for any pattern of empty segments (first,
last, consecutive, all). Pure Python; the ``drop_empty_segments`` patch runs the steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

GRAPH = "graph"
BREAK = "break"
Step = tuple[str, int]


def replay_steps(has_nodes: Sequence[bool], num_breaks: int) -> tuple[Step, ...]:
    """The replay of segments whose node facts are ``has_nodes`` with ``num_breaks`` breaks:
    ``(GRAPH, i)`` launches segment ``i``, ``(BREAK, i)`` runs break ``i``."""
    if num_breaks < 0:
        raise ValueError(f"num_breaks must be >= 0, got {num_breaks}")
    steps: list[Step] = []
    for i, launch in enumerate(has_nodes):
        if launch:
            steps.append((GRAPH, i))
        if i < num_breaks:
            steps.append((BREAK, i))
    return tuple(steps)


def num_dropped(has_nodes: Sequence[bool]) -> int:
    """How many segments a replay by :func:`replay_steps` does not launch."""
    return sum(1 for launch in has_nodes if not launch)


def run_steps(
    steps: Sequence[Step], segments: Sequence[Any], breaks: Sequence[Callable[[], Any]]
) -> None:
    """Run ``steps``: ``segments[i].replay()`` for a launch, ``breaks[i]()`` for a break."""
    for kind, i in steps:
        if kind == GRAPH:
            segments[i].replay()
        else:
            breaks[i]()
