"""The split attention of a planned step.

AROUND ``_build_sparse_prefill_chunk_cache``: every builder call of a split step builds the
prefill-only chunk cache over every row (decode and padding rows have no keys), once per step.
AROUND ``_forward_prefill_sparse`` / ``_forward_prefill_sparse_q8kv8``: upstream's body on every
row with that cache first (the layer's longest kernel), then the fp8 decode kernel on the decode
rows with the inputs the plan prepared for the layer's compress ratio, joined by copying the
decode rows in (``core.mixed_boundary.copy_in_join``). Per layer that is the two kernel calls, a
view of the query's tail rows and the copy: the metadata slices, their checks and the
scheduling metadata are the plan's (``core.decode_tail.TailInputs``, once per ratio per step).
With SGLANG_MIXGRAPH_SPLIT_TAIL_GRAPHS=1 the decode call is replayed from a CUDA graph per layer
and bucket of decode rows (``core.decode_tail_graphs``) wherever one serves, but for the step's
first layer of each ratio, which makes the step's split schedule the graphs then read.
"""

from __future__ import annotations

import logging

from sglang_mixgraph.core.decode_tail import run_tail
from sglang_mixgraph.core.decode_tail_graphs import TailGraphs
from sglang_mixgraph.core.mixed_boundary import assemble_rows, copy_in_join
from sglang_mixgraph.patches.mixed_split import plan as split_plan
from sglang_mixgraph.patches.mixed_split.state import (
    FALLBACK_REASONS,
    PATCH_ID,
    TAIL_GRAPHS_FLAG,
    SplitPlan,
    SplitPlanError,
    count_event,
    fall_back,
    get_plan,
)
from sglang_mixgraph.upstream_attrs import (
    BACKEND_SPLIT_KV_VIEWS,
    BACKEND_SPLIT_TAIL_GRAPHS,
    METADATA_SPLIT_PLAN,
)

logger = logging.getLogger("sglang_mixgraph")
_LAYERS_SPLIT = {r: f"layers_split.c{r}" for r in (0, 4, 128)}


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


def _buffer_key(buf):
    # What a kernel view of ``buf`` depends on: the pool's getters return a new tensor object
    # per call where the pool stores another dtype (``get_key_buffer``'s ``.view(dtype)``).
    return None if buf is None else (buf.data_ptr(), buf.shape, buf.dtype)


def _layer_caches(backend, pool, layer_id: int, compress_ratio: int):
    """The decode kernel's views of the layer's SWA and compressed caches. The pool's getters
    run every call (they wait for the layer's transfer, ``DeepSeekV4TokenToKVPool.
    wait_layer_transfer``); the views are made once per layer and buffer and kept on the
    backend (a buffer at another address, shape or dtype gets a new view)."""
    kept = getattr(backend, BACKEND_SPLIT_KV_VIEWS, None)
    if kept is None or kept[0] is not pool:
        kept = (pool, {})
        setattr(backend, BACKEND_SPLIT_KV_VIEWS, kept)
    swa_buf = pool.get_swa_key_buffer_radix(layer_id)
    extra_buf = pool.get_extra_key_buffer(layer_id) if compress_ratio else None
    key = (_buffer_key(swa_buf), _buffer_key(extra_buf))
    entry = kept[1].get(layer_id)
    if entry is not None and entry[0] == key:
        return entry[1], entry[2]
    swa = _kernel_cache_view(
        swa_buf, pool.get_swa_key_page_size(), pool.get_swa_key_bytes_per_token()
    )
    extra = None
    if extra_buf is not None:
        extra = _kernel_cache_view(
            extra_buf,
            pool.get_extra_key_page_size(layer_id),
            pool.get_extra_key_bytes_per_token(layer_id),
        )
    kept[1][layer_id] = (key, swa, extra)
    return swa, extra


def _mismatch(backend, plan: SplitPlan, reason_key: str) -> None:
    """A layer of a planned step meets something the plan checked otherwise (the plan-time
    checks in ``plan._plan`` / ``plan._unsupported_reason`` make this unreachable in sglang
    0.5.23). Where read-done may have been published for the step, going back to upstream would
    send its lazy build (``_forward_prefill_sparse``) to read ``req_to_token`` /
    ``full_to_swa_index_mapping`` after the publish, and no fallback cache is built for it:
    raise, naming the check. Elsewhere the plan is abandoned for the rest of the step and
    upstream's lazy build covers every row again (said once per reason)."""
    if plan.may_publish:
        raise SplitPlanError(
            "sglang-mixgraph mixed_split: a layer of a planned step does not match its plan "
            f"({FALLBACK_REASONS[reason_key]}) after read-done may have been published; "
            "upstream's lazy chunk-cache build would read the shared tables late. This is a "
            "bug of the patch against the installed SGLang: set "
            "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN=0 and report it."
        )
    fall_back(reason_key)
    metadata = backend.forward_metadata
    setattr(metadata, METADATA_SPLIT_PLAN, None)
    metadata.sparse_prefill_cache = None


