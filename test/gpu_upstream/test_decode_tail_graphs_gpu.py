"""SGLANG_MIXGRAPH_SPLIT_TAIL_GRAPHS=1 on upstream's real DSV4 backend, FlashMLA and breakable
CUDA graphs: the decode tail replayed from its CUDA graphs gives upstream's unsplit rows (prefill
rows bit for bit, decode rows within the split's tolerance) for 1 decode row, a bucket edge (16,
and 17 one past it) and 256, in eager steps and inside breakable-graph replays; every split
layer replays a graph, and a second step reuses them."""

import pytest
import torch

from sglang_mixgraph import counters
from sglang_mixgraph import upstream_attrs as attrs
from sglang_mixgraph.kits import dsv4_cpu as K
from sglang_mixgraph.kits import dsv4_gpu as G
from sglang_mixgraph.patches import mixed_split as ms

TOL = 5e-3  # the split's decode rows against upstream (test_mixed_split_upstream.TOL, bf16)
ROWS = [1, 16, 17, 256]
PREFILL = [(300, 29)]


def _decode_contexts(d: int) -> list[int]:
    # ragged contexts across the SWA window (128) and page edges (256)
    return [(37 * i) % 900 + 1 for i in range(d)]


@pytest.fixture
def fresh_counters():
    counters.reset()
    yield
    counters.reset()


def _replays() -> int:
    return counters.snapshot()["events"].get(ms.PATCH_ID, {}).get("tail_graph_replays", 0)


def _compare(out, base, b0, live):
    for layer in out:
        assert torch.equal(out[layer][:b0], base[layer][:b0]), f"layer {layer}: prefill rows"
        err = G.rel_l2(out[layer][b0:live], base[layer][b0:live])
        assert err < TOL, f"layer {layer}: decode rows rel L2 {err:.2e}"
        assert torch.count_nonzero(out[layer][live:]) == 0, "rows past the live ones"


@pytest.mark.parametrize("d", ROWS)
def test_eager_steps_replay_the_tail_and_equal_upstream(sglang_cuda, fresh_counters, d):
    world = G.GpuWorld(K.Step(prefill=PREFILL, decode=_decode_contexts(d), seed=61))
    sink = world.attn_sink()  # a model's sink is a parameter: the graphs keep its address
    q = world.q()
    base = world.run_step(world.forward_batch(num_decode_attr=None), q=q, sink=sink)
    with K.patch_installed(policy="always", tail_graphs=True):
        outs = [world.run_step(world.forward_batch(), q=q, sink=sink) for _ in range(2)]
    torch.cuda.synchronize()
    graphs = getattr(world.backend, attrs.BACKEND_SPLIT_TAIL_GRAPHS)
    assert graphs.broken is None
    assert graphs.captures == len(K.LAYER_RATIOS)  # one per layer; the second step reuses them
    assert _replays() == 2 * len(K.LAYER_RATIOS)
    for out in outs:
        _compare(out, base, world.step.b0, world.step.num_rows)


# One world of 256 decode requests; each replayed batch takes the first d of them.
WORLD = K.Step(prefill=PREFILL, decode=_decode_contexts(256), seed=62)
BUCKET = 320  # tokens: the prefill chunk and up to 256 decode rows


def _live(world, d):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    s = WORLD.seq_lens
    step = K.Step(prefill=[(s[0] - 29, 29)], decode=[n - 1 for n in s[1 : 1 + d]], seed=WORLD.seed)
    view = world.view(step)
    return view, view.forward_batch(mode=ForwardMode.MIXED)


@pytest.fixture(scope="module")
def bucket(sglang_cuda):
    world = G.GpuWorld(WORLD)
    b = G.BreakableBucket(world, BUCKET)
    view, fb = _live(world, 8)
    b.capture(view, fb, view.q())
    return world, b


@pytest.mark.parametrize("d", ROWS)
def test_replays_run_the_tail_graphs_inside_the_break_and_equal_upstream(bucket, fresh_counters, d):
    world, b = bucket
    view, fb = _live(world, d)
    off = b.replay(view, fb, view.q())
    with K.patch_installed(policy="always", tail_graphs=True):
        view, fb = _live(world, d)
        on = b.replay(view, fb, view.q())
        plan = getattr(b.metadata, attrs.METADATA_SPLIT_PLAN, None)
        assert plan is not None and plan.boundary.num_decode_reqs == d
    assert _replays() == len(K.LAYER_RATIOS)
    assert getattr(world.backend, attrs.BACKEND_SPLIT_TAIL_GRAPHS).broken is None
    _compare(on, off, view.step.b0, view.step.num_rows)
