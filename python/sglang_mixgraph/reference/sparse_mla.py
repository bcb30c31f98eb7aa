"""Torch reference of FlashMLA's sparse MLA attention with attention sink (fp32 math, no sglang).

Two entry points with the same call signatures as the FlashMLA functions they stand in for, so
a caller can inject either one:

* :func:`flash_mla_with_kvcache_reference` for ``flash_mla.flash_mla_with_kvcache(...,
  indices=..., is_fp8_kvcache=True)``: sparse decode over the V4 584-byte paged fp8 cache,
  main (SWA) indices plus optional extra (compressed) cache and indices;
* :func:`flash_mla_sparse_fwd_reference` for ``flash_mla.flash_mla_sparse_fwd``: sparse
  prefill over a bf16 workspace ``kv (s_kv, 1, 512)``.

The math, as documented in the installed FlashMLA wheel (the docstrings of
``flash_mla.flash_mla_interface.flash_mla_with_kvcache`` and ``flash_mla_sparse_fwd``) and
FlashMLA's ``tests/ref.py`` (read, not copied):

* ``score = (q . k) * softmax_scale`` with ``softmax_scale`` defaulting to ``512 ** -0.5``;
  the value vector is the whole 512-dim key (``head_dim_v == 512``, MLA absorbed);
* a key position ``j`` of a row is used iff its index is valid and ``j < topk_length[row]``;
  decode treats exactly ``-1`` as invalid (other out-of-range indices are a caller bug; the
  reference raises), prefill treats ``< 0`` and ``>= s_kv`` as invalid;
* the decode kernel attends to the union of the main and the extra keys in one softmax;
* ``lse = logsumexp(scores)`` over the used keys; the output is ``softmax @ v`` multiplied by
  ``exp(lse) / (exp(lse) + exp(attn_sink[h]))`` (the sink does not change ``lse``);
* a row with no usable key ("lonely") outputs 0 and reports ``lse = +inf``.

Return layouts follow the kernels: decode ``out (b, s_q, h_q, 512)`` bf16 and ``lse (b, h_q, s_q)``
fp32; prefill ``(out (s_q, h_q, 512) bf16, max_logits (s_q, h_q), lse (s_q, h_q))``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from . import v4_kv_layout as kvl

HEAD_DIM_V = kvl.HEAD_DIM


@dataclasses.dataclass
class ReferenceSchedMeta:
    """Stand-in for ``flash_mla.FlashMLASchedMeta`` on CPU.

    Binds the call shape on first use and refuses a different shape later, as the real object
    does (``flash_mla.flash_mla_interface.flash_mla_with_kvcache``). Its "schedule" tensor
    holds the per-row key counts it was made for (FlashMLA's split-KV scheduler divides the
    work by ``topk_length`` / ``extra_topk_length``, and a reuse with other counts silently
    runs the stale schedule); a reuse with other counts raises, so CPU tests catch both kinds
    of metadata reuse bug.
    """

    have_initialized: bool = False
    config: tuple | None = None
    tile_scheduler_metadata: torch.Tensor | None = None
    num_splits: torch.Tensor | None = None


def _bind_sched_meta(meta: Any, key: tuple) -> None:
    if meta is None:
        raise ValueError("tile_scheduler_metadata is required")
    if not getattr(meta, "have_initialized", False):
        meta.have_initialized = True
        if isinstance(meta, ReferenceSchedMeta) or getattr(meta, "config", None) is None:
            meta.config = key
        meta._reference_key = key
        return
    bound = getattr(meta, "_reference_key", None)
    if bound is None and isinstance(getattr(meta, "config", None), tuple):
        bound = meta.config
    if bound is not None and bound != key:
        raise AssertionError(
            f"scheduling metadata bound to {bound} reused with {key}; one object per shape"
        )


def _key_counts(rows, device, topk, topk_length, extra_topk, extra_length) -> torch.Tensor:
    """Each row's main and extra key counts, the values FlashMLA's scheduler splits work by."""

    def counts(length, width):
        if length is not None:
            return length.reshape(-1).to(device=device, dtype=torch.int32)
        return torch.full((rows,), width or 0, dtype=torch.int32, device=device)

    return torch.stack([counts(topk_length, topk), counts(extra_length, extra_topk)], 1)


def _schedule(meta: Any, counts: torch.Tensor) -> None:
    """Makes the schedule on first use (into the object's tensors, as the kernel does when it
    gets none); a later call must come with the counts it was made for."""
    made = getattr(meta, "tile_scheduler_metadata", None)
    if made is None:
        meta.tile_scheduler_metadata = counts.clone()
        meta.num_splits = torch.zeros(counts.shape[0] + 1, dtype=torch.int32, device=counts.device)
        return
    if not torch.equal(made, counts):
        raise AssertionError(
            "scheduling metadata made for other key counts reused: FlashMLA would run the "
            "stale split-KV schedule (its topk_length / extra_topk_length contract)"
        )


def _scope_keys(
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather ``(rows, topk, 512)`` fp32 keys and a ``(rows, topk)`` usable mask for one cache."""
    pages, page_size = kvl.pages_from_kernel_view(k_cache)
    rows, topk = indices.shape
    idx = indices.to(torch.int64)
    num_tokens = pages.shape[0] * page_size
    bad = (idx < -1) | (idx >= num_tokens)
    if bool(bad.any()):
        raise IndexError(
            "decode indices must be -1 or inside the cache "
            f"[0, {num_tokens}); got min {int(idx.min())}, max {int(idx.max())}"
        )
    usable = idx != -1
    if topk_length is not None:
        pos = torch.arange(topk, device=idx.device)
        usable &= pos[None, :] < topk_length.to(idx.device).reshape(rows, 1)
    safe = torch.where(usable, idx, torch.zeros_like(idx))
    keys = kvl.dequantize_tokens(pages, page_size, safe.reshape(-1)).view(rows, topk, kvl.HEAD_DIM)
    keys = torch.where(usable[..., None], keys, torch.zeros_like(keys))
    return keys, usable


