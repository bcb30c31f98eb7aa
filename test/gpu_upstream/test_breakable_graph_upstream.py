"""Upstream's DSV4 attention under upstream's breakable CUDA graph: captured at one bucket
through the backend's own capture/replay metadata entry points, with the model's eager
attention break, replayed for live batches of different shapes and compared with eager upstream.

With the split on, a replayed MIXED step splits inside the attention break and equals the
patch-off replay; no plan survives into the next replay."""

import pytest
import torch

from sglang_mixgraph import upstream_attrs as attrs
from sglang_mixgraph.kits import dsv4_cpu as K
from sglang_mixgraph.kits import dsv4_gpu as G
from sglang_mixgraph.patches import mixed_split as ms

BUCKET = 64
# One set of requests; each live batch below batches the first requests of it differently.
WORLD = K.Step(prefill=[(300, 40), (0, 64)], decode=[5, 130, 600, 257], seed=51)
S = WORLD.seq_lens  # [340, 64, 6, 131, 601, 258]
LIVE = {
    "capture": K.Step(prefill=[(S[0] - 20, 20), (S[1] - 30, 30)], decode=[S[2] - 1, S[3] - 1]),
    "mixed_a": K.Step(
        prefill=[(S[0] - 16, 16)], decode=[S[1] - 1, S[2] - 1, S[3] - 1, S[4] - 1, S[5] - 1]
    ),
    "mixed_b": K.Step(
        prefill=[(S[0] - 33, 33), (S[1] - 20, 20)], decode=[S[2] - 1, S[3] - 1, S[4] - 1]
    ),
    "extend": K.Step(prefill=[(S[0] - 50, 50), (S[1] - 9, 9)], decode=[]),
    "mixed_c": K.Step(prefill=[(S[0] - 1, 1)], decode=[S[1] - 1, S[2] - 1]),
}


def _live(world, name):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    view = world.view(K.Step(LIVE[name].prefill, LIVE[name].decode, seed=WORLD.seed))
    mode = ForwardMode.MIXED if view.step.decode and view.step.prefill else ForwardMode.EXTEND
    return view, view.forward_batch(mode=mode)


def _eager(view, name):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    mode = ForwardMode.MIXED if view.step.decode and view.step.prefill else ForwardMode.EXTEND
    fb = view.forward_batch(mode=mode, num_decode_attr=None)
    return view.run_step(fb, q=view.q(), sink=view.attn_sink())


def capture_bucket():
    """The world and its bucket, captured from the ``capture`` batch (test_read_done_poison
    replays the same graph)."""
    world = G.GpuWorld(WORLD)
    b = G.BreakableBucket(world, BUCKET)
    view, fb = _live(world, "capture")
    b.capture(view, fb, view.q())
    return world, b


@pytest.fixture(scope="module")
def bucket(sglang_cuda):
    return capture_bucket()


@pytest.mark.parametrize("name", ["mixed_a", "mixed_b", "extend", "mixed_c", "mixed_a"])
def test_replay_equals_eager(bucket, name):
    world, b = bucket
    assert len(b.graph._break_fns) == len(b.layers)
    view, fb = _live(world, name)
    got = b.replay(view, fb, view.q())
    want = _eager(view, name)
    rows = view.step.num_rows
    for layer in b.layers:
        err = G.rel_l2(got[layer][:rows], want[layer])
        assert err < 1e-3, f"{name} layer {layer}: replay vs eager rel L2 {err:.2e}"
        assert torch.count_nonzero(got[layer][rows:]) == 0, "rows past the live ones must be zero"


def test_split_acts_inside_replays_and_equals_upstream(bucket):
    """With the split on, a replayed MIXED step splits inside the attention break (plan bound to
    the replay's static batch, on the persistent captured metadata); a following replay without
    decode rows carries no plan; both equal the patch-off replay of the same batch."""
    world, b = bucket
    off = {}
    for name in ("mixed_b", "extend"):
        view, fb = _live(world, name)
        off[name] = b.replay(view, fb, view.q())
    with K.patch_installed(policy="always"), K.cache_builds() as builds:
        view, fb = _live(world, "mixed_b")
        on = b.replay(view, fb, view.q())
        plan = getattr(b.metadata, attrs.METADATA_SPLIT_PLAN, None)
        assert plan is not None and plan.boundary.b0 == view.step.b0
        assert plan.decode_calls == {r: 1 for r in K.LAYER_RATIOS}
        # The replay's one chunk cache, the plan's prefill-only one (built at prepare).
        assert builds == [len(view.step.prefill)]
        view_e, fb_e = _live(world, "extend")
        on_extend = b.replay(view_e, fb_e, view_e.q())
        assert getattr(b.metadata, attrs.METADATA_SPLIT_PLAN, None) is None
    rows, b0 = view.step.num_rows, view.step.b0
    for layer in b.layers:
        assert torch.equal(on[layer][:b0], off["mixed_b"][layer][:b0]), (
            "prefill rows must be upstream's bits"
        )
        err = G.rel_l2(on[layer][b0:rows], off["mixed_b"][layer][b0:rows])
        assert err < 5e-3, f"layer {layer}: decode rows rel L2 {err:.2e}"
        assert torch.count_nonzero(on[layer][rows:]) == 0
        assert torch.equal(on_extend[layer], off["extend"][layer])


