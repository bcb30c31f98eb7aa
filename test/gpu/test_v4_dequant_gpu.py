"""Our Triton V4 dequant kernel against the torch fallback, bit for bit."""

import pytest
import torch

from sglang_mixgraph.reference import v4_kv_layout as kvl
from sglang_mixgraph.reference.v4_dequant import dequantize_v4, triton_available

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("page_size", [2, 64, 256])
def test_triton_dequant_matches_torch(page_size):
    assert triton_available()
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(page_size)
    num_pages = (1 << 20) // page_size + 3
    cache = kvl.allocate_cache(num_pages, page_size, dev)
    # real quantized tokens (every code path of the encoder), spread over the whole pool
    n = 50_000
    slots = torch.randperm(num_pages * page_size, device=dev, generator=gen)[:n]
    x = torch.randn(n, 512, device=dev, generator=gen) * torch.exp2(
        torch.randint(-10, 10, (n, 8), device=dev, generator=gen).float()
    ).repeat_interleave(64, dim=1)
    kvl.encode_tokens(cache, page_size, slots, x)
    ref = dequantize_v4(cache, page_size, slots, force_torch=True)
    ws = torch.full((n + 100, 1, 512), float("nan"), device=dev, dtype=torch.bfloat16)
    got = dequantize_v4(cache, page_size, slots.to(torch.int32), out=ws[50 : 50 + n])
    torch.cuda.synchronize()
    assert got.data_ptr() == ws[50].data_ptr()
    assert torch.equal(got.view(torch.int16), ref.view(torch.int16))
    assert bool(torch.isnan(ws[:50]).all()) and bool(torch.isnan(ws[50 + n :]).all())
    # and the values are what was stored
    torch.testing.assert_close(got[:, 0].float(), kvl.quantize_roundtrip(x), rtol=0, atol=0)


def test_triton_dequant_large_offsets():
    """Byte offsets past 2**31 (a >2 GiB per-layer cache) must not wrap."""
    dev = "cuda"
    page_size = 64
    num_pages = (3 << 30) // kvl.page_bytes(page_size) + 1
    cache = kvl.allocate_cache(num_pages, page_size, dev)
    slots = torch.tensor(
        [0, num_pages * page_size - 1, (num_pages // 2) * page_size + 5], device=dev
    )
    x = torch.randn(3, 512, device=dev)
    kvl.encode_tokens(cache, page_size, slots, x)
    got = dequantize_v4(cache, page_size, slots)
    assert torch.equal(
        got[:, 0].view(torch.int16),
        kvl.dequantize_tokens(cache, page_size, slots, dtype=torch.bfloat16).view(torch.int16),
    )
    del cache
    torch.cuda.empty_cache()
