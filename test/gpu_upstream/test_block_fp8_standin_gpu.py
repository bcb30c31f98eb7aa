"""The kit's block-FP8 linear on a GPU: quantizing straight into row-padded FP8 buffers gives the
rows that padding the bf16 activation first gave, bit for bit.

``engine_standins.torch_block_fp8_linear`` (tools/gpu-upstream/engine) runs an FP8 slice's
[128, 128]-block linears on torch's block-scaled ``scaled_mm``, whose 1x128 activation scales
need a leading dimension equal to the rows, a multiple of 4 for cuBLAS. It once padded the bf16
activation to that many rows (a fill and a copy of it per linear); ``padded_fp8_quant`` now
writes SGLang's quant kernel's output into padded buffers. The reference here is the padded path,
on the same kernels: SGLang's ``sglang_per_token_group_quant_fp8`` and cuBLAS.
"""

import pytest
import torch
import torch.nn.functional as F

from sglang_mixgraph.kits import gpu_machine

# the FP8 slice's widths: hidden 7168 into query LoRA 1536, and output LoRA 1024 back to hidden
SHAPES = [(1536, 7168), (7168, 1024)]
ROWS = [1, 6, 255, 2791, 2816]


@pytest.fixture(scope="module")
def standins():
    return gpu_machine.engine_standins()


@pytest.fixture(scope="module")
def quant():
    from sglang.kernels.ops.quantization.fp8_kernel import sglang_per_token_group_quant_fp8

    return sglang_per_token_group_quant_fp8


def _weight(n, k):
    """An FP8 checkpoint's weight: e4m3 with one float32 scale per 128 x 128 block."""
    w = torch.randn(n, k, device="cuda") * 0.05
    blocks = w.view(n // 128, 128, k // 128, 128)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-10) / 448
    q = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn).view(n, k)
    return q, scale.contiguous()


def _padded_activation_linear(x, w, w_scale, quant):
    """The earlier stand-in: the bf16 activation padded to a multiple of 4 rows, then quantized."""
    rows = x.shape[0]
    q, scale = quant(F.pad(x, (0, 0, 0, -rows % 4)).contiguous(), 128, column_major_scales=True)
    out = F.scaled_mm(
        q,
        w.t(),
        scale,
        F.ScalingType.BlockWise1x128,
        w_scale.t(),
        F.ScalingType.BlockWise128x128,
        output_dtype=x.dtype,
    )
    return out[:rows], q, scale


def _refused(**_):
    raise AssertionError("the stand-in left the linear to SGLang's choice")


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_live_rows_equal_the_padded_activations(standins, quant, monkeypatch, rows, n, k):
    monkeypatch.setattr(standins, "_torch_fp8_refused", [])
    torch.manual_seed(rows + n)
    w, w_scale = _weight(n, k)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16) * 3
    try:
        want, q_ref, scale_ref = _padded_activation_linear(x, w, w_scale, quant)
    except RuntimeError as e:  # the padded path too: no block-scaled cuBLAS on this card
        pytest.skip(f"cuBLAS refuses block-scaled scaled_mm here: {e}")
    q, scale = standins.padded_fp8_quant(x, quant)
    assert q.shape == q_ref.shape and scale.shape == scale_ref.shape
    assert scale.stride() == scale_ref.stride()
    assert torch.equal(q[:rows].view(torch.uint8), q_ref[:rows].view(torch.uint8))
    assert torch.equal(scale[:rows], scale_ref[:rows])
    out = standins.torch_block_fp8_linear(x, w, [128, 128], w_scale, fallback=_refused)
    assert out.shape == (rows, n) and torch.equal(out, want)


def test_no_pad_or_copy_of_the_activation(standins, quant, monkeypatch):
    monkeypatch.setattr(standins, "_torch_fp8_refused", [])
    w, w_scale = _weight(1536, 7168)
    x = torch.randn(2791, 7168, device="cuda", dtype=torch.bfloat16)
    try:
        _padded_activation_linear(x, w, w_scale, quant)
    except RuntimeError as e:
        pytest.skip(f"cuBLAS refuses block-scaled scaled_mm here: {e}")
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        standins.torch_block_fp8_linear(x, w, [128, 128], w_scale, fallback=_refused)
        torch.cuda.synchronize()
    ops = {e.key for e in prof.key_averages()}
    assert not ops & {"aten::constant_pad_nd", "aten::pad", "aten::copy_", "aten::cat"}, ops
