"""core.decode_tail_graphs on the CPU: the static buffers, the row buckets and the per-step and
per-layer refills, against the plain call (`run_tail`), with the torch reference kernel and a
capture that replays by calling the captured function. Whether a CUDA graph replays the same
call is a GPU question: test/gpu_upstream/test_decode_tail_graphs_gpu.py."""

from __future__ import annotations

import pytest
import torch

from sglang_mixgraph.core.decode_tail import run_tail, tail_inputs
from sglang_mixgraph.core.decode_tail_graphs import TailGraphs, row_bucket, tail_graph_bytes
from sglang_mixgraph.reference import v4_kv_layout as kvl
from sglang_mixgraph.reference.sparse_mla import (
    ReferenceSchedMeta,
    flash_mla_with_kvcache_reference,
)

H = 4


class Replayed:
    """A captured function: `replay` calls it (what a CUDA graph's replay does on the GPU)."""

    def __init__(self, fn):
        self.fn = fn
        self.replays = 0

    def replay(self):
        self.replays += 1
        self.fn()


class Recorder:
    def __init__(self):
        self.graphs = []

    def __call__(self, fn):
        self.graphs.append(Replayed(fn))
        return self.graphs[-1]


def _caches(seed=0):
    gen = torch.Generator().manual_seed(seed)
    swa = kvl.allocate_cache(4, 64)
    kvl.encode_tokens(swa, 64, torch.arange(256), torch.randn(256, 512, generator=gen))
    extra = kvl.allocate_cache(40, 2)
    kvl.encode_tokens(extra, 2, torch.arange(80), torch.randn(80, 512, generator=gen))
    return kvl.kernel_view(swa, 64), kvl.kernel_view(extra, 2), torch.randn(H, generator=gen)


def _step(ratio, d, seed):
    """One step's tail of `d` decode rows after 3 prefill rows: its inputs and query rows."""
    gen = torch.Generator().manual_seed(seed)
    rows = 3 + d
    si = torch.randint(0, 256, (rows, 128), generator=gen).to(torch.int32)
    sl = torch.randint(1, 129, (rows,), generator=gen).to(torch.int32)
    extra = {}
    if ratio:
        ei = torch.randint(-1, 80, (rows, 64), generator=gen).to(torch.int32)
        el = torch.randint(1, 65, (rows,), generator=gen).to(torch.int32)
        extra = dict(extra_indices=ei, extra_lengths=el)
    inputs = tail_inputs(
        ratio, 3, d, si, sl, **extra, sched_meta=ReferenceSchedMeta(), softmax_scale=0.04
    )
    q = torch.randn(rows, 1, H, 512, generator=gen).to(torch.bfloat16).narrow(0, 3, d)
    return inputs, q


def _plain(inputs, q, swa, extra, sink):
    return run_tail(inputs, q, swa, sink, extra, flash_mla_with_kvcache_reference)


def _graphs(capture=None, **kw):
    return TailGraphs(
        flash_mla_with_kvcache_reference, ReferenceSchedMeta, capture=capture or Recorder(), **kw
    )


def test_row_buckets():
    assert [row_bucket(r) for r in (1, 2, 3, 5, 129, 256)] == [1, 2, 4, 8, 256, 256]
    assert row_bucket(257) is None
    assert row_bucket(3, (2, 8)) == 8


