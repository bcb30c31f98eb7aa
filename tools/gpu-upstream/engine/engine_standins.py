"""Stand-ins for the binary-only kernels a tiny DeepSeek-V4 Engine reaches on the GPU machine.

The kit's import shim (tools/gpu-upstream/shim) stubs ``sgl_kernel`` there; a stub raises when
called. Four kernels on the DeepSeek-V4 serving path (five with GLM-5's) have no upstream switch to a non-binary
implementation, so an Engine run needs these (nothing else; every other kernel is upstream's):

* ``sgl_kernel.moe_align_block_size``: upstream's own JIT kernel,
  ``sglang.kernels.ops.moe.moe_align.moe_align_block_size`` (same arguments);
* ``sgl_kernel.moe_sum_reduce`` and ``sgl_kernel.rmsnorm``: torch, fp32 accumulation;
* ``sgl_kernel.fused_add_rmsnorm`` (GLM-5 only: DeepSeek-V2's norms with a residual): torch;
* ``sglang.kernels.ops.layernorm.mhc.hc_split_sinkhorn`` (TileLang on SM90): upstream's own Triton
  port of it, ``_hc_split_sinkhorn_triton`` in the same module.

With ``MIXGRAPH_KIT_KERNELS=faithful`` (TileLang on the machine) the three that have a real kernel
in the carried sglang take it: ``rmsnorm`` on SGLang's JIT rmsnorm
(``sglang.kernels.ops.layernorm.norm.rmsnorm``), ``moe_sum_reduce`` on upstream's Triton
``moe_sum_reduce_triton``, and the sinkhorn stays on SGLang's TileLang kernel; shapes those
kernels refuse go to the torch version, said once.

With ``MIXGRAPH_KIT_FP8_GEMM=torch`` (an FP8 slice) the block-128 FP8 linears run on torch's
block-scaled ``scaled_mm`` (cuBLAS) instead of the Triton GEMM SGLang picks where DeepGEMM does
not load: upstream's ``fp8_utils.torch_w8a8_block_fp8_linear`` does the same for XPU only, in XPU's
scale layout; ``torch_block_fp8_linear`` here gives cuBLAS its own (below). What it does not
handle, or a first call cuBLAS refuses, goes back to SGLang's choice, said once.

Each says on stderr when it is first used (``STANDIN_MARK``); every call of a stub is said too
(``STUB_MARK``, with its caller), since upstream code may swallow the exception it raises.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import traceback

STANDIN_MARK = "[gpu-upstream] stand-in first use: "
STUB_MARK = "[gpu-upstream] STUB CALLED "

_announced: set = set()


def _first_use(name: str) -> None:
    if name not in _announced:
        _announced.add(name)
        sys.stderr.write(f"{STANDIN_MARK}{name} (pid {os.getpid()})\n")
        sys.stderr.flush()


def moe_align_block_size(
    topk_ids,
    num_experts,
    block_size,
    sorted_token_ids,
    experts_ids,
    num_tokens_post_pad,
    cumsum_buffer,
    pad_sorted_token_ids=False,
    ignore_invalid_expert=False,
):
    """The AOT signature that ``sglang.kernels.ops.moe.moe_align_block_size`` calls, on the JIT
    kernel; its ``map_invalid_experts_to_sentinel`` is the AOT ``ignore_invalid_expert``."""
    from sglang.kernels.ops.moe.moe_align import moe_align_block_size as jit_align

    _first_use("sgl_kernel.moe_align_block_size -> sglang JIT moe_align_block_size")
    jit_align(
        topk_ids,
        num_experts,
        block_size,
        sorted_token_ids,
        experts_ids,
        num_tokens_post_pad,
        cumsum_buffer,
        pad_sorted_token_ids,
        map_invalid_experts_to_sentinel=ignore_invalid_expert,
    )


def moe_sum_reduce(input, output, routed_scaling_factor=1.0):
    """``output = sum over the top-k axis of input (tokens, topk, hidden) * factor``."""
    _first_use("sgl_kernel.moe_sum_reduce -> torch")
    total = input.float().sum(dim=1)
    if routed_scaling_factor is not None and routed_scaling_factor != 1.0:
        total = total * routed_scaling_factor
    output.copy_(total.to(output.dtype))


def _rmsnorm_torch(input, weight, eps):
    import torch

    x = input.float()
    return (x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()).to(
        input.dtype
    )


def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    """``input / rms(input) * weight`` over the last axis, computed in fp32."""
    _first_use("sgl_kernel.rmsnorm -> torch")
    y = _rmsnorm_torch(input, weight, eps)
    if out is None:
        return y
    out.copy_(y)
    return out


def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    """In place, as sgl_kernel's: ``residual += input``, then ``input = rmsnorm(residual)``
    (fp32 sum and norm, stored in the tensors' dtype). GLM-5's layers (DeepSeek-V2's
    ``RMSNorm.forward_cuda`` with a residual) reach it; DeepSeek-V4's mHC layers do not."""
    _first_use("sgl_kernel.fused_add_rmsnorm -> torch")
    total = input.float() + residual.float()
    residual.copy_(total.to(residual.dtype))
    input.copy_(_rmsnorm_torch(residual, weight, eps))


def _faithful() -> bool:
    return os.environ.get("MIXGRAPH_KIT_KERNELS", "standin") == "faithful"


def rmsnorm_jit(input, weight, eps=1e-6, out=None, enable_pdl=None):
    """``sgl_kernel.rmsnorm``'s signature on SGLang's JIT rmsnorm (2-D rows, last stride 1, the
    weight in the input's dtype, hidden sizes it supports); torch for the rest."""
    from sglang.kernels.ops.layernorm import norm

    ok = (
        input.dim() == 2
        and input.shape[0] > 0
        and input.stride(-1) == 1
        and weight.dtype == input.dtype
        and norm._is_supported_rmsnorm_hidden_size(input.shape[-1])
        and (out is None or out.stride(-1) == 1)
    )
    if not ok:
        _first_use(f"sgl_kernel.rmsnorm -> torch (JIT refuses {tuple(input.shape)} {input.dtype})")
        return rmsnorm(input, weight, eps, out)
    _first_use("sgl_kernel.rmsnorm -> sglang JIT rmsnorm")
    dst = out if out is not None else input.new_empty(input.shape)
    norm.rmsnorm(input, weight, dst, eps)
    return dst


def moe_sum_reduce_triton(input, output, routed_scaling_factor=1.0):
    """``sgl_kernel.moe_sum_reduce`` on upstream's Triton kernel (contiguous tensors only)."""
    from sglang.kernels.ops.moe.fused_moe_triton_kernels import moe_sum_reduce_triton as triton_sum

    if not (input.is_contiguous() and output.is_contiguous()):
        _first_use("sgl_kernel.moe_sum_reduce -> torch (not contiguous)")
        return moe_sum_reduce(input, output, routed_scaling_factor)
    _first_use("sgl_kernel.moe_sum_reduce -> sglang Triton moe_sum_reduce_triton")
    triton_sum(input, output, 1.0 if routed_scaling_factor is None else routed_scaling_factor)


FP8_GEMM_ENV = "MIXGRAPH_KIT_FP8_GEMM"  # "torch": block-FP8 linears on torch's scaled_mm
_torch_fp8_refused: list = []  # the error of a first call cuBLAS refused: the fallback from then on


def padded_fp8_quant(x, quant):
    """``x`` (M, K) bf16 quantized per 128 columns straight into FP8 buffers of M rounded up to
    4 rows, the scales column-major with that leading dimension: torch's block-scaled
    ``scaled_mm`` takes 1x128 scales only with a stride equal to A's rows, and the rows are kept
    a multiple of 4 (16-byte scale columns) for cuBLAS, as the stand-in always gave it. The few
    tail rows are zeroed, not the activation padded and copied (a fill and a copy of the whole
    activation per linear, which DeepGEMM does not pay); they only feed output rows the caller
    drops. ``quant`` is SGLang's
    ``sglang_per_token_group_quant_fp8`` (it writes into strided ``output_q``/``output_s``)."""
    import torch

    rows, k = x.shape
    padded = rows + -rows % 4
    q = torch.empty(padded, k, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(k // 128, padded, dtype=torch.float32, device=x.device).t()
    quant(x, 128, column_major_scales=True, output_q=q[:rows], output_s=scale[:rows])
    if padded != rows:
        q[rows:].zero_()
        scale[rows:].zero_()
    return q, scale


def torch_block_fp8_linear(
    input,
    weight,
    block_size,
    weight_scale,
    input_scale=None,
    bias=None,
    *,
    fallback,
    scaled_mm=None,
    quant=None,
    **extra,
):
    """A [128, 128]-block FP8 linear on torch's block-scaled ``scaled_mm``: the activation
    group-quantized per 128 columns by SGLang's kernel into row-padded buffers
    (``padded_fp8_quant``), the weight's block scales transposed with the weight (the layout
    cuBLAS's block scaling reads on SM90). ``fallback`` (SGLang's own choice) takes a
    pre-quantized input, another block size or K blocks not a multiple of 4, and everything after
    a refused call."""
    import torch.nn.functional as F

    def upstream():
        return fallback(
            input=input,
            weight=weight,
            block_size=block_size,
            weight_scale=weight_scale,
            input_scale=input_scale,
            bias=bias,
            **extra,
        )

    if _torch_fp8_refused:
        return upstream()
    if input_scale is not None or list(block_size) != [128, 128] or weight_scale.shape[1] % 4:
        _first_use("block-FP8 linear -> SGLang's choice (a case torch's scaled_mm is not given)")
        return upstream()
    if quant is None:
        from sglang.kernels.ops.quantization.fp8_kernel import (
            sglang_per_token_group_quant_fp8 as quant,
        )
    x = input.reshape(-1, input.shape[-1])
    rows = x.shape[0]
    q, scale = padded_fp8_quant(x.contiguous(), quant)
    try:
        out = (scaled_mm or F.scaled_mm)(
            q,
            weight.t(),
            scale,
            F.ScalingType.BlockWise1x128,
            weight_scale.t(),
            F.ScalingType.BlockWise128x128,
            output_dtype=input.dtype,
        )
    except RuntimeError as e:
        _torch_fp8_refused.append(e)
        _first_use(f"block-FP8 linear -> SGLang's choice for good: scaled_mm refused ({e})")
        return upstream()
    _first_use("block-FP8 linear -> torch scaled_mm (cuBLAS block scaling)")
    out = out[:rows]
    if bias is not None:
        out = out + bias
    return out.view(*input.shape[:-1], weight.shape[0])


def _block_fp8_on_torch(fp8) -> None:
    """Wrap ``fp8.dispatch_w8a8_block_fp8_linear`` (Fp8LinearMethod's choice of linear, looked
    up in that module): [128, 128] blocks without UE8M0 scales go to ``torch_block_fp8_linear``."""
    import functools

    choose = fp8.dispatch_w8a8_block_fp8_linear

    def dispatch_w8a8_block_fp8_linear(weight_block_size=None, act_scale_ue8m0=False):
        chosen = choose(weight_block_size=weight_block_size, act_scale_ue8m0=act_scale_ue8m0)
        if list(weight_block_size or ()) != [128, 128] or act_scale_ue8m0:
            return chosen
        return functools.partial(torch_block_fp8_linear, fallback=chosen)

    fp8.dispatch_w8a8_block_fp8_linear = dispatch_w8a8_block_fp8_linear


SGL_KERNEL = {
    "sgl_kernel.moe_align_block_size": moe_align_block_size,
    "sgl_kernel.moe_sum_reduce": moe_sum_reduce,
    "sgl_kernel.rmsnorm": rmsnorm,
    "sgl_kernel.fused_add_rmsnorm": fused_add_rmsnorm,
}


def _sinkhorn_through_triton_port(mhc) -> None:
    """Point ``mhc.hc_split_sinkhorn`` at upstream's Triton port (upstream uses it on gfx1250,
    where TileLang does not build); DeepSeek-V4 looks the function up at call time."""
    triton_port = mhc._hc_split_sinkhorn_triton

    def hc_split_sinkhorn(mixes, hc_scale, hc_base, hc_mult=4, sinkhorn_iters=20, eps=1e-6):
        _first_use("mhc.hc_split_sinkhorn -> sglang Triton port")
        b, s = mixes.shape[0], mixes.shape[1]
        if b * s == 0:  # no tokens (an idle DP rank): no grid to launch, as upstream
            return (
                mixes.new_empty(b, s, hc_mult),
                mixes.new_empty(b, s, hc_mult),
                mixes.new_empty(b, s, hc_mult, hc_mult),
            )
        return triton_port(mixes, hc_scale, hc_base, hc_mult, sinkhorn_iters, eps)

    mhc.hc_split_sinkhorn = hc_split_sinkhorn


class AfterImport(importlib.abc.MetaPathFinder):
    """Run ``after(module)`` right after the named module has executed, before anyone uses it."""

    def __init__(self, name, after):
        self.name, self.after = name, after

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # find the real spec, then wrap its exec_module
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        real_exec, after = spec.loader.exec_module, self.after

        def exec_module(module):
            real_exec(module)
            after(module)

        spec.loader.exec_module = exec_module
        return spec


def _make_stub_calls_loud(stubs) -> None:
    meta = stubs._StubMeta
    quiet_call = meta.__call__

    def loud_call(cls, *args, **kwargs):
        if cls.__dict__.get("__stub_root__", False):
            frames = traceback.extract_stack(limit=8)[:-1]
            where = " < ".join(
                f"{os.path.basename(f.filename)}:{f.lineno}" for f in reversed(frames)
            )
            sys.stderr.write(f"{STUB_MARK}{cls.__stub_name__} (pid {os.getpid()}) from {where}\n")
            sys.stderr.flush()
        return quiet_call(cls, *args, **kwargs)

    meta.__call__ = loud_call


def install() -> None:
    """Register the stand-ins with the shim's stubs and make stub calls loud."""
    import stubs  # the shim's module, on PYTHONPATH beside its sitecustomize

    stubs.OVERRIDES.update(SGL_KERNEL)
    _make_stub_calls_loud(stubs)
    if os.environ.get(FP8_GEMM_ENV) == "torch":
        sys.meta_path.insert(
            0, AfterImport("sglang.srt.layers.quantization.fp8", _block_fp8_on_torch)
        )
    if _faithful():
        stubs.OVERRIDES.update(
            {"sgl_kernel.rmsnorm": rmsnorm_jit, "sgl_kernel.moe_sum_reduce": moe_sum_reduce_triton}
        )
        return  # the sinkhorn stays on SGLang's TileLang kernel
    sys.meta_path.insert(
        0, AfterImport("sglang.kernels.ops.layernorm.mhc", _sinkhorn_through_triton_port)
    )
