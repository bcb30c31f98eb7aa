"""The mixed split under breakable CUDA-graph replay (CPU, upstream's real replay prepare).

``DeepseekV4AttnBackend.prepare_forward_metadata_for_breakable_cuda_graph_replay`` runs
unchanged on the CPU kit's backend: it refreshes the captured metadata in place for the live
batch (still MIXED) and the attention then sees the static EXTEND batch. The patch's AFTER hook
must plan from the live batch, bind the plan to the static one, and clear it on every replay
that has none. The real graphs are proven on the GPU (test/gpu_upstream).
"""

from __future__ import annotations

import pytest
import torch

from sglang_mixgraph import counters
from sglang_mixgraph import upstream_attrs as attrs
from sglang_mixgraph.kits import dsv4_cpu as K

K.import_upstream()

from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402

from sglang_mixgraph.patches import mixed_split as ms  # noqa: E402

ATOL, RTOL = 4e-3, 8e-3
MIXED = K.Step(prefill=[(60, 11)], decode=[30, 290], seed=5)  # 13 rows
EXTEND = K.Step(prefill=[(58, 13)], decode=[], seed=5)  # request 0 again, 13 rows, no decode


@pytest.fixture
def replay():
    """(world, capture metadata, replay(step, mode, rows) -> static batch) on one backend."""
    with K.reference_world():
        world = K.World(MIXED)
        capture = world.build_metadata(world.forward_batch())
        capture.core_attn_metadata.swa_out_cache_loc = torch.zeros(
            MIXED.num_rows, dtype=torch.int32
        )

        def run(step, mode, rows=None):
            world.step = step
            live = world.forward_batch(mode=mode)
            static = K.replay_static_batch(live, step.num_rows, live_rows=rows)
            world.backend.prepare_forward_metadata_for_breakable_cuda_graph_replay(
                capture, live, static_forward_batch=static
            )
            return static

        yield world, capture, run


def _layers(world, static):
    return {layer: world.run_layer(static, layer) for layer in (0, 1, 2)}


def test_replayed_mixed_step_splits_and_equals_upstream(replay):
    world, capture, run = replay
    base = _layers(world, run(MIXED, ForwardMode.MIXED))  # the patch is not installed: upstream
    before = counters.snapshot()["events"].get("mixed_split", {}).get("replays_split", 0)
    with K.patch_installed(policy="always"):
        static = run(MIXED, ForwardMode.MIXED)
        plan = ms.get_plan(world.backend)
        assert (
            plan is not None
            and getattr(capture, attrs.METADATA_SPLIT_PLAN) is plan
            and plan.matches(static)
        )
        assert (plan.boundary.b0, plan.boundary.num_decode_reqs) == (11, 2)
        K.CALLS.clear()
        out = _layers(world, static)
    assert plan.decode_calls == {0: 1, 4: 1, 128: 1} and len(K.CALLS.decode) == 3
    assert counters.snapshot()["events"]["mixed_split"]["replays_split"] == before + 1
    for layer in out:
        torch.testing.assert_close(out[layer].float(), base[layer].float(), atol=ATOL, rtol=RTOL)
        assert torch.equal(out[layer][:11], base[layer][:11])


def test_no_plan_survives_into_a_replay_without_decode_rows(replay):
    world, capture, run = replay
    base = _layers(world, run(EXTEND, ForwardMode.EXTEND))
    with K.patch_installed(policy="always"):
        run(MIXED, ForwardMode.MIXED)
        assert getattr(capture, attrs.METADATA_SPLIT_PLAN) is not None
        static = run(EXTEND, ForwardMode.EXTEND)
        assert (
            getattr(capture, attrs.METADATA_SPLIT_PLAN) is None
            and ms.get_plan(world.backend) is None
        )
        K.CALLS.clear()
        out = _layers(world, static)
    assert not K.CALLS.decode
    for layer in out:
        assert torch.equal(out[layer], base[layer])


def test_idle_rank_replay_plans_nothing(replay):
    world, capture, run = replay
    with K.patch_installed(policy="always"):
        run(MIXED, ForwardMode.MIXED)
        run(MIXED, ForwardMode.MIXED, rows=0)  # an idle DP rank: no live rows
        assert getattr(capture, attrs.METADATA_SPLIT_PLAN) is None


def test_adaptive_asks_the_cost_model_in_the_steps_regime(replay, monkeypatch):
    """A replayed step hides the host behind the GPU queue, an eager one exposes it: the plan
    asks the cost model once per step, in the regime of its entry (an eager step decided as a
    replay would split where the host cost makes the split slower)."""
    from sglang_mixgraph.core import split_cost_model as scm

    world, capture, run = replay
    asked = []

    def decide_step(counts, layers, coeffs, margin=None, *, regime=scm.REPLAY):
        asked.append(regime)
        return False

    monkeypatch.setattr(scm, "decide_step", decide_step)
    with K.patch_installed(policy="adaptive"):
        run(MIXED, ForwardMode.MIXED)
        assert asked == [scm.REPLAY]
        asked.clear()
        world.step = MIXED
        world.backend.init_forward_metadata(world.forward_batch(mode=ForwardMode.MIXED))
        assert asked == [scm.EAGER]
