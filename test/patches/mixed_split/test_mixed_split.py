"""The mixed split on upstream's DSV4 backend (CPU): split == unsplit, routing, workspace, fallbacks.

See test/mixed_split_kit.py for what runs upstream code and what is ours.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_mixgraph import fallback
from sglang_mixgraph import upstream_attrs as attrs
from sglang_mixgraph.kits import dsv4_cpu as K
from sglang_mixgraph.target_gpu import described_gpu

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


def _ctx(gpu="H200", q8=False):
    import contextlib

    stack = contextlib.ExitStack()
    stack.enter_context(described_gpu(gpu))
    stack.enter_context(K.sglang_context())
    stack.enter_context(K.reference_kernels())
    return stack


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
    # Every ratio splits: no layer runs unsplit. The all-requests cache is built anyway, before
    # upstream's eager snapshot publishes read-done (on by default), for an abandon at the first
    # layer; no layer read it (no compressed gather in it).
    assert plan.split_ratios == frozenset(ms.ALL_RATIOS)
    assert not plan.unsplit_calls
    assert plan.full_cache is not None and plan.full_cache.compressed == {}
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
        # One scheduling-metadata object per ratio for this step, bound to the tail shape.
        assert plan.tail.metas.bound_shape(ratio).batch == d
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


@pytest.mark.parametrize("gpu", ["H200", "B200"])
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(step=step_strategy)
def test_split_equals_unsplit(gpu, step):
    with _ctx(gpu):
        world = K.World(step)
        base = world.run_step(world.forward_batch())
        with K.patch_installed():
            K.CALLS.clear()
            out = world.run_step(world.forward_batch())
            plan = ms.get_plan(world.backend)
            _check_split_step(world, base, out, plan, step)


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
    with _ctx("H200"):
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
    with _ctx("B200"):
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
    with _ctx("H200"):
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
    with _ctx("H200"):
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
    with _ctx("H200"):
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
}


@pytest.mark.parametrize("reason", sorted(FALLBACKS))
def test_unsupported_configs_fall_back_logged_once(reason, monkeypatch, caplog):
    step = K.Step(prefill=[(20, 6)], decode=[8, 150], seed=61)
    with _ctx("H200"):
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


@pytest.mark.parametrize("reason", ["hisparse", "dsv41", "spec"])
def test_fallback_output_is_upstream_output(reason, monkeypatch):
    step = K.Step(prefill=[(20, 6)], decode=[8, 150], padding=1, seed=62)
    with _ctx("H200"):
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
    with _ctx("B200"):
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
    monkeypatch.setattr(
        ms.plan, "_cost_coefficients", lambda: scm.Coefficients("test", per, margin=0.0)
    )
    step = K.Step(prefill=[(100, 16)], decode=[400, 500, 90], padding=1, seed=71)
    with _ctx("H200"):
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


def test_call_time_surprise_abandons_plan_and_runs_upstream_on_all_rows(caplog):
    """A head count the decode kernel cannot take is only visible at the first layer: the step
    goes back to upstream with a full-batch workspace, and the output is upstream's."""
    step = K.Step(prefill=[(60, 11)], decode=[30, 290], padding=1, seed=81)
    with _ctx("H200"):
        world = K.World(step)
        q = world.q(heads=32)
        base_fb = world.forward_batch()
        world.backend.init_forward_metadata(base_fb)
        base = world.run_layer(base_fb, 1, q=q)
        with K.patch_installed(), caplog.at_level(logging.INFO, logger="sglang_mixgraph"):
            fb = world.forward_batch()
            world.backend.init_forward_metadata(fb)
            assert ms.get_plan(world.backend) is not None
            K.CALLS.clear()
            out = world.run_layer(fb, 1, q=q)
            assert ms.get_plan(world.backend) is None and not K.CALLS.decode
            assert K.CALLS.sparse_rows == [step.num_rows]
        assert torch.equal(out, base)
        assert ms.FALLBACK_REASONS["heads"] in caplog.text