def _tail_of(plan: SplitPlan, backend, core, compress_ratio: int):
    """The plan's decode-tail inputs for the ratio; rebuilt (and counted) only if the step's
    metadata tensors were replaced since the plan took its views of them."""
    tail = plan.tails[compress_ratio]
    if tail.built_from(*split_plan.ratio_rows(core, compress_ratio)):
        return tail
    tail = plan.tails[compress_ratio] = split_plan.step_tail_inputs(
        backend, core, plan.boundary, compress_ratio
    )
    plan.tail_builds[compress_ratio] = plan.tail_builds.get(compress_ratio, 0) + 1
    return tail


def _tail_graphs(backend, plan: SplitPlan) -> TailGraphs | None:
    """The backend's decode-tail graphs with SGLANG_MIXGRAPH_SPLIT_TAIL_GRAPHS=1, made on first
    use with the plan's kernel and scheduling-metadata factory."""
    if not TAIL_GRAPHS_FLAG.get():
        return None
    graphs = getattr(backend, BACKEND_SPLIT_TAIL_GRAPHS, None)
    if graphs is None:
        graphs = TailGraphs(plan.kernel, split_plan.new_sched_meta)
        setattr(backend, BACKEND_SPLIT_TAIL_GRAPHS, graphs)
    return graphs


def _decode_tail(backend, plan: SplitPlan, layer_id: int, tail, q_tail, caches, attn_sink):
    """The layer's decode rows: replayed from the tail's graph where one serves, else the
    plain kernel call (counted by reason; a failed capture is logged, once)."""
    swa_cache, extra_cache = caches
    graphs = _tail_graphs(backend, plan)
    if graphs is not None:
        why = graphs.unreplayable(tail.num_rows)
        if why is None:
            ran = graphs.run(layer_id, tail, q_tail, swa_cache, attn_sink, extra_cache)
            if ran is not None:
                out, replayed = ran
                count_event("tail_graph_replays" if replayed else "tail_graph_schedules")
                return out
            why = "capture_failed"  # once: every later call finds the graphs broken
            logger.warning(
                "sglang-mixgraph: %s: decode-tail CUDA graphs off for this process, the split "
                "calls the decode kernel eagerly: the capture failed (%s)",
                PATCH_ID,
                graphs.broken,
            )
        count_event(f"tail_graph_eager.{why}")
    return run_tail(tail, q_tail, swa_cache, attn_sink, extra_cache, plan.kernel)


def _split_forward(original, backend, call: dict):
    """The layer's split attention (``call``: upstream's keyword arguments), or None where
    upstream's body runs instead (no plan for the step, or the layer does not match it)."""
    forward_batch = call["forward_batch"]
    plan = get_plan(backend)
    if plan is None or not plan.matches(forward_batch):
        return None
    if call.get("cos_sin_cache") is not None:
        return _mismatch(backend, plan, "mega")
    q, layer_id, compress_ratio = call["q"], call["layer_id"], call["compress_ratio"]
    pool, core, attn_sink = call["token_to_kv_pool"], call["core_attn_metadata"], call["attn_sink"]
    b = plan.boundary
    heads = q.shape[-2]
    if q.shape[0] != b.num_rows:
        return _mismatch(backend, plan, "shape")
    if compress_ratio not in plan.tails:
        return _mismatch(backend, plan, "low_ratio")
    if heads != plan.heads:
        if plan.heads is not None or heads not in (64, 128):
            return _mismatch(backend, plan, "heads")
        plan.heads = heads
    tail = _tail_of(plan, backend, core, compress_ratio)
    o_all = None
    if b.b0:
        # Upstream's sparse prefill over every row with the prefill-only workspace, first:
        # the layer's longest kernel is queued before the decode tail's host work.
        o_all = original(backend, **call)
    caches = _layer_caches(backend, pool, layer_id, compress_ratio)
    q4 = q if q.dim() == 4 else q.unsqueeze(1)
    q_tail = q4.narrow(0, b.b0, b.num_decode_reqs)
    o_dec = _decode_tail(backend, plan, layer_id, tail, q_tail, caches, attn_sink).squeeze(1)
    plan.decode_calls[compress_ratio] = plan.decode_calls.get(compress_ratio, 0) + 1
    count_event(_LAYERS_SPLIT[compress_ratio])
    if o_all is None:
        return assemble_rows(b, None, o_dec, like=o_dec)
    if o_dec.shape[1] != o_all.shape[1]:
        # the Q8KV8 path returns only the active heads (``_forward_prefill_sparse_q8kv8``)
        o_dec = o_dec[:, : o_all.shape[1]]
    return copy_in_join(b, o_all, o_dec)


def _split_or_upstream(original, backend, call: dict):
    out = _split_forward(original, backend, call)
    return original(backend, **call) if out is None else out


# The two AROUNDs name upstream's parameters one by one: the drift check
# (``registry.incompatibility``) reads what a hook passes on from its own signature.
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
    return _split_or_upstream(original, backend, call)


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
    call = dict(
        q=q,
        layer_id=layer_id,
        compress_ratio=compress_ratio,
        forward_batch=forward_batch,
        token_to_kv_pool=token_to_kv_pool,
        core_attn_metadata=core_attn_metadata,
        attn_sink=attn_sink,
    )
    return _split_or_upstream(original, backend, call)
