"""Torch references of the GPU leaf kernels on DSV4's sparse-prefill path (no sglang imports).

CPU tests of the mixed split run upstream's ``DeepseekV4AttnBackend`` code with its Triton and
CUDA leaf kernels replaced by these functions (same call signatures, same results, plain torch).
Each was written from the upstream docstring and kernel contract named below (read, not copied):

* :func:`build_swa_token_ids` - ``sglang.kernels.ops.attention.dsv4.sparse_prefill_kernels``
  ``build_swa_token_ids``: per request the SWA-cache ids of positions
  ``[seq - min(seq, ext + W - 1), seq)`` through ``req_to_token`` then ``full_to_swa``;
* :func:`combine_topk_swa_indices` - same module, ``combine_topk_swa_indices`` (kernel
  ``_combine_topk_swa_indices_kernel``): per query row
  ``[top-k rebased by compressed_base | SWA window rebased by swa_base | -1 pad]``, row width
  ``ceil(topk + W, 128)``, length ``topk_len + swa_len``; rows past the last request are -1 / 0;
* :func:`dequantize_k_cache_paged_dsv4` - ``sglang.kernels.ops.attention.dsv4.dequant_k_cache``
  ``dequantize_k_cache_paged_dsv4`` (V4 584-byte layout only), via
  :mod:`sglang_mixgraph.reference.v4_kv_layout`;
* :func:`gather_dequant_requant_fp8_paged_dsv4` - same module, same name: dequantize the nope part,
  cast nope and rope to e4m3, ``extra_rows`` zero rows appended;
* :func:`cast_q_fp8_for_q8kv8_prefill` and :func:`sparse_mla_q8kv8_prefill_fwd` -
  same names in ``sglang.kernels.ops.attention.sparse_mla_q8kv8_prefill_sm90``: q cast to e4m3
  into a zero-padded 64/128-head tensor; fp8 sparse MLA with sink, scores scaled by
  ``sm_scale * q_scale * kv_scale``. The reference treats every in-range index (including the
  zero "landing pad" row the backend maps -1 to) as a key and masks out-of-range ones, like
  :func:`sparse_mla.sparse_prefill_reference`.
"""

from __future__ import annotations

import torch

from . import v4_kv_layout as kvl
from .sparse_mla import sparse_prefill_reference

SPARSE_PREFILL_TOPK_ALIGNMENT = 128
FP8 = torch.float8_e4m3fn


