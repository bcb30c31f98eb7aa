"""The mixed split on upstream's DSV4 backend (CPU): split == unsplit, routing, workspace, fallbacks.

See sglang_mixgraph.kits.dsv4_cpu for what runs upstream code and what is ours.
"""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_mixgraph import fallback
from sglang_mixgraph import upstream_attrs as attrs
from sglang_mixgraph.kits import dsv4_cpu as K

K.import_upstream()

from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402

from sglang_mixgraph.patches import mixed_split as ms  # noqa: E402
from sglang_mixgraph.registry import PatchCheckError, check_hook, install  # noqa: E402

# Outputs are bf16 from fp32 math over identical key values; only summation order differs,
# which can move a value by one bf16 ulp.
ATOL, RTOL = 4e-3, 8e-3


@pytest.fixture(autouse=True)
def _fresh_fallback_log():
    fallback._said.clear()
    yield
    fallback._said.clear()


def _prefill_only_slots(world, layer):
    p = len(world.step.prefill)
    return world.request_slots(range(p), layer)


def _check_split_step(world, base, out, plan, step):
    b0, d = step.b0, len(step.decode)
    for layer in out:
        torch.testing.assert_close(out[layer].float(), base[layer].float(), atol=ATOL, rtol=RTOL)
        if step.padding:
            assert out[layer][b0 + d :].abs().max() == 0
    if d == 0:
        assert plan is None and not K.CALLS.decode
        return
    assert plan is not None
    assert (plan.boundary.b0, plan.boundary.num_decode_reqs, plan.boundary.num_rows) == (
        b0,
        d,
        step.num_rows,
    )
    # Every layer splits (a plan splits the whole step); its decode-tail inputs were made once
    # per ratio, by the plan.
    assert set(plan.tails) == set(K.LAYER_RATIOS) and plan.tail_builds == dict.fromkeys(
        K.LAYER_RATIOS, 1
    )
    # Decode rows reach the decode kernel with exactly their own metadata rows, once per layer.
    core = world.backend.forward_metadata.core_attn_metadata
    assert len(K.CALLS.decode) == len(out)
    q = world.q()
    for call, layer in zip(K.CALLS.decode, sorted(out), strict=False):
        ratio = K.LAYER_RATIOS[layer]
        assert call["q"].shape[0] == d
        assert torch.equal(call["q"].squeeze(1), q[b0 : b0 + d])
        assert torch.equal(call["indices"].squeeze(1), core.swa_page_indices[b0 : b0 + d])
        assert torch.equal(call["topk_length"], core.swa_topk_lengths[b0 : b0 + d])
        if ratio:
            assert torch.equal(
                call["extra_indices_in_kvcache"].squeeze(1),
                core.sparse_page_indices(ratio)[b0 : b0 + d],
            )
            assert torch.equal(
                call["extra_topk_length"], core.sparse_topk_lengths(ratio)[b0 : b0 + d]
            )
        else:
            assert call["extra_indices_in_kvcache"] is None
        # One scheduling-metadata object per ratio for this step, the plan's.
        assert call["tile_scheduler_metadata"] is plan.tails[ratio].sched_meta
    # The sparse-prefill kernel runs over every row with the prefill-only workspace (the decode
    # rows are copied in afterwards); without prefill rows it never runs.
    assert K.CALLS.sparse_rows == ([step.num_rows] * len(out) if b0 else [])
    # The workspace holds only prefill requests' tokens.
    cache = world.backend.forward_metadata.sparse_prefill_cache
    pre = step.prefill
    if b0 == 0:
        assert cache is None and not K.CALLS.dequant_slots
        return
    assert cache.num_reqs == len(pre) and cache.num_qo_tokens == step.num_rows
    assert cache.swa_token_ids.numel() == sum(min(p + e, e + K.SWA - 1) for p, e in pre)
    for layer in out:
        swa_ptr = world.pool.get_swa_key_buffer_radix(layer).data_ptr()
        swa_ok, comp_ok = _prefill_only_slots(world, layer)
        extra_ptr = (
            world.pool.get_extra_key_buffer(layer).data_ptr() if K.LAYER_RATIOS[layer] else None
        )
        for ptr, slots in K.CALLS.dequant_slots:
            s = set(slots.tolist())
            if ptr == swa_ptr:
                assert s <= swa_ok
            elif ptr == extra_ptr:
                assert s <= comp_ok | {0}  # upstream clamps unused c128/c4 gather slots to 0


