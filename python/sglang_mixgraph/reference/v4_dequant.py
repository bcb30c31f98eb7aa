"""Dequantize V4 584-byte paged fp8 KV tokens into a bf16 workspace (own Triton kernel).

This is the step the unsplit sparse-prefill path pays for every row of a mixed batch
(upstream: ``sglang.kernels.ops.attention.dsv4.dequant_k_cache.dequantize_k_cache_paged_dsv4``,
called by ``DeepseekV4AttnBackend._forward_prefill_sparse`` in
``sglang.srt.layers.attention.deepseek_v4_backend``). Our
kernel is written from the layout description in :mod:`sglang_mixgraph.reference.v4_kv_layout`, not
from upstream's code: one program handles ``BLOCK_T`` tokens as a ``(BLOCK_T, 512)`` tile whose
columns 0..447 come from the fp8 bytes times the per-64 ue8m0 scale and columns 448..511 from
the bf16 rope, stored with a single 512-wide store per token.

``dequantize_v4`` dispatches to Triton on CUDA tensors and to the torch dequantizer
(:func:`sglang_mixgraph.reference.v4_kv_layout.dequantize_tokens`) otherwise; ``force_torch=True``
selects the fallback explicitly (the GPU tests compare the two bit for bit).
"""

from __future__ import annotations

import os

import torch

from sglang_mixgraph.reference import v4_kv_layout as kvl

try:  # Triton is optional: CPU installs use the torch fallback.
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except Exception:  # pragma: no cover - depends on the install
    triton = None
    tl = None
    _HAVE_TRITON = False


if _HAVE_TRITON:

    @triton.jit
    def _v4_dequant_kernel(
        cache_u8,  # *u8, the whole cache as bytes
        slots,  # *i32/i64 (n,) token indices
        out,  # *bf16 (n, 512) rows with stride out_stride
        n_tokens,
        out_stride,
        page_stride,  # bytes between pages (padded page size)
        PAGE_SIZE: tl.constexpr,
        BLOCK_T: tl.constexpr,
    ):
        NOPE: tl.constexpr = 448
        DATA: tl.constexpr = 576
        SCALE_ROW: tl.constexpr = 8
        WIDTH: tl.constexpr = 512

        pid = tl.program_id(0)
        t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
        t_ok = t < n_tokens
        slot = tl.load(slots + t, mask=t_ok, other=0).to(tl.int64)
        page = slot // PAGE_SIZE
        in_page = slot - page * PAGE_SIZE
        page_base = page * page_stride
        data_base = page_base + in_page * DATA  # (BLOCK_T,)
        scale_base = page_base + PAGE_SIZE * DATA + in_page * SCALE_ROW

        col = tl.arange(0, WIDTH)
        is_nope = col < NOPE
        m_nope = t_ok[:, None] & is_nope[None, :]
        m_rope = t_ok[:, None] & (~is_nope)[None, :]

        # fp8 bytes of the nope part, reinterpreted as e4m3.
        raw = tl.load(cache_u8 + data_base[:, None] + col[None, :], mask=m_nope, other=0)
        nope = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        # The 8 scale bytes of a token (7 ue8m0 + pad) are one aligned little-endian int64
        # (page stride and 576 * PAGE_SIZE are multiples of 8): load it once per token and pick
        # byte col // 64 in registers instead of gathering a byte per column.
        cache_u64 = cache_u8.to(tl.pointer_type(tl.int64), bitcast=True)
        word = tl.load(cache_u64 + scale_base // 8, mask=t_ok, other=0)
        shift = ((col // 64) * 8).to(tl.int64)
        e = ((word[:, None] >> shift[None, :]) & 255).to(tl.int32)
        pow2 = (e << 23).to(tl.float32, bitcast=True)  # 2**(e-127) for e in 1..254
        pow2 = tl.where(e == 0, 5.877471754111438e-39, pow2)  # 2**-127 (denormal)
        pow2 = tl.where(e == 255, float("nan"), pow2)
        nope_val = nope * pow2

        # bf16 rope: bytes 448..575 of the data row, i.e. bf16 element (data_base + 448) / 2 + j.
        cache_bf16 = cache_u8.to(tl.pointer_type(tl.bfloat16), bitcast=True)
        rope_idx = (data_base[:, None] + NOPE) // 2 + (col[None, :] - NOPE)
        rope_idx = tl.where(m_rope, rope_idx, 0)
        rope_val = tl.load(cache_bf16 + rope_idx, mask=m_rope, other=0.0).to(tl.float32)

        val = tl.where(is_nope[None, :], nope_val, rope_val)
        dst = out + t.to(tl.int64)[:, None] * out_stride + col[None, :]
        tl.store(dst, val.to(tl.bfloat16), mask=t_ok[:, None])


def triton_available() -> bool:
    return _HAVE_TRITON and os.environ.get("SGLANG_MIXGRAPH_DISABLE_TRITON", "0") != "1"


def dequantize_v4(
    cache: torch.Tensor,
    page_size: int,
    slots: torch.Tensor,
    out: torch.Tensor | None = None,
    force_torch: bool = False,
    block_t: int = 8,
) -> torch.Tensor:
    """bf16 values ``(n, 1, 512)`` of the tokens at ``slots`` from a V4 cache.

    ``cache``: ``(num_pages, page_bytes)`` uint8 (the pool's buffer; a byte view of another dtype
    is accepted). ``out``: optional ``(n, 1, 512)`` bf16 destination, which may be a row slice of
    a larger workspace (rows must be 512 contiguous values; the row stride is free).
    """
    pages = kvl._as_page_rows(cache, page_size)
    slots = slots.reshape(-1)
    n = slots.numel()
    if out is None:
        out = torch.empty(n, 1, kvl.HEAD_DIM, dtype=torch.bfloat16, device=pages.device)
    if out.shape != (n, 1, kvl.HEAD_DIM) or out.dtype != torch.bfloat16:
        raise ValueError(
            f"out must be ({n}, 1, {kvl.HEAD_DIM}) bf16, got {tuple(out.shape)} {out.dtype}"
        )
    if out.stride(2) != 1:
        raise ValueError("out rows must be contiguous")
    if n == 0:
        return out
    interpret = os.environ.get("TRITON_INTERPRET") == "1"  # CPU tests of the kernel
    use_triton = (not force_torch) and triton_available() and (pages.is_cuda or interpret)
    if not use_triton:
        out[:, 0].copy_(kvl.dequantize_tokens(pages, page_size, slots, dtype=torch.bfloat16))
        return out
    if slots.dtype not in (torch.int32, torch.int64):
        slots = slots.to(torch.int64)
    slots = slots.contiguous()
    grid = (triton.cdiv(n, block_t),)
    _v4_dequant_kernel[grid](
        pages,
        slots,
        out,
        n,
        out.stride(0),
        pages.stride(0),
        PAGE_SIZE=page_size,
        BLOCK_T=block_t,
    )
    return out