def _attend(
    q: torch.Tensor,
    keys: torch.Tensor,
    usable: torch.Tensor,
    scale: float,
    attn_sink: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q ``(rows, h, 512)``, keys ``(rows, K, 512)`` -> out fp32, max_logits, lse (rows, h)."""
    qf = q.float()
    scores = torch.einsum("rhd,rkd->rhk", qf, keys) * scale
    scores = scores.masked_fill(~usable[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    max_logits = (
        scores.amax(dim=-1) if scores.shape[-1] > 0 else torch.full_like(lse, float("-inf"))
    )
    lonely = torch.isneginf(lse)
    safe_lse = torch.where(lonely, torch.zeros_like(lse), lse)
    probs = torch.exp(scores - safe_lse[..., None])
    probs = probs.masked_fill(~usable[:, None, :], 0.0)
    out = torch.einsum("rhk,rkd->rhd", probs, keys[..., :HEAD_DIM_V])
    if attn_sink is not None:
        sink = attn_sink.float().to(out.device).view(1, -1)
        # exp(lse) / (exp(lse) + exp(sink)) == sigmoid(lse - sink); +inf sink -> 0, -inf -> 1.
        out = out * torch.sigmoid(safe_lse - sink)[..., None]
    out = torch.where(lonely[..., None], torch.zeros_like(out), out)
    lse = torch.where(lonely, torch.full_like(lse, float("inf")), lse)
    return out, max_logits, lse


def sparse_decode_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    row_chunk: int = 16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse decode over V4 fp8 caches; returns fp32 ``out (b, s_q, h, 512)``, ``lse (b, h, s_q)``.

    ``k_cache``/``extra_k_cache`` are kernel views ``(pages, page_size, 1, 584)``; ``indices``
    is ``(b, s_q, topk)`` (or ``(b, topk)``), ``topk_length`` ``(b,)``.
    """
    if q.dim() == 3:
        q = q.unsqueeze(1)
    b, s_q, h_q, d = q.shape
    if d != kvl.HEAD_DIM:
        raise ValueError(f"head dim must be {kvl.HEAD_DIM}, got {d}")
    if indices.dim() == 2:
        indices = indices.unsqueeze(1)
    if (extra_k_cache is None) != (extra_indices is None):
        raise ValueError("extra_k_cache and extra_indices come together")
    if extra_indices is not None and extra_indices.dim() == 2:
        extra_indices = extra_indices.unsqueeze(1)
    scale = softmax_scale if softmax_scale is not None else d**-0.5
    out = torch.empty(b, s_q, h_q, HEAD_DIM_V, dtype=torch.float32, device=q.device)
    lse = torch.empty(b, h_q, s_q, dtype=torch.float32, device=q.device)
    for start in range(0, b, row_chunk):
        stop = min(b, start + row_chunk)
        for s in range(s_q):
            tl_main = None if topk_length is None else topk_length[start:stop]
            keys, usable = _scope_keys(k_cache, indices[start:stop, s], tl_main)
            if extra_k_cache is not None:
                tl_extra = None if extra_topk_length is None else extra_topk_length[start:stop]
                k2, u2 = _scope_keys(extra_k_cache, extra_indices[start:stop, s], tl_extra)
                keys = torch.cat([keys, k2], dim=1)
                usable = torch.cat([usable, u2], dim=1)
            o, _, log_sum = _attend(q[start:stop, s], keys, usable, scale, attn_sink)
            out[start:stop, s] = o
            lse[start:stop, :, s] = log_sum
            del keys, usable
    return out, lse


def flash_mla_with_kvcache_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None,
    head_dim_v: int,
    tile_scheduler_metadata: Any,
    num_splits: None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    is_fp8_kvcache: bool | None = None,
    indices: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices_in_kvcache: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    **_ignored: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for ``flash_mla.flash_mla_with_kvcache`` (sparse fp8 V4 path only).

    Checks the same call contract the kernel asserts (sparse needs indices, no causal, fp8,
    ``head_dim_v == 512``) and binds ``tile_scheduler_metadata`` to the call shape.
    """
    if indices is None:
        raise ValueError("the reference covers sparse decoding only: indices are required")
    if causal:
        raise ValueError("causal must be False for sparse decoding")
    if is_fp8_kvcache is False:
        raise ValueError("sparse decoding reads an fp8 cache")
    if head_dim_v != HEAD_DIM_V:
        raise ValueError(f"head_dim_v must be {HEAD_DIM_V}")
    if num_splits is not None:
        raise ValueError("num_splits must be None")
    q4 = q.unsqueeze(1) if q.dim() == 3 else q
    idx3 = indices.unsqueeze(1) if indices.dim() == 2 else indices
    extra_topk = None
    extra_page = None
    if extra_indices_in_kvcache is not None:
        extra_topk = extra_indices_in_kvcache.shape[-1]
        extra_page = extra_k_cache.shape[1]
    key = (
        q4.shape[0],
        q4.shape[1],
        q4.shape[2],
        k_cache.shape[1],
        k_cache.shape[2],
        idx3.shape[-1],
        extra_page,
        extra_topk,
    )
    _bind_sched_meta(tile_scheduler_metadata, key)
    _schedule(
        tile_scheduler_metadata,
        _key_counts(
            q4.shape[0], q4.device, idx3.shape[-1], topk_length, extra_topk, extra_topk_length
        ),
    )
    out, lse = sparse_decode_reference(
        q4,
        k_cache,
        idx3,
        topk_length,
        attn_sink,
        extra_k_cache,
        extra_indices_in_kvcache,
        extra_topk_length,
        softmax_scale,
    )
    return out.to(torch.bfloat16), lse


def sparse_prefill_reference(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = HEAD_DIM_V,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    row_chunk: int = 64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse prefill over a workspace; fp32 ``(out (s_q, h, d_v), max_logits, lse (s_q, h))``."""
    if q.dim() != 3:
        raise ValueError(f"q must be (s_q, h_q, d), got {tuple(q.shape)}")
    if d_v != HEAD_DIM_V:
        raise ValueError(f"d_v must be {HEAD_DIM_V}")
    s_q, h_q, _ = q.shape
    kv2 = kv.reshape(kv.shape[0], -1)
    s_kv = kv2.shape[0]
    idx = indices.reshape(s_q, -1).to(torch.int64)
    topk = idx.shape[1]
    out = torch.empty(s_q, h_q, d_v, dtype=torch.float32, device=q.device)
    max_logits = torch.empty(s_q, h_q, dtype=torch.float32, device=q.device)
    lse = torch.empty(s_q, h_q, dtype=torch.float32, device=q.device)
    pos = torch.arange(topk, device=q.device)
    for start in range(0, s_q, row_chunk):
        stop = min(s_q, start + row_chunk)
        part = idx[start:stop]
        usable = (part >= 0) & (part < s_kv)
        if topk_length is not None:
            usable &= pos[None, :] < topk_length[start:stop].to(q.device).reshape(-1, 1)
        safe = torch.where(usable, part, torch.zeros_like(part))
        keys = kv2.index_select(0, safe.reshape(-1)).float().view(stop - start, topk, -1)
        keys = torch.where(usable[..., None], keys, torch.zeros_like(keys))
        o, m, log_sum = _attend(q[start:stop], keys, usable, sm_scale, attn_sink)
        out[start:stop], max_logits[start:stop], lse[start:stop] = o, m, log_sum
    return out, max_logits, lse


def flash_mla_sparse_fwd_reference(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = HEAD_DIM_V,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    use_legacy: bool = False,
    return_log2_lse: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Drop-in for ``flash_mla.flash_mla_sparse_fwd``: ``(out bf16, max_logits, lse)``.

    ``return_log2_lse=True`` reports both statistics in base 2 (the legacy kernel's option),
    ``False`` returns ``None`` for them.
    """
    out, max_logits, lse = sparse_prefill_reference(
        q, kv, indices, sm_scale, d_v, attn_sink, topk_length
    )
    if return_log2_lse is False:
        return out.to(torch.bfloat16), None, None
    if return_log2_lse:
        max_logits = max_logits * (1.0 / math.log(2.0))
        lse = lse * (1.0 / math.log(2.0))
    return out.to(torch.bfloat16), max_logits, lse