@pytest.mark.parametrize("ratio", [0, 4, 128])
def test_a_replay_equals_the_plain_call_as_the_rows_grow_and_shrink(ratio):
    """Three layers a step: the first makes the step's schedule eagerly, the others replay on
    it. The reference refuses a schedule made for other key counts, so a graph left reading
    an earlier step's schedule fails here."""
    swa, extra_cache, sink = _caches()
    extra = extra_cache if ratio else None
    capture = Recorder()
    graphs = _graphs(capture, buckets=(2, 8, 16))
    for step, d in enumerate((5, 2, 7, 1, 16)):
        inputs, q = _step(ratio, d, seed=step)
        for layer in (10, 11, 12):
            assert graphs.unreplayable(d) is None
            out, replayed = graphs.run(layer, inputs, q, swa, sink, extra)
            assert replayed == (layer != 10) and out.shape == (d, 1, H, 512)
            torch.testing.assert_close(out, _plain(inputs, q, swa, extra, sink), rtol=0, atol=0)
        # the rows past the step's tail are invalid for the kernel: index -1, length 0
        index = graphs._indices[ratio]
        assert (index.swa[d:] == -1).all() and (index.swa_len[d:] == 0).all()
        if ratio:
            assert (index.extra[d:] == -1).all() and (index.extra_len[d:] == 0).all()
    # one graph per replaying layer and bucket: 5 and 7 rows share the 8-row ones
    assert graphs.captures == len(capture.graphs) == 2 * 3
    assert sum(g.replays for g in capture.graphs) == 2 * 5


def test_one_graph_per_layer_and_bucket_each_replayed_once_per_call():
    swa, extra, sink = _caches()
    capture = Recorder()
    graphs = _graphs(capture)
    for seed in (1, 2):
        inputs, q = _step(4, 3, seed=seed)
        for layer in (0, 1, 2):
            graphs.run(layer, inputs, q, swa, sink, extra)
    # each step's layer 0 made its schedule eagerly; layers 1 and 2 captured, then replayed
    assert graphs.captures == 2
    assert [g.replays for g in capture.graphs] == [2, 2]
    # the model hands its sink as a new slice view per call: the same memory, the same graph
    graphs.run(1, inputs, q, swa, sink[: sink.shape[0]], extra)
    assert graphs.captures == 2
    # another cache (a layer's buffer moved) is another graph
    graphs.run(1, inputs, q, swa.clone(), sink, extra)
    assert graphs.captures == 3


def test_c4_indices_are_refilled_every_layer_the_others_once_per_step():
    """The indexer rewrites the c4 top-k in place for every layer; SWA and c128 indices are
    the step's and are copied when a new step's inputs arrive."""
    swa, extra, sink = _caches()
    graphs = _graphs()
    c4, q4 = _step(4, 3, seed=2)
    c128, q128 = _step(128, 3, seed=3)
    graphs.run(0, c4, q4, swa, sink, extra)
    graphs.run(1, c128, q128, swa, sink, extra)
    c4.kernel_kwargs["extra_indices_in_kvcache"].fill_(-1)  # the next layer's top-k
    c128.kernel_kwargs["extra_indices_in_kvcache"].fill_(-1)  # not done by anyone: the probe
    out4, replayed = graphs.run(2, c4, q4, swa, sink, extra)
    assert replayed
    torch.testing.assert_close(out4, _plain(c4, q4, swa, extra, sink), rtol=0, atol=0)
    assert (graphs._indices[4].extra[:3] == -1).all()
    graphs.run(3, c128, q128, swa, sink, extra)
    assert (graphs._indices[128].extra[:3] != -1).any()  # same step: not copied again
    new_step, q_new = _step(128, 3, seed=3)  # a new step's inputs, equal values
    new_step.kernel_kwargs["extra_indices_in_kvcache"].fill_(-1)
    graphs.run(3, new_step, q_new, swa, sink, extra)
    assert (graphs._indices[128].extra[:3] == -1).all()


