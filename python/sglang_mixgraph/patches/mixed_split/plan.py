"""The per-step decision: split this step or not, and how.

Eager steps are planned AFTER ``DeepseekV4AttnBackend.init_forward_metadata``; breakable-graph
replays AFTER ``prepare_forward_metadata_for_breakable_cuda_graph_replay``, from the live batch,
bound to the replay's static batch and stored on the persistent captured metadata (cleared on
every replay first). Both go through :func:`_plan`: fallbacks (everything a layer would check is
checked here, so nothing needs a fallback chunk cache), the policy (``adaptive`` decides the
whole step with the per-GPU cost model, counting the chunk-cache builds), the decode tail's
per-ratio inputs, and the step's one chunk cache (prefill-only) installed before the first layer.
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_mixgraph.core.attention_rows import batch_attention_rows
from sglang_mixgraph.core.decode_tail import tail_inputs
from sglang_mixgraph.core.mixed_boundary import MixedBoundary, compute_mixed_boundary
from sglang_mixgraph.flags import FLAGS
from sglang_mixgraph.patches.mixed_split.boundary import decode_tail_of
from sglang_mixgraph.patches.mixed_split.state import (
    ALL_RATIOS,
    EAGLE3,
    MIXED_STEP_WAYS,
    POLICY_FLAG,
    SPLIT_SPEC_ALGORITHMS,
    SplitPlan,
    count_event,
    fall_back,
    ref_to,
)
from sglang_mixgraph.upstream_attrs import (
    BACKEND_SPLIT_LAYERS,
    ENVS_REPLAY_READ_DONE,
    METADATA_SPLIT_PLAN,
)

logger = logging.getLogger(__name__)


def _unsupported_reason(backend, forward_batch, metadata, recognised_as: str) -> str | None:
    from sglang.srt.layers.attention import deepseek_v4_backend as dsv4
    from sglang.srt.layers.cp.utils import is_cp_active
    from sglang.srt.runtime_context import get_platform

    if getattr(backend, "trtllm_attn", False):
        return "trtllm"
    try:
        from sglang.srt.layers.attention.deepseek_v4_mega_backend import DeepseekV4MegaAttnBackend

        if isinstance(backend, DeepseekV4MegaAttnBackend):
            return "mega"
    except ImportError:  # pragma: no cover - module exists in 0.5.23
        pass
    if getattr(dsv4, "_is_xpu", False):
        return "xpu"
    if get_platform().is_sm120:
        return "sm120"
    if is_cp_active(forward_batch):
        return "cp"
    if getattr(backend, "hisparse_coordinator", None) is not None:
        return "hisparse"
    if getattr(backend, "is_dsv41", False):
        return "dsv41"
    if getattr(backend, "low_ratios", ()) or not set(layer_mix(backend)) <= set(ALL_RATIOS):
        return "low_ratio"
    if _model_heads(backend) not in (64, 128):
        return "heads"
    if getattr(backend, "is_dspark_draft", False):
        return "dspark"
    reason = _speculative_reason(backend, forward_batch, recognised_as)
    if reason is not None:
        return reason
    if (
        metadata.late_layer_tail is not None
        or getattr(backend, "tail_forward_metadata", None) is not None
    ):
        return "late_tail"
    core = metadata.core_attn_metadata
    if getattr(core, "request_window_layout", None) is not None or (
        getattr(backend.token_to_kv_pool, "request_window", None) is not None
    ):
        return "request_window"
    # ForwardBatch.encoder_swa_replay (a bool) and encoder_swa_compress_rows (optional rows).
    if (
        getattr(forward_batch, "encoder_swa_replay", False)
        or getattr(forward_batch, "encoder_swa_compress_rows", None) is not None
    ):
        return "encoder_replay"
    return None


def _spec_algorithm(backend, forward_batch):
    """The step's speculative algorithm: the batch's, else its model runner's (None: unknown)."""
    algo = getattr(forward_batch, "spec_algorithm", None)
    if algo is None or algo.is_none():
        runner_algo = getattr(getattr(backend, "model_runner", None), "spec_algorithm", None)
        algo = runner_algo if runner_algo is not None else algo
    return algo


