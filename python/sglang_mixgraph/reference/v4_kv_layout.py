"""DeepSeek-V4 584-byte paged fp8 KV cache: encoder and decoder (torch only, no sglang).

This is the legacy FlashMLA "V4" cache (FlashMLA calls it MODEL1_FP8Sparse) that
``flash_mla_with_kvcache(..., is_fp8_kvcache=True, use_legacy=True)`` reads on SM90 and that
sglang 0.5.23 stores for DeepSeek-V4. Layout, as read from upstream (not copied):

* one token = 448 fp8 e4m3 "nope" values + 64 bf16 "rope" values (576 data bytes)
  + 7 ue8m0 scale bytes (one per 64 nope values) + 1 pad byte = 584 bytes;
  sglang asserts ``448 + 64*2 + 8 == 584`` in
  ``sglang.srt.mem_cache.deepseek_v4_memory_pool.DeepSeekV4SingleKVPool.create_buffer``;
* a page holds ``page_size`` data rows of 576 bytes first, then ``page_size`` scale rows of
  8 bytes, and the page stride is rounded up to a multiple of 576 bytes (the kernel's TMA row
  stride): ``sglang.kernels.ops.attention.dsv4.kv_layout.KVLayout`` (``page_bytes``) and the
  layout comment at the top of ``sglang.kernels.ops.attention.dsv4.dequant_k_cache``;
* a token index is ``page * page_size + slot`` (the ``indices_in_kvcache`` note in the
  docstring of FlashMLA's ``flash_mla_interface.flash_mla_with_kvcache``);
* the scale byte ``e`` stands for ``2 ** (e - 127)`` (ue8m0, as ``torch.float8_e8m0fnu``:
  byte 0 is ``2 ** -127``, byte 255 is NaN); the writer picks the smallest power of two
  ``>= amax / 448`` per 64-value tile
  (``sglang.kernels.ops.kvcache.triton_store_cache._triton_fused_store_flashmla_kernel``);
* the kernel gets the cache as a ``(num_pages, page_size, 1, 584)`` uint8 view whose page
  stride is the padded page size (``DeepseekV4AttnBackend._forward_attention`` in
  ``sglang.srt.layers.attention.deepseek_v4_backend``); :func:`kernel_view` builds that view.

Everything here is plain torch and runs on CPU or GPU. The GPU fast path for dequantizing
into a workspace is :mod:`sglang_mixgraph.reference.v4_dequant`, which is checked against
:func:`dequantize_tokens` here.
"""

from __future__ import annotations

import torch

NOPE_DIM = 448
ROPE_DIM = 64
HEAD_DIM = NOPE_DIM + ROPE_DIM  # 512
TILE_SIZE = 64
NUM_TILES = NOPE_DIM // TILE_SIZE  # 7
DATA_BYTES = NOPE_DIM + 2 * ROPE_DIM  # 576: fp8 nope then bf16 rope
SCALE_BYTES = NUM_TILES + 1  # 8: 7 ue8m0 scales + 1 pad byte
BYTES_PER_TOKEN = DATA_BYTES + SCALE_BYTES  # 584
PAGE_ALIGN = 576
FP8_MAX = 448.0
UE8M0_BIAS = 127
# Smallest amax we quantize against; an all-zero tile gets the scale of this value.
AMAX_EPS = 1e-8

FP8_DTYPE = torch.float8_e4m3fn


