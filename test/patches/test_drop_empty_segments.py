"""drop_empty_segments on CPU: upstream's real capture/replay code with stand-ins for the CUDA
graph objects only (``torch.cuda.CUDAGraph``, the device module's streams, the node count of
the graph under capture). The same captures run with the patch off (upstream) and on."""

from __future__ import annotations

import logging
import types

import pytest
from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import (
    breakable_cuda_graph as bcg,
)
from sglang.srt.plugins.hook_registry import HookRegistry

from sglang_mixgraph import counters
from sglang_mixgraph import upstream_attrs as attrs
from sglang_mixgraph.core.graph_segments import BREAK, GRAPH
from sglang_mixgraph.kits import bcg_cpu
from sglang_mixgraph.kits.bcg_cpu import Registry
from sglang_mixgraph.kits.install import installed
from sglang_mixgraph.patches import drop_empty_segments as des
from sglang_mixgraph.registry import PatchCheckError, check_attribute, evaluate

FLAG = des.DROP_FLAG.name


@pytest.fixture
def world(monkeypatch):
    w = bcg_cpu.install(monkeypatch)
    monkeypatch.setattr(des, "capture_node_count", lambda capture: capture._current_graph.nodes)
    counters.reset()
    return w


# A body: per segment, what runs before the next break: "k" a kernel, "a" only an allocation
# (no node), "" nothing; breaks sit between the segments.
BODIES = {
    "kernels": ["k", "k", "k"],
    "first_empty": ["", "k", "k"],
    "last_empty": ["k", "k", ""],
    "consecutive_empty": ["k", "", "a", "k"],
    "alloc_only": ["k", "a", "k"],
    "all_empty": ["", ""],  # the --debug-cuda-graph shape: one break between two empty segments
    "glm5_layers": ["k", "", "k", "", "k", "", "k"],  # indexer break, nothing, attention break
}


class Captured(types.SimpleNamespace):
    """A capture: its BreakableCUDAGraph, the dedup stand-in, the id of its first segment."""

    def replay(self):
        self.world.log.clear()
        self.graph.replay()
        return [(k, i - self.first if k == GRAPH else i) for k, i in self.world.log]

    def segment(self, i):
        return self.world.graphs[self.first + i]


def capture(world, body, dedup: bool) -> Captured:
    """Capture ``body`` with upstream's BreakableCUDAGraphCapture; breaks log their call order."""

    @bcg.eager_on_graph
    def brk(i):
        world.log.append((BREAK, i))

    registry = Registry(world) if dedup else None
    graph = bcg.BreakableCUDAGraph(registry)
    first = len(world.graphs)
    with bcg.BreakableCUDAGraphCapture(graph):
        for i, part in enumerate(body):
            if part == "k":
                world.kernel()
            if i < len(body) - 1:
                brk(i)
    return Captured(world=world, graph=graph, registry=registry, first=first)


@pytest.mark.parametrize("dedup", [False, True], ids=["plain", "dedup"])
@pytest.mark.parametrize("name", list(BODIES))
def test_replay_is_upstream_minus_empty_launches(world, name, dedup, caplog):
    body = BODIES[name]
    empty = [i for i, part in enumerate(body) if part != "k"]
    upstream = capture(world, body, dedup).replay()
    assert upstream.count((GRAPH, 0)) == 1 and len(upstream) == 2 * len(body) - 1
    with installed((des.PATCH,), {FLAG: "1"}) as (status,):
        assert status.enabled
        with caplog.at_level(logging.INFO, logger="sglang_mixgraph"):
            ours = capture(world, body, dedup)
        got = ours.replay()
    assert got == [s for s in upstream if not (s[0] == GRAPH and s[1] in empty)]
    # upstream's shapes: one entry per segment, one break between two segments
    graph = ours.graph
    assert len(graph._segments) == len(body) and len(graph._break_fns) == len(body) - 1
    for i in empty:  # kept alive as captured; never launched
        assert graph._segments[i] is ours.segment(i)
    if dedup:
        assert [g.id - ours.first for g in ours.registry.registered] == [
            i for i in range(len(body)) if i not in empty
        ]
        assert not any(ours.segment(i).instantiated for i in empty)
    lines = [r.getMessage() for r in caplog.records if "empty segments dropped" in r.getMessage()]
    assert lines == [
        f"sglang-mixgraph: breakable CUDA graph captured: {len(body)} segments, "
        f"{len(body) - 1} eager breaks; {len(empty)} empty segments dropped from replay"
    ]
    assert counters.get(des.PATCH_ID, "captures_checked") == 1
    assert counters.get(des.PATCH_ID, "segments_dropped") == len(empty)
    assert counters.get(des.PATCH_ID, "replays_with_drops") == (1 if empty else 0)
    assert counters.get(des.PATCH_ID, "launches_skipped") == len(empty)