step_strategy = st.builds(
    K.Step,
    prefill=st.lists(st.tuples(st.integers(0, 420), st.integers(1, 40)), min_size=0, max_size=4),
    decode=st.lists(st.integers(0, 600), min_size=0, max_size=8),
    padding=st.integers(0, 4),
    seed=st.integers(0, 2**16),
).filter(lambda s: s.prefill or s.decode)


# The same property with upstream's backend built for a described B200 (SM100): slow tier.
@pytest.mark.parametrize("gpu", ["H200", pytest.param("B200", marks=pytest.mark.slow)])
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(step=step_strategy)
def test_split_equals_unsplit(gpu, step):
    with K.reference_world(gpu):
        world = K.World(step)
        base = world.run_step(world.forward_batch())
        with K.patch_installed(), K.cache_builds() as builds:
            K.CALLS.clear()
            out = world.run_step(world.forward_batch())
            plan = ms.get_plan(world.backend)
            _check_split_step(world, base, out, plan, step)
        # One chunk cache for the step: the prefill-only one of a split step (none without
        # prefill rows), upstream's own over every request otherwise.
        if plan is not None:
            assert builds == ([len(step.prefill)] if step.b0 else [])
        else:
            assert builds == [len(step.seq_lens)]


FIXED_STEPS = [
    # crosses the SWA window and a page boundary on both sides of the boundary
    K.Step(prefill=[(300, 29), (0, 7)], decode=[255, 256, 129, 0], padding=2, seed=11),
    K.Step(prefill=[], decode=[511, 3, 130], padding=3, seed=12),  # decode only (b0 = 0)
    K.Step(prefill=[(130, 12)], decode=[], padding=1, seed=13),  # prefill only: no split
]


@pytest.mark.parametrize("step", FIXED_STEPS, ids=["mixed", "decode_only", "prefill_only"])
@pytest.mark.parametrize("gpu", ["H200", "B200"])
def test_split_fixed_cases(gpu, step):
    test_split_equals_unsplit.hypothesis.inner_test(gpu, step)


@pytest.mark.parametrize(
    "step",
    [
        K.Step(prefill=[(200, 24), (0, 9)], decode=[300, 17, 140], padding=2, holes=False, seed=21),
        K.Step(prefill=[], decode=[260, 5], padding=1, holes=False, seed=22),
    ],
    ids=["mixed", "decode_only"],
)
def test_sm90_q8kv8_prefill_rows_unchanged_decode_rows_exact(step):
    """SM90 Q8KV8: prefill rows take upstream's Q8KV8 path unchanged; decode rows take the fp8
    decode kernel, i.e. they match the bf16 sparse path (no fp8 cast of q) instead of Q8KV8."""
    with K.reference_world("H200"):
        q8 = K.World(step, q8kv8=True)
        base_q8 = q8.run_step(q8.forward_batch())
        bf16 = K.World(step)
        base_bf16 = bf16.run_step(bf16.forward_batch())
        with K.patch_installed():
            K.CALLS.clear()
            out = q8.run_step(q8.forward_batch())
            plan = ms.get_plan(q8.backend)
        b0, d = step.b0, len(step.decode)
        assert plan is not None and plan.boundary.b0 == b0
        for layer in out:
            assert torch.equal(out[layer][:b0], base_q8[layer][:b0])
            torch.testing.assert_close(
                out[layer][b0 : b0 + d].float(),
                base_bf16[layer][b0 : b0 + d].float(),
                atol=ATOL,
                rtol=RTOL,
            )
            # Against the fp8-q unsplit output the decode rows differ only by q's e4m3 cast.
            torch.testing.assert_close(
                out[layer][b0 : b0 + d].float(),
                base_q8[layer][b0 : b0 + d].float(),
                atol=0.1,
                rtol=0.1,
            )
            assert out[layer][b0 + d :].abs().max() == 0


# ---- decode-only steps: DP-attention decode batches relabelled to a 1-token EXTEND -------------------------