# ---- adaptive decides per compress ratio ------------------------------------------------


def _base_run(world, fb):
    """Upstream's step: outputs, its chunk cache, and what each layer dequantized."""
    K.CALLS.clear()
    out = world.run_step(fb)
    return out, world.backend.forward_metadata.sparse_prefill_cache, list(K.CALLS.dequant_slots)


def _layer_dequants(world, calls, layer):
    ptrs = {world.pool.get_swa_key_buffer_radix(layer).data_ptr()}
    if K.LAYER_RATIOS[layer]:
        ptrs.add(world.pool.get_extra_key_buffer(layer).data_ptr())
    return [(ptr, slots.tolist()) for ptr, slots in calls if ptr in ptrs]


def _same_chunk_cache(a, b, ratios):
    assert (a.num_reqs, a.num_qo_tokens, a.max_seq_len) == (
        b.num_reqs,
        b.num_qo_tokens,
        b.max_seq_len,
    )
    for name in (
        "seq_lens",
        "query_start_loc",
        "query_pos",
        "swa_token_ids",
        "swa_offsets",
        "swa_gather_lens",
        "c0_combined_indices",
        "c0_combined_lens",
    ):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    for r in ratios:
        ga, gb = a.compressed[r], b.compressed[r]
        for name in (
            "flat_token_ids",
            "compressed_base",
            "swa_base",
            "combined_indices",
            "combined_lens",
        ):
            assert torch.equal(getattr(ga, name), getattr(gb, name)), (r, name)


def _check_per_ratio_step(world, base, base_cache, base_dequant, out, plan, step, split):
    """``split``: the ratios the cost model splits. Split layers as in `_check_split_step`; the
    other layers run upstream's unsplit body over every row with upstream's own chunk cache."""
    b0, d = step.b0, len(step.decode)
    for layer in out:
        torch.testing.assert_close(out[layer].float(), base[layer].float(), atol=ATOL, rtol=RTOL)
        if step.padding:
            assert out[layer][b0 + d :].abs().max() == 0
    if d == 0 or not split:
        assert plan is None and not K.CALLS.decode
        return
    assert plan is not None and plan.policy == "adaptive" and plan.split_ratios == split
    split_layers = [lay for lay in sorted(out) if K.LAYER_RATIOS[lay] in split]
    unsplit_layers = [lay for lay in sorted(out) if K.LAYER_RATIOS[lay] not in split]
    core = world.backend.forward_metadata.core_attn_metadata
    q = world.q()
    # Split ratios: the tail rows reach the decode kernel, once per split layer, nothing else.
    assert len(K.CALLS.decode) == len(split_layers)
    assert plan.decode_calls == {K.LAYER_RATIOS[lay]: 1 for lay in split_layers}
    for call, layer in zip(K.CALLS.decode, split_layers, strict=False):
        ratio = K.LAYER_RATIOS[layer]
        assert torch.equal(call["q"].squeeze(1), q[b0 : b0 + d])
        assert torch.equal(call["indices"].squeeze(1), core.swa_page_indices[b0 : b0 + d])
        if ratio:
            assert torch.equal(
                call["extra_indices_in_kvcache"].squeeze(1),
                core.sparse_page_indices(ratio)[b0 : b0 + d],
            )
    # Unsplit ratios: upstream's body over all rows, once per layer.
    assert plan.unsplit_calls == {K.LAYER_RATIOS[lay]: 1 for lay in unsplit_layers}
    expect_rows = [
        (step.num_rows if b0 else 0) if K.LAYER_RATIOS[lay] in split else step.num_rows
        for lay in sorted(out)
    ]
    assert K.CALLS.sparse_rows == [r for r in expect_rows if r]
    # ... seeing exactly the chunk cache upstream built for the step (all requests), whose
    # compressed parts exist only for the unsplit ratios (no compressed gather is built twice).
    if unsplit_layers:
        unsplit_c = {K.LAYER_RATIOS[lay] for lay in unsplit_layers} - {0}
        assert set(plan.full_cache.compressed) == unsplit_c
        _same_chunk_cache(plan.full_cache, base_cache, unsplit_c)
    else:  # built only for an abandon (read-done may be published), read by no layer
        assert plan.full_cache is not None and plan.full_cache.compressed == {}
    # ... and dequantizing exactly what upstream dequantized for those layers.
    for layer in unsplit_layers:
        assert _layer_dequants(world, K.CALLS.dequant_slots, layer) == _layer_dequants(
            world, base_dequant, layer
        )
    # The metadata keeps the prefill-only cache for the split ratios.
    cache = world.backend.forward_metadata.sparse_prefill_cache
    if b0 == 0:
        assert cache is None
    else:
        assert cache.num_reqs == len(step.prefill) and cache.num_qo_tokens == step.num_rows
        assert set(cache.compressed) <= split
        for layer in split_layers:
            swa_ok, comp_ok = _prefill_only_slots(world, layer)
            for ptr, slots in _layer_dequants(world, K.CALLS.dequant_slots, layer):
                assert set(slots) <= (
                    swa_ok
                    if ptr == world.pool.get_swa_key_buffer_radix(layer).data_ptr()
                    else comp_ok | {0}
                )


