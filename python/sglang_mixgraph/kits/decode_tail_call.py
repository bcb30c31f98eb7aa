"""The decode tail called per layer, without a plan: the benchmarks' and GPU tests' path.

``DecodeTail.forward(ratio, ...)`` runs :func:`run_decode_tail` with this step's scheduling
metadata for ``ratio``. FlashMLA's scheduling metadata (``FlashMLASchedMeta``) binds
``b, s_q, h_q, topk, extra_topk`` on first use and asserts on reuse with another shape
(``flash_mla.flash_mla_interface.flash_mla_with_kvcache``); its split plan also depends on the
``topk_length`` values, which are not checked. Within one step every layer of a ratio sees the
same tail rows and lengths, so :class:`SchedMetaCache` keeps one object per ratio per step and
refuses a second shape instead of letting the kernel assert. The split's runtime path is
``core.decode_tail`` (``tail_inputs`` once per step, ``run_tail`` per layer).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from sglang_mixgraph.core.decode_tail import (
    HEAD_DIM,
    KernelFn,
    MetaFactory,
    kernel_indices,
    sparse_decode_kwargs,
)


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
    swa_indices = kernel_indices(swa_indices, "swa_indices")
    if extra_indices is not None:
        extra_indices = kernel_indices(extra_indices, "extra_indices")
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
        **sparse_decode_kwargs(
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
