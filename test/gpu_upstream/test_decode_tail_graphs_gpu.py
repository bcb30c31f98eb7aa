"""SGLANG_MIXGRAPH_SPLIT_TAIL_GRAPHS=1 on upstream's real DSV4 backend, FlashMLA and breakable
CUDA graphs: the decode tail from its CUDA graphs gives upstream's unsplit rows (prefill rows bit
for bit, decode rows within the split's tolerance) for 1 decode row, a bucket edge (16, and 17
one past it) and 256, in eager steps and inside breakable-graph replays. The world's three
layers (one a ratio) run twice a step: the first layer of each ratio makes the step's split
schedule eagerly on the graphs' buffers, the second replays its graph on that schedule, and a
second step (other key counts would need a new schedule) reuses the graphs."""

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


LAYERS_TWICE = (*range(len(K.LAYER_RATIOS)), *range(len(K.LAYER_RATIOS)))


def _events() -> dict:
    return counters.snapshot()["events"].get(ms.PATCH_ID, {})


def _replays() -> int:
    return _events().get("tail_graph_replays", 0)


def _schedules() -> int:
    return _events().get("tail_graph_schedules", 0)


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
    passes = []  # per step: the layers' first pass (schedules), then their second (replays)
    with K.patch_installed(policy="always", tail_graphs=True):
        for _ in range(2):
            fb = world.forward_batch()
            world.upstream_metadata(fb)
            for _ in range(2):
                passes.append({k: world.run_layer(fb, k, q=q, sink=sink) for k in base})
    torch.cuda.synchronize()
    graphs = getattr(world.backend, attrs.BACKEND_SPLIT_TAIL_GRAPHS)
    ratios = len(K.LAYER_RATIOS)
    assert graphs.broken is None
    assert graphs.captures == ratios  # each layer's second pass; the second step reuses them
    assert _schedules() == 2 * ratios and _replays() == 2 * ratios
    for out in passes:
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
    b = G.BreakableBucket(world, BUCKET, layers=LAYERS_TWICE)
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
    # the break's first pass makes the schedule, its second replays (the outputs kept are its)
    assert _schedules() == _replays() == len(K.LAYER_RATIOS)
    assert getattr(world.backend, attrs.BACKEND_SPLIT_TAIL_GRAPHS).broken is None
    _compare(on, off, view.step.b0, view.step.num_rows)
