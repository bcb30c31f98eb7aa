"""The split attention of a planned step.

AROUND ``_build_sparse_prefill_chunk_cache``: every builder call of a split step builds the
prefill-only chunk cache over every row (decode and padding rows have no keys). AROUND
``_forward_prefill_sparse`` / ``_forward_prefill_sparse_q8kv8``: for a layer whose ratio splits,
the fp8 decode kernel on the decode rows and upstream's body on every row, joined by copying the
decode rows in (``core.mixed_boundary.copy_in_join``); for a ratio ``adaptive`` keeps unsplit,
upstream's body with the all-requests cache upstream would have built.
"""

from __future__ import annotations

from sglang_mixgraph.core.mixed_boundary import assemble_rows, copy_in_join, slice_decode_tail
from sglang_mixgraph.patches.mixed_split.state import (
    ALL_RATIOS,
    SplitPlan,
    _count,
    _fallback,
    get_plan,
)
from sglang_mixgraph.upstream_attrs import METADATA_SPLIT_PLAN


class _PrefillRequestsView:
    """The first P requests of a ForwardBatch, as the chunk-cache builder reads them.

    ``DeepseekV4AttnBackend._build_sparse_prefill_chunk_cache`` reads
    ``seq_lens(_cpu)``, ``extend_seq_lens(_cpu)``, ``req_pool_indices`` and asks
    ``is_cp_active`` (``forward_mode``/``input_ids``); everything else is delegated.
    Tensor fields are views, host lists are new lists.
    """

    def __init__(self, forward_batch, plan: SplitPlan):
        p = plan.boundary.num_prefill_reqs
        self._fb = forward_batch
        self.seq_lens = forward_batch.seq_lens[:p]
        self.seq_lens_cpu = forward_batch.seq_lens_cpu[:p]
        self.extend_seq_lens = forward_batch.extend_seq_lens[:p]
        self.extend_seq_lens_cpu = list(forward_batch.extend_seq_lens_cpu[:p])
        self.req_pool_indices = forward_batch.req_pool_indices[:p]
        self.batch_size = p

    def __getattr__(self, name):
        return getattr(self._fb, name)


def around_build_chunk_cache(
    original, backend, forward_batch, core_attn_metadata, *, num_qo_tokens
):
    plan = get_plan(backend)
    if plan is None or not plan.matches(forward_batch):
        return original(backend, forward_batch, core_attn_metadata, num_qo_tokens=num_qo_tokens)
    if plan.boundary.b0 == 0:
        # No prefill rows: nothing reads a chunk cache this step (the sparse AROUND never
        # calls upstream's body), so none is built.
        return None
    if plan.prefill_cache is not None:
        # Built once per step, as upstream's lazy path does: the plan builds it before the
        # first layer, upstream's eager WAR snapshot asks again (_snapshot_prefill_shared_reads).
        return plan.prefill_cache
    view = _PrefillRequestsView(forward_batch, plan)
    # Every row of the step: the decode and padding rows are rows no request of the view
    # owns, so the sparse prefill writes them as zeros (the copy-in join fills the decode rows).
    plan.prefill_cache = original(
        backend, view, core_attn_metadata, num_qo_tokens=plan.boundary.num_rows
    )
    return plan.prefill_cache


# --------------------------------------------------------------------------------------------
# the split attention (AROUND _forward_prefill_sparse / _forward_prefill_sparse_q8kv8)
# --------------------------------------------------------------------------------------------


def _kernel_cache_view(buf, page_size: int, bytes_per_token: int):
    # The (pages, page_size, 1, bytes) view upstream hands FlashMLA
    # (DeepseekV4AttnBackend._forward_attention); the kernel detects the format from the last dim.
    assert buf.ndim == 2
    return buf[:, : page_size * bytes_per_token].view(buf.shape[0], page_size, 1, bytes_per_token)


def _decode_tail(backend, plan: SplitPlan, q, layer_id, compress_ratio, pool, core, attn_sink):
    swa_cache = _kernel_cache_view(
        pool.get_swa_key_buffer_radix(layer_id),
        pool.get_swa_key_page_size(),
        pool.get_swa_key_bytes_per_token(),
    )
    extra_cache = extra_idx = extra_len = None
    if compress_ratio != 0:
        extra_cache = _kernel_cache_view(
            pool.get_extra_key_buffer(layer_id),
            pool.get_extra_key_page_size(layer_id),
            pool.get_extra_key_bytes_per_token(layer_id),
        )
        extra_idx = core.sparse_page_indices(compress_ratio)
        extra_len = core.sparse_topk_lengths(compress_ratio)
    tail = slice_decode_tail(
        plan.boundary, q, core.swa_page_indices, core.swa_topk_lengths, extra_idx, extra_len
    )
    q_tail = tail.q.squeeze(1) if tail.q.dim() == 4 else tail.q
    plan.decode_calls[compress_ratio] = plan.decode_calls.get(compress_ratio, 0) + 1
    return plan.tail.forward(
        compress_ratio,
        q_tail,
        swa_cache,
        tail.swa_indices,
        tail.swa_lengths,
        attn_sink,
        extra_k_cache=extra_cache,
        extra_indices=tail.extra_indices,
        extra_lengths=tail.extra_lengths,
        softmax_scale=backend.softmax_scale,
    )