@pytest.mark.parametrize("how", ["prepare_mlp_sync_relabel", "convert_decode_to_extend"])
def test_dp_attention_decode_relabelled_to_extend_splits_at_zero(how):
    step = K.Step(prefill=[], decode=[40, 257, 600], padding=5, seed=31)
    with K.reference_world("B200"):
        world = K.World(step)
        kw = dict(mode=ForwardMode.EXTEND)
        if how == "prepare_mlp_sync_relabel":
            kw.update(num_decode_attr=None, original_mode=ForwardMode.DECODE)
        else:
            kw.update(num_decode_attr=len(step.decode))
        base = world.run_step(world.forward_batch(**kw))
        with K.patch_installed():
            K.CALLS.clear()
            out = world.run_step(world.forward_batch(**kw))
            plan = ms.get_plan(world.backend)
            _check_split_step(world, base, out, plan, step)
            assert plan.boundary.b0 == 0


def test_plain_extend_is_not_split():
    step = K.Step(prefill=[(10, 5), (0, 1)], decode=[], seed=32)
    with K.reference_world("H200"):
        world = K.World(step)
        with K.patch_installed():
            K.CALLS.clear()
            world.run_step(world.forward_batch(mode=ForwardMode.EXTEND, num_decode_attr=None))
            assert ms.get_plan(world.backend) is None and not K.CALLS.decode


# ---- boundary recording on ForwardBatch.init_new --------------------------------------------


def test_init_new_hook_records_decode_tail_only_when_it_is_the_tail():
    reqs = [object() for _ in range(5)]
    fb = SimpleNamespace()

    def rec(mode, decoding):
        ms.after_forward_batch_init_new(
            fb, None, SimpleNamespace(forward_mode=mode, reqs=reqs, decoding_reqs=decoding), None
        )
        return getattr(fb, attrs.FORWARD_BATCH_NUM_DECODE)

    assert rec(ForwardMode.MIXED, reqs[2:]) == 3
    assert rec(ForwardMode.EXTEND, reqs) == 5  # convert_decode_to_extend
    assert rec(ForwardMode.MIXED, reqs[1:3]) is None  # not the tail
    assert rec(ForwardMode.MIXED, None) is None
    assert rec(ForwardMode.DECODE, reqs) is None


def test_stale_plan_never_applies_to_another_batch():
    """A plan belongs to the ForwardBatch it was made for (e.g. BCG's static batch differs)."""
    step = K.Step(prefill=[(50, 10)], decode=[70, 300], seed=41)
    with K.reference_world("H200"):
        world = K.World(step)
        base = world.run_step(world.forward_batch())
        with K.patch_installed():
            fb = world.forward_batch()
            world.backend.init_forward_metadata(fb)
            assert ms.get_plan(world.backend) is not None
            # The pre-built prefill-only cache would not fit another batch's rows: drop it
            # so upstream rebuilds for the batch it sees, as after a BCG refresh.
            world.backend.forward_metadata.sparse_prefill_cache = None
            K.CALLS.clear()
            other = world.forward_batch()
            out = world.run_layer(other, 1)
            assert not K.CALLS.decode
            torch.testing.assert_close(out.float(), base[1].float(), atol=0, rtol=0)


# ---- flag off, registry ----------------------------------------------------------------------


def test_flag_off_leaves_upstream_untouched():
    from sglang.srt.layers.attention.deepseek_v4_backend import DeepseekV4AttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    step = K.Step(prefill=[(30, 8)], decode=[9, 200], padding=1, seed=51)
    before = {
        n: DeepseekV4AttnBackend.__dict__[n]
        for n in (
            "init_forward_metadata",
            "_forward_prefill_sparse",
            "_forward_prefill_sparse_q8kv8",
            "_build_sparse_prefill_chunk_cache",
            "prepare_forward_metadata_for_breakable_cuda_graph_replay",
        )
    }
    init_new = ForwardBatch.__dict__["init_new"]
    with K.reference_world("H200"):
        world = K.World(step)
        with K.patch_installed(flag_on=False) as status:
            assert status.state == "off"
            for n, fn in before.items():
                assert DeepseekV4AttnBackend.__dict__[n] is fn
            assert ForwardBatch.__dict__["init_new"] is init_new
            K.CALLS.clear()
            world.run_step(world.forward_batch(num_decode_attr=None))
            assert getattr(world.backend.forward_metadata, attrs.METADATA_SPLIT_PLAN, None) is None
            assert not K.CALLS.decode and K.CALLS.sparse_rows == [step.num_rows] * 3
    for n, fn in before.items():  # and the kit restores what an enabled install changed
        assert DeepseekV4AttnBackend.__dict__[n] is fn