def page_bytes(page_size: int) -> int:
    """Bytes of one page, rounded up to the 576-byte row stride the kernel requires."""
    if page_size <= 0:
        raise ValueError(f"page_size must be positive, got {page_size}")
    raw = page_size * BYTES_PER_TOKEN
    return -(-raw // PAGE_ALIGN) * PAGE_ALIGN


def allocate_cache(
    num_pages: int, page_size: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """A zeroed ``(num_pages, page_bytes(page_size))`` uint8 cache, the shape sglang allocates."""
    return torch.zeros(num_pages, page_bytes(page_size), dtype=torch.uint8, device=device)


def kernel_view(cache: torch.Tensor, page_size: int) -> torch.Tensor:
    """The ``(num_pages, page_size, 1, 584)`` uint8 view FlashMLA detects the V4 format from.

    The page stride stays the padded page size; only the first ``page_size * 584`` bytes of a
    page are covered by the view, as in sglang's backend.
    """
    pages = _as_page_rows(cache, page_size)
    return pages[:, : page_size * BYTES_PER_TOKEN].view(
        pages.shape[0], page_size, 1, BYTES_PER_TOKEN
    )


def _as_page_rows(cache: torch.Tensor, page_size: int) -> torch.Tensor:
    if cache.dtype != torch.uint8:
        cache = cache.view(torch.uint8)
    if cache.dim() != 2:
        raise ValueError(
            f"expected a (num_pages, page_bytes) cache, got shape {tuple(cache.shape)}"
        )
    if cache.shape[1] < page_size * BYTES_PER_TOKEN:
        raise ValueError(f"a page of {cache.shape[1]} bytes cannot hold {page_size} V4 tokens")
    if cache.stride(1) != 1:
        raise ValueError("cache pages must be contiguous along the byte dimension")
    return cache


def page_views(cache: torch.Tensor, page_size: int):
    """Structured views of every page: ``(nope u8 (P, S, 448), rope bf16 (P, S, 64), scales u8 (P, S, 8))``.

    ``nope`` holds the e4m3 bytes, ``scales`` the 7 ue8m0 bytes and the pad byte of each token.
    The views alias the cache, so writing through them writes the cache.
    """
    pages = _as_page_rows(cache, page_size)
    n = pages.shape[0]
    data = pages[:, : page_size * DATA_BYTES].unflatten(1, (page_size, DATA_BYTES))
    scales = pages[:, page_size * DATA_BYTES : page_size * BYTES_PER_TOKEN].unflatten(
        1, (page_size, SCALE_BYTES)
    )
    nope = data[:, :, :NOPE_DIM]
    rope = data[:, :, NOPE_DIM:].view(torch.bfloat16)
    assert rope.shape == (n, page_size, ROPE_DIM)
    return nope, rope, scales


def pages_from_kernel_view(k_cache: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Inverse of :func:`kernel_view`: ``(pages (num_pages, page_stride) uint8, page_size)``.

    Rebuilds the padded page rows over the same storage, so the scale rows that follow the data
    rows of a page are reachable. Needs the storage behind the view to hold whole padded pages
    (true for every cache allocated as ``(num_pages, page_bytes)``).
    """
    if k_cache.dim() != 4 or k_cache.shape[2] != 1 or k_cache.shape[3] != BYTES_PER_TOKEN:
        raise ValueError(
            f"expected a (num_pages, page_size, 1, {BYTES_PER_TOKEN}) view, got {tuple(k_cache.shape)}"
        )
    u8 = k_cache.view(torch.uint8) if k_cache.dtype != torch.uint8 else k_cache
    num_pages, page_size = u8.shape[0], u8.shape[1]
    stride = u8.stride(0) if num_pages > 1 else page_bytes(page_size)
    if stride < page_size * BYTES_PER_TOKEN:
        raise ValueError(
            f"page stride {stride} is smaller than a page's {page_size * BYTES_PER_TOKEN} bytes"
        )
    needed = u8.storage_offset() + num_pages * stride
    if u8.untyped_storage().nbytes() < needed:
        raise ValueError("the storage behind the view does not hold whole padded pages")
    pages = torch.as_strided(u8, (num_pages, stride), (stride, 1))
    return pages, page_size


# --------------------------------------------------------------------------------------------
# quantization (token values -> bytes)
# --------------------------------------------------------------------------------------------


def quantize_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize ``x`` ``(n, 512)`` into ``(nope fp8 (n, 448), rope bf16 (n, 64), scale bytes (n, 7))``.

    Per 64-value tile: exponent ``e = ceil(log2(max(amax, eps) / 448))``, stored byte
    ``e + 127``, values ``x / 2**e`` cast to e4m3 (saturating to +-448).
    """
    if x.dim() != 2 or x.shape[1] != HEAD_DIM:
        raise ValueError(f"expected (n, {HEAD_DIM}) values, got {tuple(x.shape)}")
    xf = x.float()
    nope = xf[:, :NOPE_DIM].reshape(-1, NUM_TILES, TILE_SIZE)
    amax = nope.abs().amax(dim=-1).clamp_min(AMAX_EPS)
    exponent = torch.ceil(torch.log2(amax / FP8_MAX))
    exponent = exponent.clamp(-UE8M0_BIAS, UE8M0_BIAS)
    scaled = nope * torch.exp2(-exponent).unsqueeze(-1)
    nope_fp8 = scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).reshape(-1, NOPE_DIM)
    scale_bytes = (exponent.to(torch.int32) + UE8M0_BIAS).to(torch.uint8)
    rope = x[:, NOPE_DIM:].to(torch.bfloat16)
    return nope_fp8, rope, scale_bytes


def ue8m0_to_float(scale_bytes: torch.Tensor) -> torch.Tensor:
    """ue8m0 byte -> float32 power of two (0 -> 2**-127, 255 -> NaN)."""
    e = scale_bytes.to(torch.int32)
    out = torch.ldexp(torch.ones_like(e, dtype=torch.float32), e - UE8M0_BIAS)
    return torch.where(e == 255, torch.full_like(out, float("nan")), out)


def _check_slots(slots: torch.Tensor, num_pages: int, page_size: int) -> None:
    if slots.numel() == 0:
        return
    lo, hi = int(slots.min()), int(slots.max())
    if lo < 0 or hi >= num_pages * page_size:
        raise IndexError(
            f"token index out of range [0, {num_pages * page_size}): min {lo}, max {hi}"
        )


def encode_tokens(
    cache: torch.Tensor, page_size: int, slots: torch.Tensor, x: torch.Tensor
) -> None:
    """Quantize ``x`` ``(n, 512)`` and write it into ``cache`` at token indices ``slots`` ``(n,)``.

    ``cache`` is the ``(num_pages, page_bytes)`` uint8 buffer (or any same-storage view of it).
    The pad byte of each scale row is written as 0. Slots must be distinct.
    """
    pages = _as_page_rows(cache, page_size)
    slots = slots.reshape(-1).to(device=pages.device, dtype=torch.int64)
    if slots.numel() != x.shape[0]:
        raise ValueError(f"{slots.numel()} slots for {x.shape[0]} tokens")
    _check_slots(slots, pages.shape[0], page_size)
    if slots.numel() == 0:
        return
    nope_fp8, rope, scale_bytes = quantize_tokens(x.to(pages.device))
    write_quantized(pages, page_size, slots, nope_fp8, rope, scale_bytes)


def write_quantized(
    cache: torch.Tensor,
    page_size: int,
    slots: torch.Tensor,
    nope_fp8: torch.Tensor,
    rope_bf16: torch.Tensor,
    scale_bytes: torch.Tensor,
) -> None:
    """Write already-quantized parts at ``slots`` (the byte placement of sglang's V4 store)."""
    nope_v, rope_v, scale_v = page_views(cache, page_size)
    slots = slots.reshape(-1).to(device=nope_v.device, dtype=torch.int64)
    page = torch.div(slots, page_size, rounding_mode="floor")
    in_page = slots - page * page_size
    n = slots.numel()
    nope_v[page, in_page] = nope_fp8.reshape(n, NOPE_DIM).view(torch.uint8)
    rope_v[page, in_page] = rope_bf16.reshape(n, ROPE_DIM).to(torch.bfloat16)
    scales = torch.zeros(n, SCALE_BYTES, dtype=torch.uint8, device=nope_v.device)
    scales[:, :NUM_TILES] = scale_bytes.reshape(n, NUM_TILES)
    scale_v[page, in_page] = scales


# --------------------------------------------------------------------------------------------
# dequantization (bytes -> token values)
# --------------------------------------------------------------------------------------------


def read_quantized(
    cache: torch.Tensor, page_size: int, slots: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The raw parts at ``slots``: ``(nope fp8 (n, 448), rope bf16 (n, 64), scale bytes (n, 7))``."""
    nope_v, rope_v, scale_v = page_views(cache, page_size)
    slots = slots.reshape(-1).to(device=nope_v.device, dtype=torch.int64)
    _check_slots(slots, nope_v.shape[0], page_size)
    page = torch.div(slots, page_size, rounding_mode="floor")
    in_page = slots - page * page_size
    nope = nope_v[page, in_page].view(FP8_DTYPE)
    rope = rope_v[page, in_page]
    scales = scale_v[page, in_page][:, :NUM_TILES]
    return nope, rope, scales


def dequantize_tokens(
    cache: torch.Tensor,
    page_size: int,
    slots: torch.Tensor,
    dtype: torch.dtype = torch.float32,
    chunk: int = 1 << 16,
) -> torch.Tensor:
    """Token values ``(n, 512)`` at token indices ``slots`` (the torch dequantizer).

    ``nope = fp8 * 2**(scale - 127)`` per 64-value tile, ``rope`` is the stored bf16. The
    product of an e4m3 value and a power of two is exact in float32 and in bfloat16 (barring
    underflow), so ``dtype=torch.bfloat16`` gives the bf16 workspace bit-exactly.
    """
    slots = slots.reshape(-1)
    pages = _as_page_rows(cache, page_size)
    out = torch.empty(slots.numel(), HEAD_DIM, dtype=dtype, device=pages.device)
    for start in range(0, slots.numel(), chunk):
        part = slots[start : start + chunk]
        nope, rope, scales = read_quantized(pages, page_size, part)
        vals = nope.float().view(-1, NUM_TILES, TILE_SIZE) * ue8m0_to_float(scales).unsqueeze(-1)
        out[start : start + part.numel(), :NOPE_DIM] = vals.reshape(-1, NOPE_DIM).to(dtype)
        out[start : start + part.numel(), NOPE_DIM:] = rope.to(dtype)
    return out


def dequantize_kernel_view(
    k_cache: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """:func:`dequantize_tokens` for a cache given as the kernel's 4-D view."""
    pages, page_size = pages_from_kernel_view(k_cache)
    return dequantize_tokens(pages, page_size, slots, dtype=dtype)


def quantize_roundtrip(x: torch.Tensor) -> torch.Tensor:
    """What a value reads back as after a store and a load, ``(n, 512)`` float32."""
    nope, rope, scales = quantize_tokens(x)
    vals = nope.float().view(-1, NUM_TILES, TILE_SIZE) * ue8m0_to_float(scales).unsqueeze(-1)
    return torch.cat([vals.reshape(-1, NOPE_DIM), rope.float()], dim=1)
