"""hold_break_inputs on the CPU: upstream's real ``eager_on_graph`` capture (``kits.bcg_cpu``
stands in for the CUDA graph objects), meta tensors for device tensors, the pool's allocator
segments and upstream's ``weak_ref_tensors`` replaced so that a weak view is recognisable. What
a replay reads on a GPU is test/gpu_upstream/test_break_input_lifetime.py's job."""

from __future__ import annotations

import gc
import sys
import types

import pytest
import torch
from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import (
    breakable_cuda_graph as bcg,
)

from sglang_mixgraph import counters
from sglang_mixgraph.kits import bcg_cpu
from sglang_mixgraph.kits.install import installed
from sglang_mixgraph.patches import hold_break_inputs as hbi

FLAG = hbi.HOLD_FLAG.name
WEAK_MODULE = "sglang.srt.model_executor.runner_backend_utils.weak_ref_tensor"
POOL = (0, 7)
IN_POOL = 64  # bytes of a 4x4 float32 tensor: inside the fake pool segment below
OUTSIDE = 256  # an 8x8 float32 tensor: larger than that segment, so outside it


class Weak(types.SimpleNamespace):
    """What upstream's weak_ref_tensors returns here: recognisably not the tensor itself."""


@pytest.fixture
def world(monkeypatch):
    w = bcg_cpu.install(monkeypatch)
    # Upstream's module refuses to import without CUDA; its function is what the wrapper calls.
    fake = types.ModuleType(WEAK_MODULE)
    fake.weak_ref_tensors = lambda x: Weak(of=x)
    monkeypatch.setitem(sys.modules, WEAK_MODULE, fake)
    reads = []
    monkeypatch.setattr(
        hbi, "pool_segments", lambda pool: reads.append(pool) or [(0, 100)] if pool == POOL else []
    )
    hbi._ranges.set(None)
    hbi._outside.set(None)
    counters.reset()
    w.segment_reads = reads
    return w


def capture_break(pool, *args):
    """Capture one eager break taking ``args``; what its replay closure keeps."""

    @bcg.eager_on_graph
    def brk(*a):
        return None

    graph = bcg.BreakableCUDAGraph()
    with bcg.BreakableCUDAGraphCapture(graph, pool=pool):
        brk(*args)
    (replay_fn,) = graph._break_fns
    cells = dict(zip(replay_fn.__code__.co_freevars, replay_fn.__closure__, strict=True))
    return cells["captured_args"].cell_contents


def meta(rows):
    return torch.empty(rows, rows, device="meta")


def test_upstream_0_5_23_keeps_weak_views_and_doctor_says_so():
    assert hbi.upstream_keeps_weak_views() is True
    assert FLAG in hbi.exposure() and "37606" in hbi.exposure()


def test_capture_holds_inputs_outside_the_pool_and_leaves_pool_inputs_weak(world):
    pool_input, outside = meta(4), meta(8)
    upstream = bcg._weak_ref_if_tensor
    with installed([hbi.PATCH], {FLAG: "1"}):
        assert bcg._weak_ref_if_tensor is not upstream
        kept = capture_break(POOL, pool_input, outside, 3)
    assert isinstance(kept[0], Weak) and kept[0].of is pool_input
    assert kept[1] is outside
    assert kept[2] == 3
    assert counters.get(hbi.PATCH_ID, "inputs_held") == 1
    assert counters.get(hbi.PATCH_ID, "inputs_weak_in_pool") == 1


def test_inputs_inside_tuples_are_decided_one_by_one(world):
    pool_input, outside = meta(4), meta(8)
    with installed([hbi.PATCH], {FLAG: "1"}):
        (pair,) = capture_break(POOL, (pool_input, outside))
    assert isinstance(pair, tuple) and isinstance(pair[0], Weak) and pair[1] is outside


def test_flag_off_keeps_upstreams_weak_views(world):
    outside = meta(8)
    upstream = bcg._weak_ref_if_tensor
    with installed([hbi.PATCH], {FLAG: "0"}):
        assert bcg._weak_ref_if_tensor is upstream  # nothing hooked
        (kept,) = capture_break(POOL, outside)
    assert isinstance(kept, Weak)
    assert counters.snapshot()["events"] == {}