def _speculative_reason(backend, forward_batch, recognised_as: str) -> str | None:
    """Why a step with speculative state stays upstream's, or None (no such state, or a MIXED
    step of EAGLE/NEXTN on the target model, whose running rows are plain 1-token decodes:
    docs/mixed-split.md, "Speculative decoding").

    A MIXED step is one ``decode_tail_of`` recognised as built MIXED (``recognised_as`` in
    ``MIXED_STEP_WAYS``), not one labelled MIXED: ``EagerRunner.execute`` runs every eager
    MIXED step as EXTEND before the metadata is built."""
    algo = _spec_algorithm(backend, forward_batch)
    spec_info = getattr(forward_batch, "spec_info", None)
    if not (
        getattr(backend, "mtp_enabled", False)
        or spec_info is not None
        or (algo is not None and not algo.is_none())
    ):
        return None
    if getattr(backend, "is_draft_runner", False):
        return "spec_draft"
    name = getattr(algo, "name", None)
    if name == EAGLE3:
        return "spec_eagle3"
    if recognised_as not in MIXED_STEP_WAYS or name not in SPLIT_SPEC_ALGORITHMS:
        return "spec"
    if spec_info is not None and spec_info.is_verify_input():
        return "spec_verify"
    online_c128 = getattr(backend, "online_c128_mtp", None)
    if online_c128 is not None and online_c128.enabled():
        return "spec_online_c128"
    return None


_coeff_cache: dict[str, Any] = {}


def _cost_coefficients():
    from sglang.srt.runtime_context import get_platform

    from sglang_mixgraph.core import split_cost_model as scm

    sm = getattr(get_platform(), "device_sm", None)
    arch = f"sm{sm}" if sm else None
    key = arch or "unknown"
    if key not in _coeff_cache:
        _coeff_cache[key] = scm.load_coefficients(arch)
    return _coeff_cache[key]


def _present_ratios(backend) -> frozenset[int]:
    """Ratios some layer of this model has: SWA-only always, c4/c128 as the backend lists."""
    present = {0}
    present.update(int(r) for r in getattr(backend, "present_ratios", ()) or ())
    return frozenset(present)


def layer_mix(backend) -> dict[int, int]:
    """``{compress ratio: layers}`` of the layers this backend runs: the pool's per-layer
    ``compression_ratios`` over its pipeline stage (``DeepSeekV4TokenToKVPool.__init__``),
    counted once per pool and kept on the backend."""
    from sglang_mixgraph.core import split_cost_model as scm

    pool = backend.token_to_kv_pool
    kept = getattr(backend, BACKEND_SPLIT_LAYERS, None)
    if kept is not None and kept[0] is pool:
        return kept[1]
    ratios = list(getattr(pool, "compression_ratios", ()) or ())
    start = getattr(pool, "_stage_start", 0) or 0
    end = getattr(pool, "_stage_end", len(ratios))
    mix = scm.layer_mix(ratios[start:end]) if ratios else dict.fromkeys(_present_ratios(backend), 1)
    setattr(backend, BACKEND_SPLIT_LAYERS, (pool, mix))
    return mix


def _model_heads(backend) -> int | None:
    """The model's query heads (``num_attention_heads`` of its config, ``MqaAttentionBase.n_heads``
    in ``models.deepseek_v4``), or None where the backend has no model config.

    On the paths the split takes (CUDA, not SM120, not DSV4.1) the query reaching the attention
    has ``MqaAttentionBase._kernel_num_heads`` heads: the local heads with one attention-TP rank,
    else 64 or ``n_heads``; so ``n_heads`` in ``{64, 128}`` means a head count the decode kernel
    takes, whatever the TP size (a 32-head model on 2 ranks, padded to 64, falls back too)."""
    config = getattr(
        getattr(getattr(backend, "model_runner", None), "model_config", None),
        "hf_text_config",
        None,
    )
    heads = getattr(config, "num_attention_heads", None)
    return heads if isinstance(heads, int) else None