def test_hook_targets_resolve_and_flags_are_strict(monkeypatch):
    for h in ms.HOOKS:
        assert check_hook(h).ok, check_hook(h)
    assert ms.SPLIT_FLAG.default is False and ms.POLICY_FLAG.default == "adaptive"
    monkeypatch.setenv("SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN", "1")
    monkeypatch.setenv("SGLANG_MIXGRAPH_SPLIT_POLICY", "sometimes")
    with pytest.raises(PatchCheckError, match="SGLANG_MIXGRAPH_SPLIT_POLICY"):
        install((ms.PATCH,))


# ---- fallbacks -------------------------------------------------------------------------------


FALLBACKS = {
    "hisparse": lambda w, fb, mp: setattr(w.backend, "hisparse_coordinator", object()),
    "dsv41": lambda w, fb, mp: setattr(w.backend, "is_dsv41", True),
    "spec": lambda w, fb, mp: setattr(w.backend, "mtp_enabled", True),
    "cp": lambda w, fb, mp: mp.setattr("sglang.srt.layers.cp.utils.is_cp_active", lambda fb: True),
    "trtllm": lambda w, fb, mp: setattr(w.backend, "trtllm_attn", True),
    "request_window": lambda w, fb, mp: setattr(
        w.pool, "request_window", SimpleNamespace(activate=lambda layout: None)
    ),
    "low_ratio": lambda w, fb, mp: setattr(w.backend, "low_ratios", (1,)),
    "heads": lambda w, fb, mp: _heads(w, 32),
}


@pytest.mark.parametrize("reason", sorted(FALLBACKS))
def test_unsupported_configs_fall_back_logged_once(reason, monkeypatch, caplog):
    step = K.Step(prefill=[(20, 6)], decode=[8, 150], seed=61)
    with K.reference_world("H200"):
        world = K.World(step)
        with K.patch_installed(), caplog.at_level(logging.INFO, logger="sglang_mixgraph"):
            FALLBACKS[reason](world, None, monkeypatch)
            for _ in range(2):
                fb = world.forward_batch()
                world.backend.init_forward_metadata(fb)
                assert ms.get_plan(world.backend) is None
        msgs = [r.message for r in caplog.records if "falls back" in r.message]
        assert msgs == [
            f"sglang-mixgraph: mixed_split falls back to upstream: {ms.FALLBACK_REASONS[reason]}"
        ]


def test_a_layer_ratio_the_split_does_not_know_falls_back_at_plan_time():
    """The pool's per-layer compress ratios are checked before anything is built: a layer of a
    ratio outside SWA-only / c4 / c128 (what the decode tail has inputs for) leaves the whole
    step to upstream."""
    step = K.Step(prefill=[(20, 6)], decode=[8, 150], seed=64)
    with K.reference_world("H200"):
        world = K.World(step)
        world.pool.compression_ratios = [0, 4, 2]
        with K.patch_installed():
            world.backend.init_forward_metadata(world.forward_batch())
            assert ms.get_plan(world.backend) is None
            assert world.backend.forward_metadata.sparse_prefill_cache is None


@pytest.mark.parametrize("reason", ["hisparse", "dsv41", "spec"])
def test_fallback_output_is_upstream_output(reason, monkeypatch):
    step = K.Step(prefill=[(20, 6)], decode=[8, 150], padding=1, seed=62)
    with K.reference_world("H200"):
        world = K.World(step)
        FALLBACKS[reason](world, None, monkeypatch)
        base = world.run_step(world.forward_batch())
        with K.patch_installed():
            K.CALLS.clear()
            out = world.run_step(world.forward_batch())
            assert not K.CALLS.decode
        for layer in out:
            assert torch.equal(out[layer], base[layer])


def test_mega_backend_and_sm120_fall_back(caplog):
    from sglang.srt.layers.attention.deepseek_v4_mega_backend import DeepseekV4MegaAttnBackend
    from sglang.srt.runtime_context import override_platform

    step = K.Step(prefill=[(20, 6)], decode=[8], seed=63)
    with K.reference_world("B200"):
        mega = K.World(step, backend_cls=DeepseekV4MegaAttnBackend)
        normal = K.World(step)
        with K.patch_installed(), caplog.at_level(logging.INFO, logger="sglang_mixgraph"):
            mega.backend.init_forward_metadata(mega.forward_batch())
            assert ms.get_plan(mega.backend) is None
            with override_platform(is_sm120=True):
                normal.backend.init_forward_metadata(normal.forward_batch())
            assert ms.get_plan(normal.backend) is None
    text = "\n".join(r.message for r in caplog.records)
    assert ms.FALLBACK_REASONS["mega"] in text and ms.FALLBACK_REASONS["sm120"] in text


