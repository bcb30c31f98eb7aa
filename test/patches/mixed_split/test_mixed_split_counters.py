"""mixed_split on upstream's DSV4 backend (CPU): what its counters say, and the eager relabel.

Upstream's ``EagerRunner.execute`` runs a MIXED batch as EXTEND and its ``load_batch`` hands the
forward a ``dataclasses.replace`` copy of the batch; the split must still act there, because
``ForwardBatch.init_new`` saw the batch MIXED with its decode requests as the tail. The runner
here is upstream's class with its real ``execute`` / ``_execute_extend`` / ``load_batch`` and
eager buffer registry on CPU (the kit's ``eager_runner``); only the model is ours (it runs the
kit's three attention layers).
"""

from __future__ import annotations

import pytest
import torch

from sglang_mixgraph import counters
from sglang_mixgraph.kits import dsv4_cpu as K

K.import_upstream()

# The snapshot check hooks the scheduler: import it before any test describes a GPU (its import
# chain loads sgl_kernel's CUDA build when the platform says CUDA).
import sglang.srt.managers.scheduler  # noqa: E402, F401
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402

from sglang_mixgraph.patches import mixed_split as ms  # noqa: E402

ATOL, RTOL = 4e-3, 8e-3
P = ms.PATCH_ID
MIXED = K.Step(prefill=[(300, 29), (0, 7)], decode=[255, 256, 129, 0], seed=11)


pytestmark = pytest.mark.usefixtures("fresh_counters")


def _events():
    return counters.snapshot()["events"].get(P, {})


def _fallbacks():
    return counters.snapshot()["fallbacks"].get(P, {})


# ---- counters of the split itself -------------------------------------------------------------


def test_each_split_step_counts_the_step_its_decode_rows_and_each_layer():
    d = len(MIXED.decode)
    with K.reference_world():
        world = K.World(MIXED)
        with K.patch_installed(policy="always"):
            world.run_step(world.forward_batch())
            assert _events() == {
                "steps_seen.mixed": 1,
                "steps_split": 1,
                "decode_rows_split": d,
                "layers_split.c0": 1,
                "layers_split.c4": 1,
                "layers_split.c128": 1,
            }
            world.run_step(world.forward_batch(), layers=(1,))
    assert _events() == {
        "steps_seen.mixed": 2,
        "steps_split": 2,
        "decode_rows_split": 2 * d,
        "layers_split.c0": 1,
        "layers_split.c4": 2,
        "layers_split.c128": 1,
    }
    assert _fallbacks() == {}


def test_adaptive_counts_steps_it_splits_and_every_layer_of_them(monkeypatch):
    from sglang_mixgraph.core import split_cost_model as scm

    monkeypatch.setattr(scm, "decide_step", lambda *a, **k: True)
    with K.reference_world():
        world = K.World(MIXED)
        with K.patch_installed(policy="adaptive"):
            world.run_step(world.forward_batch())
    ev = _events()
    assert ev["steps_split"] == 1
    assert {k: n for k, n in ev.items() if k.startswith("layers_")} == {
        "layers_split.c0": 1,
        "layers_split.c4": 1,
        "layers_split.c128": 1,
    }


def test_adaptive_counts_steps_it_keeps_unsplit(monkeypatch):
    from sglang_mixgraph.core import split_cost_model as scm

    monkeypatch.setattr(scm, "decide_step", lambda *a, **k: False)
    with K.reference_world():
        world = K.World(MIXED)
        with K.patch_installed(policy="adaptive"):
            K.CALLS.clear()
            world.run_step(world.forward_batch())
            assert not K.CALLS.decode
    assert _events() == {"steps_seen.mixed": 1, "steps_unsplit_adaptive": 1}


def test_every_fallback_is_counted_under_its_reason():
    with K.reference_world():
        world = K.World(MIXED)
        world.backend.hisparse_coordinator = object()
        with K.patch_installed(policy="always"):
            for _ in range(3):
                world.backend.init_forward_metadata(world.forward_batch())
    assert _fallbacks() == {"hisparse": 3}
    assert _events() == {"steps_seen.mixed": 3}


# ---- the eager runner's MIXED -> EXTEND relabel ----------------------------------------------