def _decide_ratios(split):
    """The real cost model's per-kind interface (`should_split(shape, coeffs, margin, regime)`),
    answering yes exactly for the ratios in ``split`` (and never without decode rows, as the
    model does)."""
    return (
        lambda shape, coeffs, margin=None, regime="replay": shape.num_decode > 0
        and shape.ratio in split
    )


def _c4_not_c128_coefficients():
    """Real coefficients, skewed so the real ``should_split`` splits c4 (and SWA-only, which
    borrows c4's numbers) layers and keeps c128 layers unsplit."""
    from sglang_mixgraph.core import split_cost_model as scm

    base = scm.builtin_coefficients().per_ratio[4]
    per = {
        4: dict(base, d_key=0.0, d_row=0.0, c_dec=0.0, a_cat=0.0),
        128: dict(base, d_key=1.0, d_row=1.0, c_dec=1.0),
    }
    return scm.Coefficients("test", per, margin=0.0)


@pytest.mark.parametrize(
    "step",
    [
        FIXED_STEPS[0],
        K.Step(prefill=[(100, 16)], decode=[400, 500, 90], padding=1, seed=72),
        K.Step(prefill=[], decode=[511, 3, 130], padding=3, seed=73),
    ],
    ids=["mixed", "mixed2", "decode_only"],
)
def test_adaptive_splits_c4_not_c128_with_injected_coefficients(step, monkeypatch):
    from sglang_mixgraph.core import split_cost_model as scm

    coeffs = _c4_not_c128_coefficients()
    b = scm.StepShape.from_lists
    assert scm.should_split(b(4, step.seq_lens, step.extend_lens, len(step.decode)), coeffs)
    assert not scm.should_split(b(128, step.seq_lens, step.extend_lens, len(step.decode)), coeffs)
    monkeypatch.setattr(ms.plan, "_cost_coefficients", lambda: coeffs)
    with _ctx("H200"):
        world = K.World(step)
        base, base_cache, base_dequant = _base_run(world, world.forward_batch())
        with K.patch_installed(policy="adaptive"):
            K.CALLS.clear()
            out = world.run_step(world.forward_batch())
            plan = ms.get_plan(world.backend)
            _check_per_ratio_step(
                world, base, base_cache, base_dequant, out, plan, step, frozenset({0, 4})
            )


