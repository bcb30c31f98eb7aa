"""Split == unsplit for small MIXED batches, with the torch references as the kernels (fp32)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_mixgraph.kits.decode_tail_call import DecodeTail
from sglang_mixgraph.kits.synthetic_step import (
    StepSpec,
    build_step,
    plan_split_prefill,
    plan_workspace,
    rel_l2,
    split_attention,
    unsplit_attention,
)
from sglang_mixgraph.reference.sparse_mla import (
    ReferenceSchedMeta,
    flash_mla_sparse_fwd_reference,
    flash_mla_with_kvcache_reference,
)
from sglang_mixgraph.reference.v4_dequant import dequantize_v4


def _fp32_sparse_fwd(q, kv, indices, sm_scale, d_v, sink, lens):
    from sglang_mixgraph.reference.sparse_mla import sparse_prefill_reference

    return sparse_prefill_reference(q, kv, indices, sm_scale, d_v, sink, lens)


def _fp32_decode(**kw):
    from sglang_mixgraph.reference.sparse_mla import sparse_decode_reference

    # flash_mla_with_kvcache_reference has the same contract; fp32 output for a tight comparison
    return sparse_decode_reference(
        kw["q"],
        kw["k_cache"],
        kw["indices"],
        kw["topk_length"],
        kw["attn_sink"],
        kw["extra_k_cache"],
        kw["extra_indices_in_kvcache"],
        kw["extra_topk_length"],
        kw["softmax_scale"],
    )


@st.composite
def mixed_batches(draw):
    p = draw(st.integers(0, 4))
    d = draw(st.integers(0, 8))
    if p + d == 0:
        d = 1
    seqs, exts = [], []
    for _ in range(p):
        ext = draw(st.integers(1, 150))
        prefix = draw(st.integers(0, 400))  # crosses the SWA window (128) and pages
        seqs.append(prefix + ext)
        exts.append(ext)
    for _ in range(d):
        seqs.append(draw(st.integers(1, 600)))
        exts.append(1)
    return dict(
        seq_lens=seqs,
        extend_lens=exts,
        num_decode=d,
        num_padding=draw(st.integers(0, 4)),
        ratio=draw(st.sampled_from([4, 128])),
        seed=draw(st.integers(0, 2**20)),
    )


@settings(max_examples=25, deadline=None)
@given(mixed_batches(), st.sampled_from(["copy", "cat"]))
def test_split_equals_unsplit_reference(batch, join):
    spec = StepSpec(topk=64, h_q=4, swa_page_size=64, full_page_size=64, **batch)
    step = build_step(spec, q_scale=2.0)
    b = step.boundary
    n_req = len(spec.seq_lens)
    plan_all = plan_workspace(step, n_req, b.decode_end)
    plan_pre = plan_split_prefill(step, join)
    calls = []

    def decode(**kw):
        calls.append(kw)
        return _fp32_decode(**kw)

    tail = DecodeTail(kernel=decode, meta_factory=ReferenceSchedMeta)
    unsplit = unsplit_attention(step, plan_all, dequantize_v4, _fp32_sparse_fwd)
    split = split_attention(step, plan_pre, dequantize_v4, _fp32_sparse_fwd, tail)
    assert split.shape == unsplit.shape == (b.num_rows, 4, 512)
    assert torch.isfinite(split).all()
    torch.testing.assert_close(split.float(), unsplit.float(), rtol=1e-5, atol=1e-5)
    assert (split[b.padding_rows] == 0).all()
    # the workspace holds only prefill requests' tokens
    prefill_tokens = sum(
        min(s, e + 127)
        for s, e in zip(
            spec.seq_lens[: b.num_prefill_reqs],
            spec.extend_lens[: b.num_prefill_reqs],
            strict=False,
        )
    )
    if b.num_prefill_reqs:
        assert plan_pre.swa_ids.numel() == prefill_tokens
        assert plan_pre.num_tokens <= plan_all.num_tokens
        # copy-join: decode and padding rows reach the sparse prefill with no key at all
        if join == "copy":
            assert plan_pre.num_rows == b.num_rows
            assert (plan_pre.lengths[b.b0 :] == 0).all() and (plan_pre.indices[b.b0 :] == -1).all()
    else:
        assert plan_pre is None
    # decode rows reach the decode kernel with exactly their own metadata rows
    if b.num_decode_reqs:
        (kw,) = calls
        rows = b.decode_rows
        assert torch.equal(kw["indices"][:, 0], step.swa_indices[rows])
        assert torch.equal(kw["topk_length"], step.swa_lengths[rows])
        assert torch.equal(kw["extra_indices_in_kvcache"][:, 0], step.extra_indices[rows])
        assert torch.equal(kw["extra_topk_length"], step.extra_lengths[rows])
        assert kw["q"].data_ptr() == step.q[rows].data_ptr()
    else:
        assert not calls


def test_bf16_outputs_agree_and_swa_only_rows():
    spec = StepSpec(
        ratio=4,
        seq_lens=[300, 500, 40, 900],
        extend_lens=[120, 1, 1, 1],
        num_decode=3,
        topk=64,
        h_q=8,
        swa_page_size=64,
        full_page_size=64,
        swa_only_rows=[121, 122],
        seed=5,
    )
    step = build_step(spec, q_scale=2.0)
    b = step.boundary
    assert (
        step.n_sel[121] == 0
        and step.extra_lengths[121] == 1
        and (step.extra_indices[121] == -1).all()
    )
    plan_all = plan_workspace(step, 4, b.decode_end)
    u = unsplit_attention(step, plan_all, dequantize_v4, flash_mla_sparse_fwd_reference)
    for join in ("copy", "cat"):
        tail = DecodeTail(kernel=flash_mla_with_kvcache_reference, meta_factory=ReferenceSchedMeta)
        s = split_attention(
            step,
            plan_split_prefill(step, join),
            dequantize_v4,
            flash_mla_sparse_fwd_reference,
            tail,
        )
        assert u.dtype == s.dtype == torch.bfloat16
        assert rel_l2(s, u) < 1e-3