def _adaptive_splits(
    backend, boundary: MixedBoundary, live, exts, mix: dict[int, int], *, replay: bool
) -> bool:
    """Whether the cost model splits this step (``split_cost_model.decide_step``: every layer
    of the step one way, each way with its one chunk cache). A fixed number of operations
    per step (``StepCounts``: no Python loop over the decode requests)."""
    from sglang_mixgraph.core import split_cost_model as scm

    topk = getattr(backend, "index_topk", scm.C4_TOPK)
    n = boundary.num_prefill_reqs + boundary.num_decode_reqs
    counts = scm.StepCounts.from_lists(
        live.seq_lens_cpu[:n],
        exts[:n],
        boundary.num_decode_reqs,
        topk=topk,
        ratios=tuple(r for r in mix if r),
    )
    return scm.decide_step(
        counts,
        mix,
        _cost_coefficients(),
        # A replay's host runs ahead of the GPU; an eager step's host time is exposed.
        regime=scm.REPLAY if replay else scm.EAGER,
    )


def plan_split(backend, forward_batch) -> SplitPlan | None:
    """Decide the split of an eager step; store it (or None) on ``backend.forward_metadata``."""
    from sglang.srt.layers.attention.deepseek_v4_backend import DSV4Metadata

    metadata = getattr(backend, "forward_metadata", None)
    if not isinstance(metadata, DSV4Metadata):
        return None
    setattr(metadata, METADATA_SPLIT_PLAN, None)  # reset on every build
    num_rows = int(forward_batch.input_ids.shape[0]) if forward_batch.input_ids is not None else 0
    return _plan(backend, metadata, forward_batch, forward_batch, num_rows, replay=False)


def _plan(backend, metadata, live, target, num_rows: int, *, replay: bool) -> SplitPlan | None:
    """The split of one step whose scheduler batch is ``live``; the attention will see
    ``target`` (the same batch in eager steps, the replay's static batch under a breakable
    graph) and ``num_rows`` query rows. Stores the plan on ``metadata`` and installs the
    prefill-only chunk cache there. Replays are counted apart (``replays_*``) from eager steps
    (``steps_*``)."""
    decode_tail = decode_tail_of(live)
    if not decode_tail or num_rows <= 0:
        return None
    num_decode, recognised_as = decode_tail
    # The draft model's forwards of a MIXED step (EAGLE's draft extend runs over the same
    # scheduler batch) are counted apart, so `steps_seen` counts each target step once.
    seen = "draft_" if getattr(backend, "is_draft_runner", False) else ""
    count_event(f"{seen}replays_seen" if replay else f"{seen}steps_seen.{recognised_as}")
    reason = _unsupported_reason(backend, live, metadata, recognised_as)
    if reason is not None:
        fall_back(reason)
        return None
    if not backend._use_sparse_prefill(target, num_qo_tokens=num_rows):
        # Dense extend (``DeepseekV4AttnBackend._use_sparse_prefill`` says no): upstream already
        # runs every row through the decode kernel; nothing to split.
        count_event("steps_upstream_dense")
        return None
    exts = live.extend_seq_lens_cpu or []
    try:
        boundary = compute_mixed_boundary(exts, num_decode, num_rows=num_rows)
    except (ValueError, TypeError):
        fall_back("boundary")
        return None
    core = metadata.core_attn_metadata
    if core.swa_page_indices.shape[0] < boundary.decode_end:
        fall_back("rows")
        return None
    mix = layer_mix(backend)
    policy = str(POLICY_FLAG.get())
    if policy == "adaptive":
        if not _adaptive_splits(backend, boundary, live, exts, mix, replay=replay):
            logger.debug("mixed split: adaptive policy keeps step unsplit (%s)", boundary)
            count_event("replays_unsplit_adaptive" if replay else "steps_unsplit_adaptive")
            return None
        logger.debug("mixed split: adaptive splits the step (%s)", boundary)
    try:
        tails = {r: step_tail_inputs(backend, core, boundary, r) for r in sorted(mix)}
    except (ValueError, TypeError, IndexError):
        fall_back("tail_layout")
        return None
    plan = SplitPlan(
        boundary=boundary,
        forward_batch_ref=ref_to(target),
        tails=tails,
        kernel=backend._flash_mla_with_kvcache,
        may_publish=_read_done_may_publish(replay),
        policy=policy,
    )
    for r in tails:
        plan.tail_builds[r] = 1
    setattr(metadata, METADATA_SPLIT_PLAN, plan)
    # The step's one chunk cache, prefill-only, over every row (decode and padding rows empty:
    # the copy-in join), installed before the first layer through the hooked builder (which
    # builds nothing without prefill rows). Nothing else is built for the step: the checks a
    # layer makes were made above, so no layer goes back to upstream's lazy build.
    metadata.sparse_prefill_cache = backend._build_sparse_prefill_chunk_cache(
        target, core, num_qo_tokens=num_rows
    )
    count_event("replays_split" if replay else "steps_split")
    count_event("decode_rows_split", boundary.num_decode_reqs)
    return plan