def test_outside_a_capture_upstreams_function_answers(world):
    calls = []
    x = meta(8)
    with installed([hbi.PATCH], {FLAG: "1"}):
        got = hbi.around_weak_ref_if_tensor(lambda t: calls.append(t) or "upstream", x)
    assert got == "upstream" and calls == [x]
    assert world.segment_reads == []


def test_a_capture_without_a_shared_pool_falls_back_and_says_once(world, caplog):
    outside = meta(8)
    with installed([hbi.PATCH], {FLAG: "1"}):
        kept = capture_break((0, 0), outside, outside)
    assert all(isinstance(k, Weak) for k in kept)
    assert counters.get_fallback(hbi.PATCH_ID, "no pool") == 2


def test_unreadable_pool_segments_fall_back_to_the_weak_view(world, monkeypatch):
    def broken(pool):
        raise RuntimeError("snapshot unavailable")

    monkeypatch.setattr(hbi, "pool_segments", broken)
    with installed([hbi.PATCH], {FLAG: "1"}):
        (kept,) = capture_break(POOL, meta(8))
    assert isinstance(kept, Weak)
    assert counters.get_fallback(hbi.PATCH_ID, "no snapshot") == 1


def test_an_input_without_a_readable_storage_keeps_the_weak_view(world, monkeypatch):
    """A tensor whose storage cannot be read (sparse, nested) gets upstream's view, said once."""
    odd = meta(8)
    monkeypatch.setattr(
        type(odd), "untyped_storage", lambda self: (_ for _ in ()).throw(RuntimeError("sparse"))
    )
    with installed([hbi.PATCH], {FLAG: "1"}):
        (kept,) = capture_break(POOL, odd)
    assert isinstance(kept, Weak)
    assert counters.get_fallback(hbi.PATCH_ID, "no storage") == 1


def test_pool_segments_are_read_again_before_answering_outside(world):
    # Cached ranges answer "inside" without a read; an address outside them is checked again.
    assert hbi.in_pool(POOL, 0, 64) and len(world.segment_reads) == 1
    assert hbi.in_pool(POOL, 10, 20) and len(world.segment_reads) == 1
    assert not hbi.in_pool(POOL, 0, 256) and len(world.segment_reads) == 2
    assert not hbi.in_pool((0, 8), 0, 64)  # another pool: its own segments (none here)


def test_an_input_found_outside_is_not_looked_up_again_while_its_owner_lives(world):
    """A static buffer reaches every layer's break in every bucket: one snapshot answers for it
    (and for views of it) as long as the tensor checked lives; then it is checked again."""
    outside = meta(8)
    with installed([hbi.PATCH], {FLAG: "1"}):
        for _ in range(3):  # three layers' breaks, each in a capture of its own
            (kept,) = capture_break(POOL, outside)
            assert kept is outside
        (view,) = capture_break(POOL, outside[:8])
        assert view._base is outside
        assert len(world.segment_reads) == 1
        del outside, kept, view
        gc.collect()
        again = meta(8)  # the same address and size, another owner: looked up again
        (kept,) = capture_break(POOL, again)
    assert kept is again and len(world.segment_reads) == 2
    assert counters.get(hbi.PATCH_ID, "inputs_held") == 5


def test_retired_where_eager_on_graph_holds_its_inputs(monkeypatch):
    def eager_on_graph(fn):  # the shape PR 37448 gives upstream's wrapper
        captured_args = tuple(fn.args)
        captured_kwargs = dict(fn.kwargs)
        return captured_args, captured_kwargs

    monkeypatch.setattr(hbi, "_bcg", lambda: types.SimpleNamespace(eager_on_graph=eager_on_graph))
    monkeypatch.setenv(FLAG, "1")
    assert hbi.upstream_keeps_weak_views() is False
    assert hbi.PATCH.is_enabled() is False
    assert "held by SGLang itself" in hbi.exposure()


def test_unreadable_upstream_source_leaves_the_flag_in_charge(monkeypatch):
    monkeypatch.setattr(hbi, "_bcg", lambda: types.SimpleNamespace(eager_on_graph=len))
    monkeypatch.setenv(FLAG, "1")
    assert hbi.upstream_keeps_weak_views() is None
    assert hbi.PATCH.is_enabled() is True
    monkeypatch.setenv(FLAG, "0")
    assert hbi.PATCH.is_enabled() is False