def _abandon_plan(backend, reason_key: str) -> None:
    """A planned step meets something only visible at the first layer: upstream for the rest
    of the step. The prefill-only cache is replaced by the all-requests one the plan built
    before any read-done publish (plan._plan builds it wherever read-done may be published),
    else dropped so upstream's lazy build (in ``_forward_prefill_sparse``) covers every row
    again: only where nothing was published, so that build may still read the shared tables.
    Not expected in practice: the plan-time checks cover the configurations that lead here
    (see docs/mixed-split.md)."""
    _fallback(reason_key)
    metadata = backend.forward_metadata
    plan = getattr(metadata, METADATA_SPLIT_PLAN, None)
    setattr(metadata, METADATA_SPLIT_PLAN, None)
    metadata.sparse_prefill_cache = plan.full_cache if plan is not None else None


def _unsplit_forward(original, backend, plan: SplitPlan, forward_batch, compress_ratio, call):
    """A layer whose ratio the plan does not split: upstream's body on every row, seeing the
    all-requests chunk cache it would have built itself (swapped in for the call only; the
    prefill-only cache stays the metadata's for the split ratios)."""
    metadata = backend.forward_metadata
    split_cache = metadata.sparse_prefill_cache
    if plan.full_cache is None:
        # Defensive: every present ratio was expected to split. Build it as upstream's lazy
        # path would, through the builder with the plan detached (so the hook passes it on).
        setattr(metadata, METADATA_SPLIT_PLAN, None)
        try:
            plan.full_cache = backend._build_sparse_prefill_chunk_cache(
                forward_batch, call["core_attn_metadata"], num_qo_tokens=plan.boundary.num_rows
            )
        finally:
            setattr(metadata, METADATA_SPLIT_PLAN, plan)
    metadata.sparse_prefill_cache = plan.full_cache
    try:
        out = original(backend, **call)
    finally:
        metadata.sparse_prefill_cache = split_cache
    plan.unsplit_calls[compress_ratio] = plan.unsplit_calls.get(compress_ratio, 0) + 1
    _count(f"layers_unsplit_adaptive.c{compress_ratio}")
    return out


def _split_forward(
    original,
    backend,
    q,
    layer_id,
    compress_ratio,
    forward_batch,
    pool,
    core,
    attn_sink,
    extra_kwargs,
):
    plan = get_plan(backend)
    if plan is None or not plan.matches(forward_batch):
        return None
    b = plan.boundary
    if q.shape[0] != b.num_rows:
        _abandon_plan(backend, "shape")
        return None
    if q.shape[-2] not in (64, 128):
        _abandon_plan(backend, "heads")
        return None
    if compress_ratio not in ALL_RATIOS:
        _abandon_plan(backend, "low_ratio")
        return None
    call = dict(
        layer_id=layer_id,
        compress_ratio=compress_ratio,
        forward_batch=forward_batch,
        token_to_kv_pool=pool,
        core_attn_metadata=core,
        attn_sink=attn_sink,
        **extra_kwargs,
    )
    if not plan.splits(compress_ratio):
        return _unsplit_forward(
            original, backend, plan, forward_batch, compress_ratio, dict(call, q=q)
        )
    o_dec = _decode_tail(backend, plan, q, layer_id, compress_ratio, pool, core, attn_sink)
    _count(f"layers_split.c{compress_ratio}")
    if not b.b0:
        return assemble_rows(b, None, o_dec, like=o_dec)
    # The sparse prefill over every row with the prefill-only workspace, then the decode rows
    # copied in (``core.mixed_boundary.copy_in_join``).
    o_all = original(backend, q=q, **call)
    if o_dec.shape[1:] != o_all.shape[1:]:
        # the Q8KV8 path returns only the active heads (``_forward_prefill_sparse_q8kv8``)
        o_dec = o_dec[:, : o_all.shape[1]]
    return copy_in_join(b, o_all, o_dec)


def around_forward_prefill_sparse(
    original,
    backend,
    q,
    layer_id,
    compress_ratio,
    forward_batch,
    token_to_kv_pool,
    core_attn_metadata,
    attn_sink,
    cos_sin_cache=None,
):
    call = dict(
        q=q,
        layer_id=layer_id,
        compress_ratio=compress_ratio,
        forward_batch=forward_batch,
        token_to_kv_pool=token_to_kv_pool,
        core_attn_metadata=core_attn_metadata,
        attn_sink=attn_sink,
        cos_sin_cache=cos_sin_cache,
    )
    if cos_sin_cache is not None:
        plan = get_plan(backend)
        if plan is not None and plan.matches(forward_batch):
            _abandon_plan(backend, "mega")
        return original(backend, **call)
    out = _split_forward(
        original,
        backend,
        q,
        layer_id,
        compress_ratio,
        forward_batch,
        token_to_kv_pool,
        core_attn_metadata,
        attn_sink,
        {"cos_sin_cache": None},
    )
    return original(backend, **call) if out is None else out


def around_forward_prefill_sparse_q8kv8(
    original,
    backend,
    q,
    layer_id,
    compress_ratio,
    forward_batch,
    token_to_kv_pool,
    core_attn_metadata,
    attn_sink,
):
    out = _split_forward(
        original,
        backend,
        q,
        layer_id,
        compress_ratio,
        forward_batch,
        token_to_kv_pool,
        core_attn_metadata,
        attn_sink,
        {},
    )
    if out is None:
        return original(
            backend,
            q=q,
            layer_id=layer_id,
            compress_ratio=compress_ratio,
            forward_batch=forward_batch,
            token_to_kv_pool=token_to_kv_pool,
            core_attn_metadata=core_attn_metadata,
            attn_sink=attn_sink,
        )
    return out
