"""The decode tail of a split mixed step: FlashMLA fp8 sparse decode over rows [b0, b0 + D).

The call mirrors what sglang's DSV4 backend does for pure decode batches
(``DeepseekV4AttnBackend._forward_attention``; legacy kernels for the V4 584-byte cache, bound
in ``DeepseekV4AttnBackend.__init__``): ``q (D, 1, h_q, 512)``, the SWA cache view and
``swa_page_indices``/``swa_topk_lengths`` as the main scope, the compressed cache and the c4
top-k or c128 page indices as the extra scope, ``attn_sink``.

FlashMLA's scheduling metadata (``FlashMLASchedMeta``) binds ``b, s_q, h_q, topk, extra_topk``
(and page sizes) on first use and asserts on reuse with another shape
(``flash_mla.flash_mla_interface.flash_mla_with_kvcache``); its split plan also depends on the
``topk_length`` values, which are not checked. Within one step every layer of a compress ratio
sees the same tail rows and the same lengths, so one object per ratio is created per step,
bound to the tail batch size, reused across that ratio's layers and dropped at the next step.
:class:`SchedMetaCache` enforces this: it refuses a second shape for a ratio instead of letting
the kernel assert (or silently reuse a stale plan).

The kernel is injectable (``kernel=``) so CPU tests run the same code with
:func:`sglang_mixgraph.reference.sparse_mla.flash_mla_with_kvcache_reference`.
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


class SchedMetaShapeError(ValueError):
    """A scheduling-metadata object was asked for with a shape other than the one it is bound to."""


@dataclasses.dataclass(frozen=True)
class TailShape:
    batch: int
    h_q: int
    topk: int
    extra_topk: int | None


def default_meta_factory() -> Any:
    """A fresh ``flash_mla.FlashMLASchedMeta`` (imported lazily: FlashMLA needs a GPU build)."""
    from flash_mla import get_mla_metadata

    return get_mla_metadata()[0]


def default_kernel() -> KernelFn:
    from flash_mla import flash_mla_with_kvcache

    return flash_mla_with_kvcache


class SchedMetaCache:
    """One scheduling-metadata object per compress ratio for one step.

    ``get(ratio, batch, topk, ...)`` creates the object for ``ratio`` on first use and returns
    the same object for the same shape afterwards; a different shape for a ratio raises
    :class:`SchedMetaShapeError`. Call :meth:`reset` when a new step (new metadata) starts.
    """

    def __init__(self, factory: MetaFactory | None = None):
        self._factory = factory or default_meta_factory
        self._entries: dict[int, tuple[TailShape, Any]] = {}

    def get(
        self,
        ratio: int,
        batch: int,
        topk: int,
        extra_topk: int | None = None,
        h_q: int = 128,
    ) -> Any:
        shape = TailShape(
            int(batch), int(h_q), int(topk), None if extra_topk is None else int(extra_topk)
        )
        entry = self._entries.get(ratio)
        if entry is None:
            meta = self._factory()
            self._entries[ratio] = (shape, meta)
            return meta
        bound, meta = entry
        if bound != shape:
            raise SchedMetaShapeError(
                f"ratio {ratio}: scheduling metadata is bound to {bound}, asked for {shape}; "
                "reset() the cache at a step boundary"
            )
        return meta

    def bound_shape(self, ratio: int) -> TailShape | None:
        entry = self._entries.get(ratio)
        return None if entry is None else entry[0]

    def reset(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, ratio: int) -> bool:
        return ratio in self._entries


def _as_3d_indices(x: torch.Tensor, name: str) -> torch.Tensor:
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


def _sparse_decode_kwargs(
    sched_meta, softmax_scale, swa_indices, extra_indices, swa_lengths, extra_lengths, use_legacy
) -> dict:
    """FlashMLA's sparse fp8 decode arguments other than the query, caches and sink: the same
    for the plan's prepared inputs and the per-call path."""
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
    every layer call (:func:`run_decode_tail` checks them per call)."""
    if (ratio == 0) != (extra_indices is None):
        raise ValueError(f"ratio {ratio}: extra indices come with the compressed ratios only")
    d = int(num_decode)

    def rows(t):
        if t is None:
            return None
        if b0 + d > t.shape[0]:
            raise IndexError(f"rows [{b0}, {b0 + d}) outside a tensor of {t.shape[0]} rows")
        return t.narrow(0, b0, d)

    swa_idx = _as_3d_indices(rows(swa_indices), "swa_indices")
    extra_idx = (
        None if extra_indices is None else _as_3d_indices(rows(extra_indices), "extra_indices")
    )
    kwargs = _sparse_decode_kwargs(
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


def run_decode_tail(
    q: torch.Tensor,
    swa_k_cache: torch.Tensor,
    swa_indices: torch.Tensor,
    swa_lengths: torch.Tensor | None,
    attn_sink: torch.Tensor,
    sched_meta: Any,
    *,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_lengths: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    kernel: KernelFn | None = None,
    use_legacy: bool = True,
) -> torch.Tensor:
    """Sparse fp8 decode of the tail rows; returns ``(D, h_q, 512)`` (the kernel's dtype, bf16).

    ``q`` is ``(D, h_q, 512)`` or ``(D, 1, h_q, 512)``; caches are kernel views
    ``(pages, page_size, 1, 584)``; ``sched_meta`` comes from :class:`SchedMetaCache`.
    """
    if q.dim() == 3:
        q = q.unsqueeze(1)
    if q.dim() != 4 or q.shape[1] != 1 or q.shape[-1] != HEAD_DIM:
        raise ValueError(
            f"q must be (D, h_q, {HEAD_DIM}) or (D, 1, h_q, {HEAD_DIM}), got {tuple(q.shape)}"
        )
    d = q.shape[0]
    if d == 0:
        return q.new_empty((0, q.shape[2], HEAD_DIM))
    if (extra_k_cache is None) != (extra_indices is None):
        raise ValueError("extra_k_cache and extra_indices come together")
    swa_indices = _as_3d_indices(swa_indices, "swa_indices")
    if extra_indices is not None:
        extra_indices = _as_3d_indices(extra_indices, "extra_indices")
    for name, t in (
        ("swa_indices", swa_indices),
        ("extra_indices", extra_indices),
        ("swa_lengths", swa_lengths),
        ("extra_lengths", extra_lengths),
    ):
        if t is not None and t.shape[0] != d:
            raise ValueError(f"{name} has {t.shape[0]} rows for {d} decode rows")
    fn = kernel or default_kernel()
    out, _lse = fn(
        q=q,
        k_cache=swa_k_cache,
        attn_sink=attn_sink,
        extra_k_cache=extra_k_cache,
        **_sparse_decode_kwargs(
            sched_meta,
            softmax_scale,
            swa_indices,
            extra_indices,
            swa_lengths,
            extra_lengths,
            use_legacy,
        ),
    )
    return out.squeeze(1)


class DecodeTail:
    """Per-step helper: the sched-meta cache plus the (injectable) kernel.

    ``forward(ratio, ...)`` picks this step's metadata object for ``ratio`` bound to the tail
    shape and runs :func:`run_decode_tail`. ``new_step()`` drops the objects; call it wherever
    the step's attention metadata is (re)built.
    """

    def __init__(
        self,
        kernel: KernelFn | None = None,
        meta_factory: MetaFactory | None = None,
        use_legacy: bool = True,
    ):
        self.kernel = kernel
        self.metas = SchedMetaCache(meta_factory)
        self.use_legacy = use_legacy

    def new_step(self) -> None:
        self.metas.reset()

    def forward(
        self,
        ratio: int,
        q: torch.Tensor,
        swa_k_cache: torch.Tensor,
        swa_indices: torch.Tensor,
        swa_lengths: torch.Tensor | None,
        attn_sink: torch.Tensor,
        *,
        extra_k_cache: torch.Tensor | None = None,
        extra_indices: torch.Tensor | None = None,
        extra_lengths: torch.Tensor | None = None,
        softmax_scale: float | None = None,
    ) -> torch.Tensor:
        d = q.shape[0]
        if d == 0:
            return q.new_empty((0, q.shape[-2], HEAD_DIM))
        h_q = q.shape[-2]
        meta = self.metas.get(
            ratio,
            batch=d,
            topk=swa_indices.shape[-1],
            extra_topk=None if extra_indices is None else extra_indices.shape[-1],
            h_q=h_q,
        )
        return run_decode_tail(
            q,
            swa_k_cache,
            swa_indices,
            swa_lengths,
            attn_sink,
            meta,
            extra_k_cache=extra_k_cache,
            extra_indices=extra_indices,
            extra_lengths=extra_lengths,
            softmax_scale=softmax_scale,
            kernel=self.kernel,
            use_legacy=self.use_legacy,
        )