# ---- the adaptive policy is wired to the cost model -------------------------------------


@pytest.mark.parametrize("decode_cost,expect_split", [(0.0, True), (1.0, False)])
def test_adaptive_policy_follows_cost_model(decode_cost, expect_split, monkeypatch):
    from sglang_mixgraph.core import split_cost_model as scm

    coeffs = scm.builtin_coefficients()
    per = {
        r: dict(c, d_key=decode_cost, d_row=decode_cost, c_dec=0.0, a_cat=0.0)
        for r, c in coeffs.per_ratio.items()
    }
    free_step = dict.fromkeys(scm.STEP_NAMES, 0.0)  # the plan and its cache cost nothing here
    monkeypatch.setattr(
        ms.plan,
        "_cost_coefficients",
        lambda: scm.Coefficients("test", per, margin=0.0, step=free_step),
    )
    step = K.Step(prefill=[(100, 16)], decode=[400, 500, 90], padding=1, seed=71)
    with K.reference_world("H200"):
        world = K.World(step)
        base = world.run_step(world.forward_batch())
        with K.patch_installed(policy="adaptive"):
            K.CALLS.clear()
            out = world.run_step(world.forward_batch())
            plan = ms.get_plan(world.backend)
        assert (plan is not None) == expect_split
        if expect_split:
            assert plan.policy == "adaptive"
        for layer in out:
            torch.testing.assert_close(
                out[layer].float(), base[layer].float(), atol=ATOL, rtol=RTOL
            )


def _heads(world, n):
    """The model's query heads as the plan reads them (its config's ``num_attention_heads``)."""
    world.backend.model_runner.model_config.hf_text_config.num_attention_heads = n


def test_a_head_count_the_decode_kernel_cannot_take_falls_back_at_plan_time(caplog):
    """A model whose queries have 32 heads (not a decode-kernel head count): the plan sees it
    in the model's config and leaves the step to upstream before building anything, so the
    step has upstream's one chunk cache and upstream's output, bit for bit."""
    step = K.Step(prefill=[(60, 11)], decode=[30, 290], padding=1, seed=81)
    with K.reference_world("H200"):
        world = K.World(step)
        _heads(world, 32)
        q = world.q(heads=32)
        base_fb = world.forward_batch()
        world.backend.init_forward_metadata(base_fb)
        base = world.run_layer(base_fb, 1, q=q)
        with (
            K.patch_installed(),
            caplog.at_level(logging.INFO, logger="sglang_mixgraph"),
            K.cache_builds() as builds,
        ):
            fb = world.forward_batch()
            world.backend.init_forward_metadata(fb)
            assert ms.get_plan(world.backend) is None and builds == []
            K.CALLS.clear()
            out = world.run_layer(fb, 1, q=q)
            assert not K.CALLS.decode and K.CALLS.sparse_rows == [step.num_rows]
        assert builds == [len(step.seq_lens)]  # upstream's lazy build, all requests
        assert torch.equal(out, base)
        assert ms.FALLBACK_REASONS["heads"] in caplog.text


def test_unknown_head_count_falls_back():
    step = K.Step(prefill=[(60, 11)], decode=[30], seed=82)
    with K.reference_world("H200"):
        world = K.World(step)
        del world.backend.model_runner
        with K.patch_installed():
            world.backend.init_forward_metadata(world.forward_batch())
            assert ms.get_plan(world.backend) is None


