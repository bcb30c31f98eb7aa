import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_mixgraph.reference import v4_kv_layout as kvl


@given(st.integers(1, 512))
def test_page_bytes_is_padded_to_576(page_size):
    pb = kvl.page_bytes(page_size)
    assert pb % 576 == 0
    assert page_size * 584 <= pb < page_size * 584 + 576


def test_token_is_584_bytes():
    assert kvl.BYTES_PER_TOKEN == 448 + 64 * 2 + 8 == 584


def _random_tokens(n, gen, spread=True):
    x = torch.randn(n, 512, generator=gen)
    if spread:  # tiles of very different magnitudes
        x = x * torch.exp2(torch.randint(-12, 12, (n, 8), generator=gen).float()).repeat_interleave(
            64, dim=1
        )
    return x


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 2, 3, 64, 256]), st.integers(1, 40), st.integers(0, 2**31 - 1))
def test_encode_decode_round_trip(page_size, n, seed):
    gen = torch.Generator().manual_seed(seed)
    num_pages = -(-(n + 5) // page_size)
    cache = kvl.allocate_cache(num_pages, page_size)
    slots = torch.randperm(num_pages * page_size, generator=gen)[:n]
    x = _random_tokens(n, gen)
    kvl.encode_tokens(cache, page_size, slots, x)
    y = kvl.dequantize_tokens(cache, page_size, slots)
    # what the stored bytes mean equals what quantization produced
    assert torch.equal(y, kvl.quantize_roundtrip(x))
    # rope is stored as bf16, exactly
    assert torch.equal(y[:, 448:], x[:, 448:].to(torch.bfloat16).float())
    # nope: e4m3 keeps 3 mantissa bits (relative step 2**-3 -> rounding error <= 2**-4 of |x|),
    # subnormals have an absolute step of 2**-9 of the tile scale
    _, _, scales = kvl.quantize_tokens(x)
    tile_scale = torch.exp2(scales.float() - 127).repeat_interleave(64, dim=1)
    err = (y[:, :448] - x[:, :448]).abs()
    assert bool((err <= x[:, :448].abs() * 2**-4 + tile_scale * 2**-10 + 1e-30).all())
    # bf16 decode is exact (fp8 value times a power of two)
    assert torch.equal(
        kvl.dequantize_tokens(cache, page_size, slots, dtype=torch.bfloat16).float(), y
    )


def test_scale_byte_is_smallest_power_of_two_covering_amax():
    x = torch.zeros(3, 512)
    x[0, :64] = 448.0  # amax/448 = 1 -> 2**0
    x[1, 64:128] = 449.0  # just over -> 2**1
    x[2, 128:192] = 448.0 / 8  # -> 2**-3
    _, _, s = kvl.quantize_tokens(x)
    assert s[0, 0].item() == 127
    assert s[1, 1].item() == 128
    assert s[2, 2].item() == 124
    assert float(kvl.ue8m0_to_float(torch.tensor([127, 130, 0, 255], dtype=torch.uint8))[1]) == 8.0
    assert float(kvl.ue8m0_to_float(torch.tensor([0], dtype=torch.uint8))[0]) == 2.0**-127
    assert torch.isnan(kvl.ue8m0_to_float(torch.tensor([255], dtype=torch.uint8))).all()


def test_bytes_land_where_the_layout_says():
    page_size = 4
    cache = kvl.allocate_cache(3, page_size)
    pb = kvl.page_bytes(page_size)
    x = torch.randn(1, 512) + 3.0
    slot = 2 * page_size + 3  # page 2, slot 3
    kvl.encode_tokens(cache, page_size, torch.tensor([slot]), x)
    nope, rope, scales = kvl.quantize_tokens(x)
    flat = cache.view(-1)
    data_at = 2 * pb + 3 * 576
    scale_at = 2 * pb + page_size * 576 + 3 * 8
    assert torch.equal(flat[data_at : data_at + 448], nope[0].view(torch.uint8))
    assert torch.equal(flat[data_at + 448 : data_at + 576], rope[0].contiguous().view(torch.uint8))
    assert torch.equal(flat[scale_at : scale_at + 7], scales[0])
    assert flat[scale_at + 7].item() == 0
    touched = torch.zeros_like(flat, dtype=torch.bool)
    touched[data_at : data_at + 576] = True
    touched[scale_at : scale_at + 8] = True
    assert int(flat[~touched].abs().sum()) == 0


def test_kernel_view_round_trips_to_pages():
    page_size = 64
    cache = kvl.allocate_cache(5, page_size)
    view = kvl.kernel_view(cache, page_size)
    assert view.shape == (5, 64, 1, 584)
    assert view.stride(0) == kvl.page_bytes(64)
    assert view.data_ptr() == cache.data_ptr()
    pages, ps = kvl.pages_from_kernel_view(view)
    assert ps == 64 and pages.shape == cache.shape and pages.data_ptr() == cache.data_ptr()
    gen = torch.Generator().manual_seed(0)
    slots = torch.tensor([0, 63, 64, 319])
    kvl.encode_tokens(cache, page_size, slots, _random_tokens(4, gen))
    assert torch.equal(
        kvl.dequantize_kernel_view(view, slots), kvl.dequantize_tokens(cache, page_size, slots)
    )


def test_out_of_range_slots_raise():
    cache = kvl.allocate_cache(2, 4)
    with pytest.raises(IndexError):
        kvl.dequantize_tokens(cache, 4, torch.tensor([8]))
    with pytest.raises(IndexError):
        kvl.encode_tokens(cache, 4, torch.tensor([-1]), torch.zeros(1, 512))


_TRITON_SCRIPT = r"""
import torch, sys
from sglang_mixgraph.reference import v4_kv_layout as kvl
from sglang_mixgraph.reference.v4_dequant import dequantize_v4
gen = torch.Generator().manual_seed(1)
for page_size in (2, 64):
    cache = kvl.allocate_cache(7, page_size)
    n = min(40, 7 * page_size)
    slots = torch.randperm(7 * page_size, generator=gen)[:n]
    x = torch.randn(n, 512, generator=gen) * torch.exp2(torch.randint(-8, 8, (n, 1), generator=gen).float())
    kvl.encode_tokens(cache, page_size, slots, x)
    ref = kvl.dequantize_tokens(cache, page_size, slots, dtype=torch.bfloat16)
    ws = torch.full((n + 6, 1, 512), float("nan"), dtype=torch.bfloat16)
    dequantize_v4(cache, page_size, slots.to(torch.int32), out=ws[3:3 + n])
    assert torch.equal(ws[3:3 + n, 0].view(torch.int16), ref.view(torch.int16)), page_size
    assert bool(torch.isnan(ws[:3]).all()) and bool(torch.isnan(ws[3 + n:]).all())
print("ok")
"""


def test_triton_kernel_matches_torch_in_interpreter():
    pytest.importorskip("triton")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.path.join(root, "python"))
    res = subprocess.run(
        [sys.executable, "-c", _TRITON_SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]