def test_the_schedule_is_made_once_a_step_for_each_ratio_and_bucket():
    """FlashMLA's split schedule follows the rows' key counts, which change every step but
    not from layer to layer: one kernel call a step and (ratio, bucket) gets a fresh
    scheduling object, every graph reads the one it was captured on, and the plan's per-step
    object is never captured (its schedule is bound to the step and its row count)."""
    swa, extra, sink = _caches()
    fresh, calls = [], []

    def kernel(**kw):
        meta = kw["tile_scheduler_metadata"]
        calls.append(meta)
        if not meta.have_initialized:
            fresh.append(meta)
        return flash_mla_with_kvcache_reference(**kw)

    graphs = TailGraphs(kernel, ReferenceSchedMeta, capture=Recorder())
    steps = [(_step(4, 3, seed=10 + s), _step(128, 6, seed=20 + s)) for s in range(3)]
    for (c4, q4), (c128, q128) in steps:
        for layer in range(4):
            graphs.run(2 * layer, c4, q4, swa, sink, extra)
            graphs.run(2 * layer + 1, c128, q128, swa, sink, extra)
    assert len(fresh) == 2 * 3  # per step: the c4 tail's 4-row bucket, the c128 tail's 8-row one
    shared = {id(m) for m in calls} - {id(m) for m in fresh[2:]}
    assert shared == {id(fresh[0]), id(fresh[1])}  # the first step's objects hold the schedule
    assert all(inputs.sched_meta not in calls for pair in steps for inputs, _ in pair)


def test_a_schedule_of_another_shape_is_captured_again():
    """Where a fresh schedule cannot be copied into the captured one (its tensors differ in
    shape), the fresh object takes its place and the graphs on the old one are captured again."""
    swa, extra, sink = _caches()
    sizes = iter([3, 5])

    class Meta(ReferenceSchedMeta):
        def __init__(self):
            super().__init__()
            self.pad = next(sizes, 5)

    def kernel(**kw):
        meta = kw["tile_scheduler_metadata"]
        new = not meta.have_initialized
        out = flash_mla_with_kvcache_reference(**kw)
        if new:  # a scheduler whose table size changed between steps
            meta.num_splits = torch.zeros(meta.pad, dtype=torch.int32)
        return out

    graphs = TailGraphs(kernel, Meta, capture=Recorder())
    for seed in (30, 31):
        inputs, q = _step(0, 2, seed=seed)
        for layer in (0, 1):
            out, _ = graphs.run(layer, inputs, q, swa, sink, None)
            torch.testing.assert_close(out, _plain(inputs, q, swa, None, sink), rtol=0, atol=0)
    assert graphs.captures == 2


def test_what_cannot_replay_says_why():
    swa, extra, sink = _caches()
    graphs = _graphs(buckets=(1, 2, 4))
    assert graphs.unreplayable(5) == "too_many_rows"

    def failing(fn):
        raise RuntimeError("operation not permitted when stream is capturing")

    broken = _graphs(capture=failing)
    inputs, q = _step(0, 2, seed=5)
    assert broken.unreplayable(2) is None
    torch.testing.assert_close(  # the step's first call runs eagerly: no capture yet
        broken.run(0, inputs, q, swa, sink, None)[0], _plain(inputs, q, swa, None, sink)
    )
    assert broken.run(1, inputs, q, swa, sink, None) is None
    assert "operation not permitted" in broken.broken
    assert broken.unreplayable(2) == "capture_failed"


def test_the_memory_bound_counts_every_static_buffer():
    """`plan` counts `tail_graph_bytes` in the capture estimate: the buffers the graphs hold
    are exactly its static part (the pool's kernel output is checked on the GPU)."""
    swa, extra, sink = _caches()
    graphs = _graphs()
    for ratio in (0, 4, 128):
        inputs, q = _step(ratio, 3, seed=6)
        graphs.run(0, inputs, q, swa, sink, extra if ratio else None)
    held = sum(t.nbytes for b in graphs._rows.values() for t in (b.q, b.out))
    for index in graphs._indices.values():
        held += sum(
            t.nbytes
            for t in (index.swa, index.swa_len, index.extra, index.extra_len)
            if t is not None
        )
    rows = graphs.max_rows
    pool = rows * H * 512 * 2 + rows * H * 4
    assert held == tail_graph_bytes(H, {0: (128, 0), 4: (128, 64), 128: (128, 64)}) - pool
