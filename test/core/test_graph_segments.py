"""core.graph_segments: the replay steps equal upstream's replay minus the empty launches.

The reference is upstream's own ``BreakableCUDAGraph.replay``, run on CPU with recording stand-ins
for the segment graphs and the device module (the only CUDA objects it touches).
"""

from __future__ import annotations

import types

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import (
    breakable_cuda_graph as bcg,
)

from sglang_mixgraph.core.graph_segments import (
    BREAK,
    GRAPH,
    num_dropped,
    replay_steps,
    run_steps,
)


class _Segment:
    def __init__(self, i, log):
        self.i, self.log = i, log

    def replay(self):
        self.log.append((GRAPH, self.i))


def _breaks(n, log):
    return [lambda i=i: log.append((BREAK, i)) for i in range(n)]


def upstream_calls(num_segments: int, num_breaks: int, monkeypatch) -> list:
    """What upstream's replay calls, in order, for this many segments and breaks."""
    log: list = []
    monkeypatch.setattr(
        bcg, "get_device_module", lambda: types.SimpleNamespace(current_stream=lambda: "stream")
    )
    graph = bcg.BreakableCUDAGraph()
    graph._segments = [_Segment(i, log) for i in range(num_segments)]
    graph._break_fns = _breaks(num_breaks, log)
    graph.replay()
    return log


@given(
    has_nodes=st.lists(st.booleans(), max_size=12),
    extra_breaks=st.integers(min_value=-2, max_value=2),
)
def test_steps_are_upstream_replay_minus_empty_launches(has_nodes, extra_breaks):
    # A capture gives one segment more than breaks; other counts follow upstream too.
    num_breaks = max(0, len(has_nodes) - 1 + extra_breaks)
    with pytest.MonkeyPatch.context() as mp:
        upstream = upstream_calls(len(has_nodes), num_breaks, mp)
    expected = [s for s in upstream if not (s[0] == GRAPH and not has_nodes[s[1]])]
    steps = replay_steps(has_nodes, num_breaks)
    assert list(steps) == expected
    log: list = []
    run_steps(steps, [_Segment(i, log) for i in range(len(has_nodes))], _breaks(num_breaks, log))
    assert log == expected
    assert sum(1 for s in steps if s[0] == GRAPH) == len(has_nodes) - num_dropped(has_nodes)


@pytest.mark.parametrize(
    "has_nodes, expected",
    [
        # the debug capture: one break between two empty segments still runs
        ([False, False], [(BREAK, 0)]),
        ([False, True, True], [(BREAK, 0), (GRAPH, 1), (BREAK, 1), (GRAPH, 2)]),
        ([True, True, False], [(GRAPH, 0), (BREAK, 0), (GRAPH, 1), (BREAK, 1)]),
        ([True, False, False, True], [(GRAPH, 0), (BREAK, 0), (BREAK, 1), (BREAK, 2), (GRAPH, 3)]),
        ([False], []),
        ([True], [(GRAPH, 0)]),
    ],
    ids=["all-empty", "first", "last", "consecutive", "single-empty", "single"],
)
def test_breaks_keep_their_place(has_nodes, expected):
    assert list(replay_steps(has_nodes, len(has_nodes) - 1)) == expected
    assert num_dropped(has_nodes) == has_nodes.count(False)


def test_negative_break_count_is_refused():
    with pytest.raises(ValueError, match="num_breaks must be >= 0, got -1"):
        replay_steps([True], -1)