class _ModelRunner:
    """What upstream's replay prepare and publisher read of a model runner."""

    def __init__(self, backend):
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.attn_backend = backend
        self.spec_algorithm = SpeculativeAlgorithm.NONE
        self.shared_read_done_event = None
        self.forward_pass_id = 0


def read_done_env(split: bool, check: bool = True) -> dict[str, str]:
    """The replay read-done patch on, the snapshot check on (unless ``check`` is False), the
    split on with policy ``always`` or off."""
    return {
        "SGLANG_OPT_DSV4_REPLAY_READ_DONE": "1",
        "SGLANG_DEBUG_WAR_SNAPSHOT": "1" if check else "0",
        "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN": "1" if split else "0",
        "SGLANG_MIXGRAPH_SPLIT_POLICY": "always",
    }


@pytest.mark.parametrize("split", [False, True], ids=["unsplit", "split"])
def test_replay_read_done_prebuilds_publishes_and_equals_upstream(bucket, split):
    """With the replay read-done patch and the snapshot check on, upstream's runner prepare of a
    MIXED and of an EXTEND replay answers PRE_REPLAY with the chunk cache already built (for the
    split: the plan's prefill-only one), upstream's publisher records a real CUDA event, nothing
    reads the shared tables during the replay (the check would raise inside the attention
    break), and the outputs equal the patch-off replay (bit for bit without the split)."""
    from sglang.srt.layers.attention.base_attn_backend import SharedReadEnds

    from sglang_mixgraph.kits.install import installed
    from sglang_mixgraph.patches import replay_read_done as rd
    from sglang_mixgraph.patches import war_snapshot_check as wc

    world, b = bucket
    names = ("mixed_b", "extend")
    off = {}
    for name in names:
        view, fb = _live(world, name)
        off[name] = b.replay(view, fb, view.q())
    env = read_done_env(split)
    runner = _ModelRunner(world.backend)
    on = {}
    wc.PUBLISHED.clear()
    try:
        with installed((ms.PATCH, rd.PATCH, wc.PATCH), env):
            for name in names:
                runner.forward_pass_id += 1
                runner.shared_read_done_event = None
                view, fb = _live(world, name)
                with K.cache_builds() as builds:
                    on[name] = b.replay(view, fb, view.q(), model_runner=runner)
                # One chunk cache per replay, before the publish: the split's prefill-only one
                # for a split MIXED step, upstream's over every request otherwise.
                split_step = split and name.startswith("mixed")
                assert builds == [len(view.step.prefill if split_step else view.step.seq_lens)]
                assert b.read_ends is SharedReadEnds.PRE_REPLAY
                assert isinstance(runner.shared_read_done_event, torch.cuda.Event)
                assert b.metadata.sparse_prefill_cache is not None
                plan = getattr(b.metadata, attrs.METADATA_SPLIT_PLAN, None)
                if split and name.startswith("mixed"):
                    assert (
                        plan is not None and b.metadata.sparse_prefill_cache is plan.prefill_cache
                    )
                else:
                    assert plan is None
    finally:
        wc.PUBLISHED.clear()
    for name in names:
        view, _ = _live(world, name)
        rows, b0 = view.step.num_rows, view.step.b0
        for layer in b.layers:
            if split and name.startswith("mixed"):
                assert torch.equal(on[name][layer][:b0], off[name][layer][:b0])
                err = G.rel_l2(on[name][layer][b0:rows], off[name][layer][b0:rows])
                assert err < 5e-3, f"{name} layer {layer}: decode rows rel L2 {err:.2e}"
            else:
                assert torch.equal(on[name][layer], off[name][layer]), (name, layer)
