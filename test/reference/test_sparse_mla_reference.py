import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_mixgraph.reference import v4_kv_layout as kvl
from sglang_mixgraph.reference.sparse_mla import (
    ReferenceSchedMeta,
    flash_mla_sparse_fwd_reference,
    flash_mla_with_kvcache_reference,
    sparse_decode_reference,
)


def _cache(num_tokens, page_size, gen):
    pages = -(-num_tokens // page_size)
    cache = kvl.allocate_cache(pages, page_size)
    slots = torch.arange(pages * page_size)
    kvl.encode_tokens(cache, page_size, slots, torch.randn(slots.numel(), 512, generator=gen) * 0.5)
    return cache, kvl.dequantize_tokens(cache, page_size, slots).double()


def _naive(q, dense_main, idx, lens, dense_extra, eidx, elens, sink, scale):
    """Row-by-row, head-by-head float64 loops over the usable keys."""
    b, h, _ = q.shape
    out = torch.zeros(b, h, 512, dtype=torch.float64)
    lse = torch.full((b, h), math.inf, dtype=torch.float64)
    for r in range(b):
        keys = []
        for j in range(idx.shape[1]):
            if idx[r, j] != -1 and (lens is None or j < lens[r]):
                keys.append(dense_main[int(idx[r, j])])
        if eidx is not None:
            for j in range(eidx.shape[1]):
                if eidx[r, j] != -1 and (elens is None or j < elens[r]):
                    keys.append(dense_extra[int(eidx[r, j])])
        if not keys:
            continue
        k = torch.stack(keys)
        for hh in range(h):
            s = (k @ q[r, hh].double()) * scale
            m = s.max()
            log_sum = m + torch.log(torch.exp(s - m).sum())
            o = (torch.exp(s - log_sum)[:, None] * k).sum(0)
            if sink is not None:
                o = o * math.exp(log_sum) / (math.exp(log_sum) + math.exp(float(sink[hh])))
            out[r, hh] = o
            lse[r, hh] = log_sum
    return out, lse


def _indices(b, width, num_tokens, gen, p_invalid=0.3):
    idx = torch.randint(0, num_tokens, (b, width), generator=gen)
    drop = torch.rand(b, width, generator=gen) < p_invalid
    return torch.where(drop, torch.full_like(idx, -1), idx).to(torch.int32)


@settings(max_examples=15, deadline=None)
@given(
    b=st.integers(1, 5),
    h=st.sampled_from([1, 4]),
    width=st.sampled_from([4, 64]),
    extra_width=st.sampled_from([None, 8, 64]),
    with_lens=st.booleans(),
    with_sink=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_decode_reference_matches_naive_loops(b, h, width, extra_width, with_lens, with_sink, seed):
    gen = torch.Generator().manual_seed(seed)
    cache, dense = _cache(150, 16, gen)
    q = torch.randn(b, h, 512, generator=gen)
    idx = _indices(b, width, 150, gen)
    lens = torch.randint(0, width + 1, (b,), generator=gen).to(torch.int32) if with_lens else None
    extra = eidx = elens = dense_e = None
    if extra_width:
        extra, dense_e = _cache(70, 2, gen)
        eidx = _indices(b, extra_width, 70, gen)
        elens = (
            torch.randint(0, extra_width + 1, (b,), generator=gen).to(torch.int32)
            if with_lens
            else None
        )
    sink = torch.randn(h, generator=gen) if with_sink else None
    scale = 512**-0.5
    out, lse = sparse_decode_reference(
        q,
        kvl.kernel_view(cache, 16),
        idx,
        lens,
        sink,
        None if extra is None else kvl.kernel_view(extra, 2),
        eidx,
        elens,
    )
    ref_o, ref_l = _naive(q, dense, idx, lens, dense_e, eidx, elens, sink, scale)
    assert out.shape == (b, 1, h, 512) and lse.shape == (b, h, 1)
    torch.testing.assert_close(out[:, 0].double(), ref_o, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse[:, :, 0].double(), ref_l, rtol=1e-5, atol=1e-6)


def test_lonely_rows_and_sink_limits():
    gen = torch.Generator().manual_seed(0)
    cache, _ = _cache(64, 64, gen)
    view = kvl.kernel_view(cache, 64)
    q = torch.randn(3, 2, 512, generator=gen)
    idx = torch.tensor([[-1] * 64, list(range(64)), list(range(64))], dtype=torch.int32)
    lens = torch.tensor([64, 0, 64], dtype=torch.int32)
    out, lse = sparse_decode_reference(q, view, idx, lens, torch.zeros(2))
    # row 0 has only -1, row 1 has length 0: both lonely -> 0 output, +inf lse
    assert torch.equal(out[:2], torch.zeros_like(out[:2]))
    assert torch.isposinf(lse[:2]).all()
    assert torch.isfinite(lse[2]).all()
    o_none, l_none = sparse_decode_reference(q, view, idx, lens, None)
    o_neg, _ = sparse_decode_reference(q, view, idx, lens, torch.full((2,), -math.inf))
    o_pos, _ = sparse_decode_reference(q, view, idx, lens, torch.full((2,), math.inf))
    torch.testing.assert_close(o_neg, o_none)  # -inf sink: no effect
    assert torch.equal(o_pos, torch.zeros_like(o_pos))  # +inf sink: output 0
    assert torch.equal(l_none, lse)  # the sink never changes lse
    # with sink 0: out = softmax-out * sigmoid(lse)
    torch.testing.assert_close(out[2], o_none[2] * torch.sigmoid(lse[2, :, 0]).view(1, 2, 1))


def test_decode_rejects_out_of_range_indices():
    gen = torch.Generator().manual_seed(0)
    cache, _ = _cache(64, 64, gen)
    with pytest.raises(IndexError):
        sparse_decode_reference(
            torch.randn(1, 1, 512),
            kvl.kernel_view(cache, 64),
            torch.tensor([[64]], dtype=torch.int32),
        )
    with pytest.raises(IndexError):
        sparse_decode_reference(
            torch.randn(1, 1, 512),
            kvl.kernel_view(cache, 64),
            torch.tensor([[-2]], dtype=torch.int32),
        )


@settings(max_examples=15, deadline=None)
@given(
    s_q=st.integers(1, 6),
    h=st.sampled_from([1, 3]),
    topk=st.sampled_from([5, 32]),
    with_lens=st.booleans(),
    with_sink=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_prefill_reference_matches_naive_loops(s_q, h, topk, with_lens, with_sink, seed):
    gen = torch.Generator().manual_seed(seed)
    s_kv = 40
    kv = (torch.randn(s_kv, 1, 512, generator=gen) * 0.5).to(torch.bfloat16)
    q = torch.randn(s_q, h, 512, generator=gen).to(torch.bfloat16)
    idx = torch.randint(-3, s_kv + 5, (s_q, topk), generator=gen).to(
        torch.int32
    )  # <0 and >= s_kv invalid
    lens = torch.randint(0, topk + 1, (s_q,), generator=gen).to(torch.int32) if with_lens else None
    sink = torch.randn(h, generator=gen) if with_sink else None
    out, mx, lse = flash_mla_sparse_fwd_reference(
        q, kv, idx.unsqueeze(1), 0.1, 512, sink, lens, return_log2_lse=None
    )
    valid = (idx >= 0) & (idx < s_kv)
    naive_idx = torch.where(valid, idx, torch.full_like(idx, -1))
    ref_o, ref_l = _naive(q, kv[:, 0].double(), naive_idx, lens, None, None, None, sink, 0.1)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref_o, rtol=1e-2, atol=1e-2)  # output rounded to bf16
    torch.testing.assert_close(lse.double(), ref_l, rtol=1e-5, atol=1e-6)
    _, mx2, lse2 = flash_mla_sparse_fwd_reference(
        q, kv, idx.unsqueeze(1), 0.1, 512, sink, lens, return_log2_lse=True
    )
    fin = torch.isfinite(lse)
    torch.testing.assert_close(lse2[fin], lse[fin] / math.log(2.0))
    assert (
        flash_mla_sparse_fwd_reference(
            q, kv, idx.unsqueeze(1), 0.1, 512, sink, lens, return_log2_lse=False
        )[1]
        is None
    )


def test_prefill_over_dequantized_workspace_equals_decode_over_cache():
    """The unsplit/split identity in reference form: same keys, two encodings, same answer."""
    gen = torch.Generator().manual_seed(3)
    cache, _ = _cache(200, 64, gen)
    q = torch.randn(4, 8, 512, generator=gen)
    idx = _indices(4, 64, 200, gen)
    lens = torch.tensor([64, 10, 0, 33], dtype=torch.int32)
    sink = torch.randn(8, generator=gen)
    o_dec, l_dec = sparse_decode_reference(q, kvl.kernel_view(cache, 64), idx, lens, sink)
    # workspace: dequantize the used tokens, rebase the indices
    used = torch.unique(idx[idx >= 0])
    ws = kvl.dequantize_tokens(cache, 64, used, dtype=torch.bfloat16).unsqueeze(1)
    remap = torch.full((200,), -1, dtype=torch.int64)
    remap[used] = torch.arange(used.numel())
    ws_idx = torch.where(
        idx >= 0, remap[idx.clamp_min(0).long()], torch.full_like(idx, -1, dtype=torch.int64)
    ).to(torch.int32)
    o_pre, _, l_pre = flash_mla_sparse_fwd_reference(
        q.to(torch.bfloat16).float(), ws, ws_idx.unsqueeze(1), 512**-0.5, 512, sink, lens
    )
    o_dec2, l_dec2 = sparse_decode_reference(
        q.to(torch.bfloat16).float(), kvl.kernel_view(cache, 64), idx, lens, sink
    )
    torch.testing.assert_close(
        o_pre.float(), o_dec2[:, 0].to(torch.bfloat16).float(), rtol=0, atol=0
    )
    torch.testing.assert_close(l_pre, l_dec2[:, :, 0])


def test_reference_sched_meta_binds_shape():
    gen = torch.Generator().manual_seed(0)
    cache, _ = _cache(64, 64, gen)
    view = kvl.kernel_view(cache, 64)
    meta = ReferenceSchedMeta()
    idx = torch.zeros(2, 1, 64, dtype=torch.int32)
    q = torch.randn(2, 1, 4, 512).to(torch.bfloat16)
    out, lse = flash_mla_with_kvcache_reference(
        q, view, None, None, 512, meta, indices=idx, is_fp8_kvcache=True
    )
    assert out.shape == (2, 1, 4, 512) and out.dtype == torch.bfloat16 and lse.shape == (2, 4, 1)
    flash_mla_with_kvcache_reference(
        q, view, None, None, 512, meta, indices=idx
    )  # same shape: fine
    with pytest.raises(AssertionError):
        flash_mla_with_kvcache_reference(q[:1], view, None, None, 512, meta, indices=idx[:1])
