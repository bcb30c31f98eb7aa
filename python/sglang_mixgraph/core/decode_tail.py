"""The decode tail of a split mixed step: FlashMLA fp8 sparse decode over rows [b0, b0 + D).

The call mirrors what sglang's DSV4 backend does for pure decode batches
(``DeepseekV4AttnBackend._forward_attention``; legacy kernels for the V4 584-byte cache):
``q (D, 1, h_q, 512)``, the SWA cache view with ``swa_page_indices``/``swa_topk_lengths`` as the
main scope, the compressed cache with the c4 top-k or c128 page indices as the extra scope,
``attn_sink``. The plan builds one :class:`TailInputs` per compress ratio and step, with one
FlashMLA scheduling-metadata object (it binds the tail's shape on first use,
``flash_mla_with_kvcache``); every layer of that ratio reuses them (:func:`run_tail`). The
kernel is passed in, so CPU tests run the reference kernel. The per-call path the benchmarks and
GPU tests use is ``kits.decode_tail_call``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

HEAD_DIM = 512
# DeepseekV4AttnBackend._forward_attention asserts both index widths are multiples of 64.
INDEX_ALIGN = 64

KernelFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
MetaFactory = Callable[[], Any]


def kernel_indices(x: torch.Tensor, name: str) -> torch.Tensor:
    """``x`` as the kernel takes indices: ``(D, 1, W)`` int32, ``W`` a multiple of 64."""
    if x.dim() == 2:
        x = x.unsqueeze(1)
    if x.dim() != 3:
        raise ValueError(f"{name} must be (D, topk) or (D, 1, topk), got {tuple(x.shape)}")
    if x.shape[-1] % INDEX_ALIGN:
        raise ValueError(f"{name} width {x.shape[-1]} is not a multiple of {INDEX_ALIGN}")
    if x.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {x.dtype}")
    return x


@dataclasses.dataclass(frozen=True)
class TailInputs:
    """One compress ratio's decode-kernel inputs for one step, built once by the step's plan.

    Rows ``[b0, b0 + D)`` of the step's per-row metadata, shaped for the kernel (``(D, 1, W)``
    index views, ``(D,)`` lengths) and validated here, with the ratio's one scheduling-metadata
    object; every layer of that ratio reads them (views of the metadata tensors, so they see
    the indexer's in-place per-layer writes of the c4 top-k). ``sources`` are the metadata
    tensors the views were taken from (:meth:`built_from` tells whether they still are).
    """

    ratio: int
    num_rows: int
    kernel_kwargs: Mapping[str, Any]
    sources: tuple[torch.Tensor | None, ...]

    @property
    def sched_meta(self) -> Any:
        return self.kernel_kwargs["tile_scheduler_metadata"]

    def built_from(self, swa_indices, swa_lengths, extra_indices, extra_lengths) -> bool:
        s = self.sources
        return (
            s[0] is swa_indices
            and s[1] is swa_lengths
            and s[2] is extra_indices
            and s[3] is extra_lengths
        )


def sparse_decode_kwargs(
    sched_meta, softmax_scale, swa_indices, extra_indices, swa_lengths, extra_lengths, use_legacy
) -> dict:
    """FlashMLA's sparse fp8 decode arguments other than the query, caches and sink: the same
    for the plan's prepared inputs and the per-call path (``kits.decode_tail_call``)."""
    return dict(
        block_table=None,
        cache_seqlens=None,
        head_dim_v=HEAD_DIM,
        tile_scheduler_metadata=sched_meta,
        num_splits=None,
        softmax_scale=softmax_scale,
        causal=False,
        is_fp8_kvcache=True,
        indices=swa_indices,
        extra_indices_in_kvcache=extra_indices,
        topk_length=swa_lengths,
        extra_topk_length=extra_lengths,
        use_legacy=use_legacy,
    )


def tail_inputs(
    ratio: int,
    b0: int,
    num_decode: int,
    swa_indices: torch.Tensor,
    swa_lengths: torch.Tensor | None,
    extra_indices: torch.Tensor | None = None,
    extra_lengths: torch.Tensor | None = None,
    *,
    sched_meta: Any,
    softmax_scale: float | None = None,
    use_legacy: bool = True,
) -> TailInputs:
    """The decode tail's inputs of one ratio for one step: rows ``[b0, b0 + num_decode)`` of
    the step's metadata (``extra_*`` None for SWA-only layers), checked once here instead of in
    every layer call."""
    if (ratio == 0) != (extra_indices is None):
        raise ValueError(f"ratio {ratio}: extra indices come with the compressed ratios only")
    d = int(num_decode)

    def rows(t):
        if t is None:
            return None
        if b0 + d > t.shape[0]:
            raise IndexError(f"rows [{b0}, {b0 + d}) outside a tensor of {t.shape[0]} rows")
        return t.narrow(0, b0, d)

    swa_idx = kernel_indices(rows(swa_indices), "swa_indices")
    extra_idx = (
        None if extra_indices is None else kernel_indices(rows(extra_indices), "extra_indices")
    )
    kwargs = sparse_decode_kwargs(
        sched_meta,
        softmax_scale,
        swa_idx,
        extra_idx,
        rows(swa_lengths),
        rows(extra_lengths),
        use_legacy,
    )
    return TailInputs(
        ratio=ratio,
        num_rows=d,
        kernel_kwargs=kwargs,
        sources=(swa_indices, swa_lengths, extra_indices, extra_lengths),
    )


def run_tail(
    inputs: TailInputs,
    q: torch.Tensor,
    swa_k_cache: torch.Tensor,
    attn_sink: torch.Tensor,
    extra_k_cache: torch.Tensor | None,
    kernel: KernelFn,
) -> torch.Tensor:
    """The decode kernel on ``q`` (``(D, 1, h_q, 512)``, the tail rows of the layer's query)
    with the step's prepared inputs: one kernel call; returns the kernel's ``(D, 1, h_q, 512)``
    output."""
    return kernel(
        q=q,
        k_cache=swa_k_cache,
        attn_sink=attn_sink,
        extra_k_cache=extra_k_cache,
        **inputs.kernel_kwargs,
    )[0]