def ratio_rows(core, ratio: int):
    """The step metadata's tensors a ratio's decode tail reads, as ``built_from`` takes them:
    the SWA page indices and lengths, then the c4 top-k or c128 page indices and lengths (None,
    None for SWA-only), as ``DeepseekV4AttnBackend._forward_attention`` hands them to the kernel."""
    extra_idx = extra_len = None
    if ratio:
        extra_idx = core.sparse_page_indices(ratio)
        extra_len = core.sparse_topk_lengths(ratio)
    return core.swa_page_indices, core.swa_topk_lengths, extra_idx, extra_len


def step_tail_inputs(backend, core, boundary: MixedBoundary, ratio: int):
    """Ratio ``ratio``'s decode-tail inputs for the step: views of its rows of the step's
    metadata (:func:`ratio_rows`) and one scheduling-metadata object, bound to the tail's shape
    at its first layer. Called through the module (``forward`` rebuilds with it, the host
    timers wrap it)."""
    return tail_inputs(
        ratio,
        boundary.b0,
        boundary.num_decode_reqs,
        *ratio_rows(core, ratio),
        sched_meta=new_sched_meta(),
        softmax_scale=backend.softmax_scale,
        use_legacy=not getattr(backend, "_swa_interleaved", False),
    )


def _read_done_may_publish(replay: bool) -> bool:
    """Whether read-done may be published for this step before its first layer: upstream's
    gates (``AttentionBackend.resolve_prefill_shared_read_ends``) allow it, and the step is
    eager (``EagerRunner`` publishes after upstream's snapshot) or a replay with the
    ``replay_read_done`` patch on (upstream publishes none for DSV4 replays)."""
    from sglang.srt.environ import envs

    if (
        envs.SGLANG_FORCE_COARSE_WAR_BARRIER.get()
        or not envs.SGLANG_ENABLE_PREFILL_WAR_READ_DONE.get()
    ):
        return False
    if not replay:
        return True
    read_done = FLAGS.get(ENVS_REPLAY_READ_DONE)  # registered when the read-done patch loads
    return read_done is not None and bool(read_done.get())


def new_sched_meta():
    """A fresh FlashMLASchedMeta, made as upstream makes them
    (``deepseek_v4_backend._create_flashmla_metadata``, looked up at call time)."""
    from sglang.srt.layers.attention import deepseek_v4_backend as dsv4

    return dsv4._create_flashmla_metadata()


def after_init_forward_metadata(result, backend, forward_batch):
    """AFTER ``DeepseekV4AttnBackend.init_forward_metadata(self, forward_batch)``."""
    plan_split(backend, forward_batch)
    return None


def after_prepare_bcg_replay(
    result, backend, capture_metadata, forward_batch, *, static_forward_batch=None, **kwargs
):
    """AFTER ``prepare_forward_metadata_for_breakable_cuda_graph_replay``: plan the replay.

    The runner refreshes the captured metadata in place for the live batch, which is still
    labelled MIXED, while the replayed attention break sees the static EXTEND batch and the
    rows ``deepseek_v4_attention_with_output`` slices to (``global_num_token_non_padded_cpu``,
    the whole bucket when it is None: ``core.attention_rows``). The plan is made from the live
    batch, bound to the static one, and stored on the persistent captured metadata; every
    replay first clears the previous replay's plan, so a stale boundary never reaches a step
    that has none.
    """
    setattr(capture_metadata, METADATA_SPLIT_PLAN, None)
    metadata = getattr(backend, "forward_metadata", None)
    if metadata is not None and metadata is not capture_metadata:
        setattr(metadata, METADATA_SPLIT_PLAN, None)
    target = static_forward_batch if static_forward_batch is not None else forward_batch
    # The rows the break's query really has (``core.attention_rows``, shared with the read-done
    # patch): the live count, or the whole bucket when ``global_num_token_non_padded_cpu`` is
    # None; the boundary then carries the bucket's padding rows after the decode rows.
    rows = batch_attention_rows(target)
    _plan(backend, capture_metadata, forward_batch, target, rows, replay=True)
    return None