def _contradict(world, fb, how):
    """Run layer 1 of a planned step with what the plan checked otherwise; what it returns."""
    if how == "heads":
        return world.run_layer(fb, 1, q=world.q(heads=32))
    if how == "ratio":
        del ms.get_plan(world.backend).tails[4]
        return world.run_layer(fb, 1)
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["heads", "ratio"])
def test_a_layer_that_contradicts_its_plan_raises_where_read_done_may_be_published(how):
    """The plan checked the heads (the model's config) and the layers' compress ratios (the
    pool's); a layer that still differs (upstream changed under the patch) cannot go back to
    upstream where read-done may be published for the step (it is by default: upstream's
    eager snapshot), because upstream's lazy build would read the shared tables late and no
    fallback cache exists: it raises before anything is built or launched."""
    step = K.Step(prefill=[(60, 11)], decode=[30, 290], padding=1, seed=83)
    with K.reference_world("H200"):
        world = K.World(step)
        with K.patch_installed(), K.cache_builds() as builds:
            fb = world.forward_batch()
            world.backend.init_forward_metadata(fb)
            plan = ms.get_plan(world.backend)
            assert plan is not None and plan.may_publish and builds == [len(step.prefill)]
            K.CALLS.clear()
            with pytest.raises(ms.SplitPlanError, match="SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN=0"):
                _contradict(world, fb, how)
            assert builds == [len(step.prefill)] and not K.CALLS.decode
            assert not K.CALLS.sparse_rows


@pytest.mark.parametrize("how", ["heads", "ratio"])
def test_without_read_done_a_contradicting_layer_goes_back_to_upstream(how, monkeypatch):
    """Where nothing can be published for the step (upstream's coarse barrier), the same
    layer abandons the plan: upstream's lazy build covers every row and the output is
    upstream's, bit for bit."""
    from sglang.srt.environ import envs

    step = K.Step(prefill=[(60, 11)], decode=[30, 290], padding=1, seed=84)
    with K.reference_world("H200"), envs.SGLANG_FORCE_COARSE_WAR_BARRIER.override(True):
        world = K.World(step)
        q = world.q(heads=32) if how == "heads" else world.q()
        base_fb = world.forward_batch()
        world.backend.init_forward_metadata(base_fb)
        base = world.run_layer(base_fb, 1, q=q)
        with K.patch_installed(), K.cache_builds() as builds:
            fb = world.forward_batch()
            world.backend.init_forward_metadata(fb)
            plan = ms.get_plan(world.backend)
            assert plan is not None and not plan.may_publish
            K.CALLS.clear()
            out = _contradict(world, fb, how)
            assert ms.get_plan(world.backend) is None and not K.CALLS.decode
        assert builds == [len(step.prefill), len(step.seq_lens)]
        assert torch.equal(out, base)


# ---- adaptive decides whole steps; one chunk cache per step ------------------------------------


def _decide(split):
    """``split_cost_model.decide_step`` answering ``split`` (never without decode rows, as the
    model does), recording each call's regime."""
    asked = []

    def decide(counts, layers, coeffs, margin=None, *, regime="replay"):
        asked.append((regime, dict(layers)))
        return counts.num_decode > 0 and split

    return decide, asked


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(step=step_strategy, split=st.booleans())
def test_adaptive_splits_whole_steps_with_one_chunk_cache(step, split):
    """Whatever ``adaptive`` decides, the step builds one chunk cache: a split step its
    prefill-only one (none without prefill rows) and every layer split; an unsplit step no plan
    and upstream's own cache, every layer upstream's, bit for bit."""
    from sglang_mixgraph.core import split_cost_model as scm

    with K.reference_world("H200"), pytest.MonkeyPatch.context() as mp:
        decide, asked = _decide(split)
        mp.setattr(scm, "decide_step", decide)
        world = K.World(step)
        base = world.run_step(world.forward_batch())
        with K.patch_installed(policy="adaptive"), K.cache_builds() as builds:
            K.CALLS.clear()
            out = world.run_step(world.forward_batch())
            plan = ms.get_plan(world.backend)
        if not step.decode:
            assert plan is None and not asked
        else:
            # The whole step is asked once, with every layer of the model.
            assert asked == [("eager", {0: 1, 4: 1, 128: 1})]
        if plan is not None:
            assert split and plan.policy == "adaptive"
            _check_split_step(world, base, out, plan, step)
            assert builds == ([len(step.prefill)] if step.b0 else [])
        else:
            assert not K.CALLS.decode
            assert builds == [len(step.seq_lens)]
            for layer in out:
                assert torch.equal(out[layer], base[layer])