_ratio_sets = st.sets(st.sampled_from(ms.ALL_RATIOS)).map(frozenset)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(step=step_strategy, split=_ratio_sets)
def test_adaptive_per_ratio_equals_unsplit(step, split):
    from sglang_mixgraph.core import split_cost_model as scm

    with _ctx("H200"), pytest.MonkeyPatch.context() as mp:
        mp.setattr(scm, "should_split", _decide_ratios(split))
        world = K.World(step)
        base, base_cache, base_dequant = _base_run(world, world.forward_batch())
        with K.patch_installed(policy="adaptive"):
            K.CALLS.clear()
            out = world.run_step(world.forward_batch())
            plan = ms.get_plan(world.backend)
            _check_per_ratio_step(world, base, base_cache, base_dequant, out, plan, step, split)


@pytest.mark.parametrize("split", [frozenset({4}), frozenset({0, 128})], ids=["c4", "c0_c128"])
def test_adaptive_per_ratio_dp_decode_relabelled_to_extend(split, monkeypatch):
    """Decode-only (b0 = 0): unsplit ratios still get upstream's all-requests cache (built at
    metadata time, before the WAR snapshot), split ratios no workspace at all."""
    from sglang_mixgraph.core import split_cost_model as scm

    monkeypatch.setattr(scm, "should_split", _decide_ratios(split))
    step = K.Step(prefill=[], decode=[40, 257, 600], padding=5, seed=74)
    kw = dict(mode=ForwardMode.EXTEND, num_decode_attr=None, original_mode=ForwardMode.DECODE)
    with _ctx("B200"):
        world = K.World(step)
        base, base_cache, base_dequant = _base_run(world, world.forward_batch(**kw))
        with K.patch_installed(policy="adaptive"):
            K.CALLS.clear()
            out = world.run_step(world.forward_batch(**kw))
            plan = ms.get_plan(world.backend)
            _check_per_ratio_step(world, base, base_cache, base_dequant, out, plan, step, split)


def test_adaptive_per_ratio_q8kv8_unsplit_layers_are_upstream_exactly(monkeypatch):
    from sglang_mixgraph.core import split_cost_model as scm

    monkeypatch.setattr(scm, "should_split", _decide_ratios(frozenset({0, 4})))
    step = K.Step(
        prefill=[(200, 24), (0, 9)], decode=[300, 17, 140], padding=2, holes=False, seed=75
    )
    with _ctx("H200"):
        q8 = K.World(step, q8kv8=True)
        base_q8 = q8.run_step(q8.forward_batch())
        with K.patch_installed(policy="adaptive"):
            K.CALLS.clear()
            out = q8.run_step(q8.forward_batch())
            plan = ms.get_plan(q8.backend)
        assert plan.split_ratios == {0, 4} and plan.unsplit_calls == {128: 1}
        assert torch.equal(out[2], base_q8[2])  # the c128 layer: upstream's Q8KV8 on every row
        b0 = step.b0
        for layer in (0, 1):
            assert torch.equal(out[layer][:b0], base_q8[layer][:b0])


def test_abandoned_per_ratio_plan_hands_upstream_its_full_cache(monkeypatch):
    """A call-time surprise in a step with an unsplit ratio: the all-requests cache the plan
    built becomes the step's cache, so upstream does not rebuild it late."""
    from sglang_mixgraph.core import split_cost_model as scm

    monkeypatch.setattr(scm, "should_split", _decide_ratios(frozenset({4})))
    step = K.Step(prefill=[(60, 11)], decode=[30, 290], padding=1, seed=76)
    with _ctx("H200"):
        world = K.World(step)
        q = world.q(heads=32)
        base_fb = world.forward_batch()
        world.backend.init_forward_metadata(base_fb)
        base = world.run_layer(base_fb, 1, q=q)
        with K.patch_installed(policy="adaptive"):
            fb = world.forward_batch()
            world.backend.init_forward_metadata(fb)
            plan = ms.get_plan(world.backend)
            assert plan is not None and plan.full_cache is not None
            out = world.run_layer(fb, 1, q=q)
            assert ms.get_plan(world.backend) is None
            assert world.backend.forward_metadata.sparse_prefill_cache is plan.full_cache
        assert torch.equal(out, base)