def combined_topk_width(topk: int, window_size: int) -> int:
    a = SPARSE_PREFILL_TOPK_ALIGNMENT
    return -(-(topk + window_size) // a) * a


def build_swa_token_ids(
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    full_to_swa: torch.Tensor,
    swa_window: int,
    total_swa: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    device = seq_lens.device
    gather_lens = torch.minimum(seq_lens, extend_seq_lens + (swa_window - 1)).to(torch.int32)
    first_pos = (seq_lens - gather_lens).to(torch.int32)
    offsets = torch.zeros(seq_lens.shape[0] + 1, dtype=torch.int32, device=device)
    offsets[1:] = torch.cumsum(gather_lens, 0).to(torch.int32)
    ids = torch.empty(total_swa, dtype=torch.int32, device=device)
    for r in range(seq_lens.shape[0]):
        n = int(gather_lens[r])
        if n == 0:
            continue
        start, base = int(first_pos[r]), int(offsets[r])
        full = req_to_token[int(req_pool_indices[r]), start : start + n].to(torch.int64)
        ids[base : base + n] = full_to_swa[full].to(torch.int32)
    return ids, first_pos, gather_lens, offsets


def combine_topk_swa_indices(
    topk_indices: torch.Tensor,
    query_start_loc: torch.Tensor,
    query_pos: torch.Tensor,
    seq_lens: torch.Tensor,
    gather_lens: torch.Tensor,
    compressed_base: torch.Tensor,
    swa_base: torch.Tensor,
    window_size: int,
    compress_ratio: int,
    topk: int,
    out_indices: torch.Tensor | None = None,
    out_lens: torch.Tensor | None = None,
    swa_indices: torch.Tensor | None = None,
    swa_lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    assert compress_ratio >= 1
    num_tokens = topk_indices.shape[0]
    width = combined_topk_width(topk, window_size)
    device = topk_indices.device
    idx = (
        out_indices
        if out_indices is not None
        else torch.empty((num_tokens, width), dtype=torch.int32, device=device)
    )
    lens = (
        out_lens
        if out_lens is not None
        else torch.empty(num_tokens, dtype=torch.int32, device=device)
    )
    assert idx.shape == (num_tokens, width)
    if num_tokens == 0:
        return idx, lens
    num_reqs = seq_lens.shape[0]
    base = int(query_start_loc[0])
    qsl = [int(x) - base for x in query_start_loc.tolist()]
    rows = torch.full((num_tokens, width), -1, dtype=torch.int64)
    row_lens = torch.zeros(num_tokens, dtype=torch.int64)
    for t in range(num_tokens):
        if num_reqs == 0 or t >= qsl[num_reqs]:
            continue  # owned by no request
        b = max(r for r in range(num_reqs) if qsl[r] <= t)
        pos = int(query_pos[t])
        topk_len = min((pos + 1) // compress_ratio, topk)
        gather_start = int(seq_lens[b]) - int(gather_lens[b])
        if swa_indices is not None:
            swa_len = int(swa_lengths[t])
        else:
            swa_len = min(pos + 1, window_size)
        if topk_len:
            vals = topk_indices[t, :topk_len].to(torch.int64)
            rows[t, :topk_len] = torch.where(vals >= 0, vals + int(compressed_base[b]), -1)
        if swa_len:
            if swa_indices is not None:
                sv = swa_indices[t, :swa_len].to(torch.int64)
                rows[t, topk_len : topk_len + swa_len] = torch.where(
                    sv >= 0, sv + int(swa_base[b]), -1
                )
            else:
                start = int(swa_base[b]) + pos - swa_len + 1 - gather_start
                rows[t, topk_len : topk_len + swa_len] = torch.arange(start, start + swa_len)
        row_lens[t] = topk_len + swa_len
    idx.copy_(rows.to(torch.int32))
    lens.copy_(row_lens.to(torch.int32))
    return idx, lens


def dequantize_k_cache_paged_dsv4(
    quant_k_cache: torch.Tensor,
    page_table_1_flattened: torch.Tensor,
    page_size: int,
    out: torch.Tensor | None = None,
    layout=None,
) -> torch.Tensor:
    if layout is not None and getattr(layout, "name", str(layout)) not in ("V4", "v4"):
        raise NotImplementedError(f"reference covers the V4 584-byte layout only, got {layout}")
    cache = quant_k_cache.view(torch.uint8)
    vals = kvl.dequantize_tokens(cache, page_size, page_table_1_flattened, dtype=torch.bfloat16)
    vals = vals.view(-1, 1, kvl.HEAD_DIM)
    if out is None:
        return vals
    out.copy_(vals)
    return out


def gather_dequant_requant_fp8_paged_dsv4(
    quant_k_cache: torch.Tensor,
    page_table_1_flattened: torch.Tensor,
    page_size: int,
    extra_rows: int = 0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    cache = quant_k_cache.view(torch.uint8)
    n = page_table_1_flattened.shape[0]
    vals = kvl.dequantize_tokens(cache, page_size, page_table_1_flattened, dtype=torch.float32)
    fp8 = vals.to(FP8).view(n, 1, kvl.HEAD_DIM)
    if out is None:
        out = torch.zeros((n + extra_rows, 1, kvl.HEAD_DIM), dtype=FP8, device=cache.device)
    elif extra_rows:
        out[n:].view(torch.uint8).zero_()
    out[:n] = fp8
    return out


def q8kv8_padded_num_heads(num_heads: int) -> int:
    if num_heads <= 0 or num_heads > 128:
        raise ValueError(f"unsupported head count {num_heads}")
    return 64 if num_heads <= 64 else 128


def cast_q_fp8_for_q8kv8_prefill(
    q: torch.Tensor,
    padded_num_heads: int | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    num_tokens, num_heads, head_dim = q.shape
    padded = padded_num_heads or q8kv8_padded_num_heads(num_heads)
    if out is None:
        out = torch.zeros((num_tokens, padded, head_dim), dtype=FP8, device=q.device)
    else:
        out.view(torch.uint8)[:, num_heads:].zero_()
    out[:, :num_heads] = q.to(FP8)
    return out, torch.ones((), dtype=torch.float32, device=q.device)


def sparse_mla_q8kv8_prefill_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    q_scale: torch.Tensor,
    kv_scale: torch.Tensor,
    d_v: int = 512,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    max_logits: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if q.dtype != FP8 or kv.dtype != FP8:
        raise ValueError("q and kv must be float8_e4m3fn")
    qf = q.float() * float(q_scale)
    kvf = kv.float() * float(kv_scale)
    o, m, log_sum = sparse_prefill_reference(
        qf, kvf, indices, sm_scale, d_v, attn_sink, topk_length
    )
    o = o.to(torch.bfloat16)
    if out is not None:
        out.copy_(o)
        o = out
    return o, m, log_sum