def test_adaptive_decides_with_the_real_step_model(monkeypatch):
    """The plan's decision is ``decide_step`` of the real model on the step's counts and the
    pool's layers: with coefficients that make every decode row free the step splits, with
    ones that make the decode kernel expensive it does not, and each way the step matches."""
    from sglang_mixgraph.core import split_cost_model as scm

    step = K.Step(prefill=[(100, 16)], decode=[400, 500, 90], padding=1, seed=77)
    counts = scm.StepCounts.from_lists(step.seq_lens, step.extend_lens, 3, topk=K.TOPK)
    mix = {0: 1, 4: 1, 128: 1}
    for cost, expect in ((0.0, True), (1.0, False)):
        per = {
            r: dict(c, d_key=cost, d_row=cost, c_dec=cost)
            for r, c in scm.builtin_coefficients().per_ratio.items()
        }
        coeffs = scm.Coefficients("test", per, margin=0.0, step=dict.fromkeys(scm.STEP_NAMES, 0.0))
        assert scm.decide_step(counts, mix, coeffs, regime="eager") == expect
        monkeypatch.setattr(ms.plan, "_cost_coefficients", lambda coeffs=coeffs: coeffs)
        with K.reference_world("H200"):
            world = K.World(step)
            with K.patch_installed(policy="adaptive"):
                world.backend.init_forward_metadata(world.forward_batch())
                assert (ms.get_plan(world.backend) is not None) == expect


def test_adaptive_unsplit_q8kv8_step_is_upstream_exactly(monkeypatch):
    from sglang_mixgraph.core import split_cost_model as scm

    monkeypatch.setattr(scm, "decide_step", _decide(False)[0])
    step = K.Step(
        prefill=[(200, 24), (0, 9)], decode=[300, 17, 140], padding=2, holes=False, seed=75
    )
    with K.reference_world("H200"):
        q8 = K.World(step, q8kv8=True)
        base_q8 = q8.run_step(q8.forward_batch())
        with K.patch_installed(policy="adaptive"):
            K.CALLS.clear()
            out = q8.run_step(q8.forward_batch())
            assert ms.get_plan(q8.backend) is None and not K.CALLS.decode
        for layer in out:
            assert torch.equal(out[layer], base_q8[layer])


# ---- the per-layer work of a split layer ---------------------------------------------------------


def test_decode_tail_inputs_are_built_once_per_ratio_per_step(monkeypatch):
    """Two layers of each ratio in one step: the plan slices the step's metadata for the decode
    tail once per ratio (three slicings, not six), both layers of a ratio hand the decode kernel
    the very same index and length tensors and scheduling metadata, and the outputs match."""
    step = K.Step(prefill=[(300, 29), (0, 7)], decode=[255, 256, 129, 0], padding=2, seed=91)
    layers = (0, 1, 2, 1, 2, 0)
    with K.reference_world("H200"):
        world = K.World(step)
        base = world.run_step(world.forward_batch(), layers=(0, 1, 2))
        sliced = []
        real = ms.plan.tail_inputs
        monkeypatch.setattr(
            ms.plan, "tail_inputs", lambda r, *a, **k: sliced.append(r) or real(r, *a, **k)
        )
        with K.patch_installed():
            K.CALLS.clear()
            fb = world.forward_batch()
            world.backend.init_forward_metadata(fb)
            outs = [world.run_layer(fb, layer) for layer in layers]
            plan = ms.get_plan(world.backend)
    assert sorted(sliced) == [0, 4, 128] and plan.tail_builds == {0: 1, 4: 1, 128: 1}
    assert plan.decode_calls == {0: 2, 4: 2, 128: 2}
    by_ratio = {}
    for layer, call in zip(layers, K.CALLS.decode, strict=True):
        by_ratio.setdefault(K.LAYER_RATIOS[layer], []).append(call)
    for ratio, (a, b) in by_ratio.items():
        for name in ("indices", "topk_length", "extra_indices_in_kvcache", "extra_topk_length"):
            assert a[name] is b[name], (ratio, name)
        assert a["tile_scheduler_metadata"] is b["tile_scheduler_metadata"]
    for layer, out in zip(layers, outs, strict=True):
        torch.testing.assert_close(out.float(), base[layer].float(), atol=ATOL, rtol=RTOL)