def test_segments_whose_nodes_cannot_be_counted_are_launched(world, monkeypatch):
    monkeypatch.setattr(des, "capture_node_count", lambda capture: None)
    body = BODIES["glm5_layers"]
    upstream = capture(world, body, dedup=False).replay()
    with installed((des.PATCH,), {FLAG: "1"}):
        ours = capture(world, body, dedup=False)
        assert ours.replay() == upstream
    assert attrs.GRAPH_DROP_PLAN not in vars(ours.graph)
    assert counters.get(des.PATCH_ID, "segments_dropped") == 0


def test_node_count_without_a_driver_falls_back_with_the_reason(monkeypatch):
    """The real query through cuda-python, on a machine without a CUDA driver."""
    pytest.importorskip("cuda.bindings.runtime")
    counters.reset()
    monkeypatch.setattr(bcg, "get_current_stream", lambda: types.SimpleNamespace(cuda_stream=0))
    assert des.capture_node_count(None) is None
    (reason,) = counters.snapshot()["fallbacks"][des.PATCH_ID]
    assert reason == "no capture"


def test_a_failed_capture_leaves_no_plan(world):
    with installed((des.PATCH,), {FLAG: "1"}):
        graph = bcg.BreakableCUDAGraph()
        with pytest.raises(RuntimeError, match="boom"):
            with bcg.BreakableCUDAGraphCapture(graph):
                raise RuntimeError("boom")
    assert attrs.GRAPH_DROP_PLAN not in vars(graph) and attrs.GRAPH_SEGMENT_HAS_NODES not in vars(
        graph
    )


def test_segments_changed_after_capture_replay_as_upstream(world):
    body = BODIES["first_empty"]
    with installed((des.PATCH,), {FLAG: "1"}):
        ours = capture(world, body, dedup=False)
        ours.graph._break_fns.append(lambda: world.log.append((BREAK, 99)))
        ours.graph._segments.append(world.Graph())
        got = ours.replay()
    assert got == [
        (GRAPH, 0),
        (BREAK, 0),
        (GRAPH, 1),
        (BREAK, 1),
        (GRAPH, 2),
        (BREAK, 99),
        (GRAPH, 3),
    ]
    assert counters.get_fallback(
        des.PATCH_ID, "segments or breaks changed after capture: replayed as upstream"
    )


def test_flag_off_installs_nothing():
    before = {h.target: _raw(h.target) for h in des.HOOKS}
    with installed((des.PATCH,), {FLAG: "0"}) as (status,):
        assert status.state == "off" and status.checks == []
        assert {h.target: _raw(h.target) for h in des.HOOKS} == before
        assert not any(h.target in HookRegistry._hooks for h in des.HOOKS)
    assert des.DROP_FLAG.default is False


def _raw(target):
    from sglang_mixgraph.registry import resolve_target

    return resolve_target(target)[2]


def test_an_attribute_the_hooks_read_is_checked(monkeypatch):
    path = f"{des.BCG_MODULE}._current_stream_var"
    assert check_attribute(path, des.contextvars.ContextVar).ok
    monkeypatch.setattr(bcg, "_current_stream_var", None)
    wrong = check_attribute(path, des.contextvars.ContextVar)
    assert not wrong.ok and wrong.why == "a NoneType, not a ContextVar"
    monkeypatch.delattr(bcg, "_current_stream_var")
    monkeypatch.setenv(FLAG, "1")
    status = evaluate(des.PATCH)
    assert status.state == "cannot apply"
    assert f"target {path}: expected ContextVar, found missing: " in status.error
    assert "(attribute missing)" in status.error
    with pytest.raises(PatchCheckError, match="SGLANG_OPT_BCG_DROP_EMPTY_SEGMENTS=0"):
        from sglang_mixgraph.registry import install

        install((des.PATCH,))


@pytest.mark.parametrize(
    "prefill, decode, says",
    [
        ("breakable", "full", "prefill graphs are breakable"),
        ("breakable", "breakable", "prefill and decode graphs are breakable"),
        ("disabled", "full", "no breakable CUDA graph in this deployment"),
    ],
)
def test_plan_note_names_the_breakable_phases(prefill, decode, says):
    plan = types.SimpleNamespace(
        prefill=types.SimpleNamespace(backend=prefill), decode=types.SimpleNamespace(backend=decode)
    )
    assert des.explain_for_deployment(plan).startswith(says)