@pytest.mark.parametrize("policy", ["always", "adaptive"])
def test_eager_runner_mixed_step_run_as_extend_is_split(policy, monkeypatch):
    from sglang_mixgraph.core import split_cost_model as scm

    if policy == "adaptive":
        monkeypatch.setattr(scm, "decide_step", lambda *a, **k: True)
    step, d = MIXED, len(MIXED.decode)
    with K.reference_world():
        world = K.World(step)
        runner, model = K.eager_runner(world)
        base = K.run_eager(runner, world, world.forward_batch())
        with K.patch_installed(policy=policy):
            K.CALLS.clear()
            fb = world.forward_batch()  # MIXED, decode tail recorded as by ForwardBatch.init_new
            out = K.run_eager(runner, world, fb)
            # Upstream relabelled the batch and ran a copy of it.
            assert fb.forward_mode == ForwardMode.EXTEND
            assert (
                model.batches[-1] is not fb and model.batches[-1].forward_mode == ForwardMode.EXTEND
            )
            plan = ms.get_plan(world.backend)
            assert plan is not None and plan.matches(model.batches[-1])
            assert (plan.boundary.b0, plan.boundary.num_decode_reqs) == (step.b0, d)
    for layer in out:
        torch.testing.assert_close(out[layer].float(), base[layer].float(), atol=ATOL, rtol=RTOL)
    split_layers = 3
    assert [c["q"].shape[0] for c in K.CALLS.decode] == [d] * split_layers
    ev = _events()
    assert ev["steps_seen.mixed_run_as_extend"] == 1 and ev["steps_split"] == 1
    assert sum(n for k, n in ev.items() if k.startswith("layers_split.")) == split_layers


@pytest.mark.parametrize("recorded", ["decode_not_the_tail", "built_as_extend"])
def test_eager_extend_not_built_mixed_with_a_decode_tail_is_not_split(recorded):
    """Only a batch ``init_new`` saw MIXED with its decode requests as the tail is split after
    the relabel; an EXTEND label alone (or a stray count) is never enough."""
    step = MIXED
    with K.reference_world():
        world = K.World(step)
        runner, _ = K.eager_runner(world)
        with K.patch_installed(policy="always"):
            K.CALLS.clear()
            if recorded == "decode_not_the_tail":
                fb = world.forward_batch(num_decode_attr=None)  # init_new recorded nothing
            else:
                fb = world.forward_batch(mode=ForwardMode.EXTEND, num_decode_attr=len(step.decode))
            K.run_eager(runner, world, fb)
            assert ms.get_plan(world.backend) is None
    assert not K.CALLS.decode and _events().get("steps_split", 0) == 0


@pytest.mark.parametrize("heads", [K.HEADS, 32], ids=["split", "heads_fall_back"])
def test_eager_mixed_step_publishes_read_done_and_reads_no_table_after_it(heads):
    """Upstream's eager runner relabels the MIXED step to EXTEND before its WAR snapshot, so it
    publishes read-done itself. With the split on, the plan builds the step's one chunk cache
    (prefill-only) before that, the snapshot gets that one instead of a second build, and
    nothing reads the shared tables after the publish (the snapshot check is on). A model of 32
    query heads (not a decode-kernel head count) is seen at plan time: no plan, upstream's
    snapshot builds its own one cache before the publish, and the output is upstream's."""
    from sglang_mixgraph.kits.install import installed
    from sglang_mixgraph.patches import war_snapshot_check as wc

    env = {
        "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN": "1",
        "SGLANG_MIXGRAPH_SPLIT_POLICY": "always",
        "SGLANG_DEBUG_WAR_SNAPSHOT": "1",
    }
    with K.reference_world():
        world = K.World(MIXED)
        world.backend.model_runner.model_config.hf_text_config.num_attention_heads = heads
        runner, _ = K.eager_runner(world, heads)
        base = K.run_eager(runner, world, world.forward_batch())
        runner.model_runner.shared_read_done_event = None
        runner.model_runner.forward_pass_id = 1
        builds = []
        with installed((ms.PATCH, wc.PATCH), env):
            hooked = type(world.backend)._build_sparse_prefill_chunk_cache

            def counting(self, *a, **kw):
                builds.append(kw.get("num_qo_tokens"))
                return hooked(self, *a, **kw)

            world.backend._build_sparse_prefill_chunk_cache = counting.__get__(world.backend)
            # Upstream's builder starts every real build by resetting the workspace head.
            buf = world.backend.sparse_prefill_kv_buffer
            real_builds = []
            forget = buf.forget_head
            buf.forget_head = lambda: real_builds.append(1) or forget()
            fb = world.forward_batch()

            try:
                out = K.run_eager(runner, world, fb)
                assert runner.model_runner.shared_read_done_event is not None
                assert wc.PUBLISHED.active() == "forward #1 (DeepseekV4AttnBackend)"
            finally:
                wc.PUBLISHED.clear()
    # One real build, before the publish: a build after it would have raised
    # WarSnapshotViolation.
    assert len(real_builds) == 1
    metadata = world.backend.forward_metadata
    if heads == K.HEADS:
        # Asked twice (the plan, then upstream's snapshot), built once.
        assert builds == [MIXED.num_rows] * 2
        plan = ms.get_plan(world.backend)
        assert plan is not None and metadata.sparse_prefill_cache is plan.prefill_cache
        assert metadata.sparse_prefill_cache.num_reqs == len(MIXED.prefill)
        assert _events().get("steps_split") == 1
    else:
        assert builds == [MIXED.num_rows]  # upstream's snapshot only
        assert ms.get_plan(world.backend) is None and _fallbacks() == {"heads": 1}
        assert metadata.sparse_prefill_cache.num_reqs == len(MIXED.seq_lens)
        for layer in out:
            assert torch.equal(out[layer], base[layer]), layer