def test_the_tail_reads_the_indexers_per_layer_topk_and_follows_a_replaced_tensor():
    """The plan's c4 views are views: the indexer's in-place write of a layer's top-k reaches
    the decode kernel; were the step's top-k tensor replaced instead, the plan rebuilds that
    ratio's inputs from the new one (counted) rather than read stale rows."""
    step = K.Step(prefill=[(100, 16)], decode=[400, 500, 90], seed=92)
    b0, d = step.b0, len(step.decode)
    with K.reference_world("H200"):
        world = K.World(step)
        with K.patch_installed():
            fb = world.forward_batch()
            world.backend.init_forward_metadata(fb)
            plan = ms.get_plan(world.backend)
            core = world.backend.forward_metadata.core_attn_metadata
            K.CALLS.clear()
            # the indexer's write for this layer: the decode rows' selection reversed, in place
            c4 = core.c4_sparse_page_indices
            c4[b0 : b0 + d] = c4[b0 : b0 + d].flip(-1).clone()
            world.run_layer(fb, 1)
            assert torch.equal(
                K.CALLS.decode[-1]["extra_indices_in_kvcache"].squeeze(1), c4[b0 : b0 + d]
            )
            core.c4_sparse_page_indices = c4.clone()
            core.c4_sparse_page_indices[b0 : b0 + d] = -1
            world.run_layer(fb, 1)
            got = K.CALLS.decode[-1]["extra_indices_in_kvcache"].squeeze(1)
            assert (got == -1).all() and plan.tail_builds[4] == 2 and plan.tail_builds[0] == 1


@pytest.mark.parametrize(
    "step",
    [
        K.Step(prefill=[(60, 11)], decode=[30, 290], seed=93),
        K.Step(prefill=[], decode=[40, 300], seed=94),
    ],
    ids=["mixed", "decode_only"],
)
def test_the_sparse_prefill_is_launched_before_the_decode_tail(step):
    """Per split layer with prefill rows: upstream's sparse prefill (the layer's longest kernel)
    first, then the decode kernel; without prefill rows the decode kernel alone."""
    with K.reference_world("H200"):
        world = K.World(step)
        order = []
        fmi = sys.modules["sglang.kernels.ops.attention.flash_mla_interface"]
        sparse, decode = fmi.flash_mla_sparse_fwd, world.backend._flash_mla_with_kvcache

        def sparse_first(*a, **k):
            order.append("sparse")
            return sparse(*a, **k)

        def decode_then(*a, **k):
            order.append("decode")
            return decode(*a, **k)

        fmi.flash_mla_sparse_fwd = sparse_first
        world.backend._flash_mla_with_kvcache = decode_then
        with K.patch_installed():
            world.run_step(world.forward_batch())
    assert order == (["sparse", "decode"] * 3 if step.b0 else ["decode"] * 3)


class _OwnTorchCalls:
    """Counts the torch calls made from the split's own modules (not upstream's body, not the
    kernels): ``patches/mixed_split/forward.py`` and the core helpers it runs per layer."""

    FILES = ("mixed_split/forward.py", "core/decode_tail.py", "core/mixed_boundary.py")
    FREE = ("__get__", "dim", "size", "data_ptr")  # shape and address reads

    def __enter__(self):
        from torch.overrides import TorchFunctionMode

        calls = self.calls = []
        files = self.FILES
        free = self.FREE

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                name = getattr(func, "__name__", str(func))
                where = sys._getframe(1).f_code.co_filename
                if name not in free and any(where.endswith(f) for f in files):
                    calls.append(name)
                return func(*args, **(kwargs or {}))

        self.mode = Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def test_a_split_layer_issues_only_its_kernels_a_tail_view_and_the_copy():
    """Host work of a split layer in a step after the first (the KV-cache views are made once
    per layer): beside upstream's sparse prefill and the decode kernel, the split's own code
    makes a view of the query's tail rows, squeezes the kernel's output and copies it in, and
    nothing else (no metadata slicing, no checks of its tensors: the plan did those)."""
    step = K.Step(prefill=[(300, 29), (0, 7)], decode=[255, 256, 129, 0], padding=2, seed=95)
    with K.reference_world("H200"):
        world = K.World(step)
        with K.patch_installed():
            world.run_step(world.forward_batch())
            fb = world.forward_batch()
            world.backend.init_forward_metadata(fb)
            q = world.q()
            per_layer = {}
            for layer in (0, 1, 2):
                with _OwnTorchCalls() as own:
                    world.run_layer(fb, layer, q=q)
                per_layer[layer] = own.calls
    for layer, calls in per_layer.items():
        assert sorted(calls) == ["__getitem__", "copy_", "narrow", "squeeze"], (layer, calls)
