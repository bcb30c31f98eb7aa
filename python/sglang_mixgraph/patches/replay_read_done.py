"""Publish the WAR read-done event for DeepSeek-V4 prefill and mixed breakable-graph replays.

The scheduler fences its next writes to the shared tables (``req_to_token``,
``full_to_swa_index_mapping``) behind the forward's reads of them (``Scheduler._apply_war_barrier``):
a published read-done event ends the fence early, none means waiting for the whole forward. For
DSV4 under a breakable prefill graph upstream never publishes: the runner asks for no snapshot
(``PrefillCudaGraphRunner._prepare_forward_metadata_for_replay`` with ``build_snapshot=False``),
the metadata refresh drops the sparse-prefill chunk cache, and the first attention break
rebuilds it from the shared tables mid-forward. With ``SGLANG_OPT_DSV4_REPLAY_READ_DONE=1`` this
patch builds that cache in the replay prepare, sync-free, for the rows the attention break will
see, and returns ``PRE_REPLAY`` so upstream's own publisher records the event. Every upstream
gate still holds. Retired when upstream snapshots DSV4's captured metadata at replay prepare.
"""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookType

from sglang_mixgraph import counters
from sglang_mixgraph.core.attention_rows import batch_attention_rows
from sglang_mixgraph.fallback import fallback_once
from sglang_mixgraph.flags import bool_flag
from sglang_mixgraph.registry import Hook, Patch
from sglang_mixgraph.upstream_attrs import (
    ENVS_REPLAY_READ_DONE,
    METADATA_SPLIT_PLAN,
    RUNNER_PENDING_READ_DONE,
)

PATCH_ID = "replay_read_done"
RUNNER = "sglang.srt.model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner"
PUBLISHER = (
    "sglang.srt.model_executor.runner_utils.shared_read_event."
    "maybe_publish_prefill_shared_read_done"
)

# The mixed split reads this switch by its name (`upstream_attrs.ENVS_REPLAY_READ_DONE`).
FLAG = bool_flag(
    ENVS_REPLAY_READ_DONE,
    False,
    "DSV4: build the sparse-prefill chunk cache in the breakable-graph replay prepare and publish "
    "the WAR read-done event for prefill and mixed replays (upstream waits for the whole forward).",
)


FALLBACK_REASONS = {
    "not_dsv4": "attention backend is not DeepSeek-V4's",
    "mega": "DeepSeek-V4 mega attention backend",
    "coarse": "SGLANG_FORCE_COARSE_WAR_BARRIER is set",
    "upstream_off": "SGLANG_ENABLE_PREFILL_WAR_READ_DONE is off",
    "cp": "context parallelism",
    "hisparse": "hisparse",
    "late_tail": "decoder SWA bounded replay (late-layer tail metadata)",
    "not_published": "upstream does not publish read-done here (speculative decoding, "
    "hierarchical cache or LMCache): the whole-forward barrier stays",
}


def _fallback(key: str) -> None:
    fallback_once(PATCH_ID, FALLBACK_REASONS[key], key=key)


def _count(event: str, n: int = 1) -> None:
    counters.count(PATCH_ID, event, n)


def attention_rows(static_forward_batch) -> int:
    """The query rows the replayed attention break sees (``core.attention_rows``, the one rule
    the mixed split's replay plan uses too): ``global_num_token_non_padded_cpu``, all of the
    bucket when that is None."""
    return batch_attention_rows(static_forward_batch)


def _decline_reason(backend, forward_batch, static_forward_batch):
    from sglang.srt.environ import envs
    from sglang.srt.layers.attention.deepseek_v4_backend import DeepseekV4AttnBackend
    from sglang.srt.layers.cp.utils import is_cp_active

    if not isinstance(backend, DeepseekV4AttnBackend):
        return "not_dsv4"
    if getattr(backend, "mega_attn", False):
        return "mega"
    # Upstream's own gates of the prefill read-done (AttentionBackend.resolve_prefill_shared_read_ends).
    if envs.SGLANG_FORCE_COARSE_WAR_BARRIER.get():
        return "coarse"
    if not envs.SGLANG_ENABLE_PREFILL_WAR_READ_DONE.get():
        return "upstream_off"
    # DeepseekV4AttnBackend._snapshot_prefill_shared_reads declines these two.
    if is_cp_active(static_forward_batch):
        return "cp"
    if getattr(backend, "hisparse_coordinator", None) is not None:
        return "hisparse"
    metadata = backend.forward_metadata
    if (
        getattr(metadata, "late_layer_tail", None) is not None
        or getattr(backend, "tail_forward_metadata", None) is not None
    ):
        # The late layers read their own metadata, whose chunk cache is built lazily.
        return "late_tail"
    return None


def snapshot_replay(runner, forward_batch, static_forward_batch):
    """Build what the replay would read from the shared tables later; the read-done position,
    or None when this replay keeps upstream's answer."""
    from sglang.srt.layers.attention.base_attn_backend import SharedReadEnds

    mode = forward_batch.forward_mode
    if not (mode.is_mixed() or mode.is_extend_without_speculative()):
        return None
    backend = runner.model_runner.attn_backend
    reason = _decline_reason(backend, forward_batch, static_forward_batch)
    if reason is not None:
        _fallback(reason)
        return None
    label = "mixed" if mode.is_mixed() else "extend"
    rows = attention_rows(static_forward_batch)
    metadata = backend.forward_metadata
    if (
        rows > 0
        and getattr(metadata, METADATA_SPLIT_PLAN, None) is None
        and metadata.sparse_prefill_cache is None
        and backend._use_sparse_prefill(static_forward_batch, num_qo_tokens=rows)
    ):
        # What the first attention break would build lazily (DeepseekV4AttnBackend.
        # _forward_prefill_sparse): the static batch's requests, the break's row count.
        metadata.sparse_prefill_cache = backend._build_sparse_prefill_chunk_cache(
            static_forward_batch, metadata.core_attn_metadata, num_qo_tokens=rows
        )
        _count("caches_prebuilt")
    _count(f"replays_snapshot.{label}")
    model_runner = runner.model_runner
    setattr(
        model_runner,
        RUNNER_PENDING_READ_DONE,
        (label, getattr(model_runner, "shared_read_done_event", None)),
    )
    return SharedReadEnds.PRE_REPLAY


def around_prepare_replay(original, runner, forward_batch, static_forward_batch, shape_key):
    """AROUND ``PrefillCudaGraphRunner._prepare_forward_metadata_for_replay``: upstream prepares
    (and, with the split on, plans) the replay; a DSV4 replay upstream leaves UNKNOWN gets its
    chunk cache built now and answers PRE_REPLAY."""
    from sglang.srt.layers.attention.base_attn_backend import SharedReadEnds

    ends = original(runner, forward_batch, static_forward_batch, shape_key)
    setattr(runner.model_runner, RUNNER_PENDING_READ_DONE, None)
    if (
        ends is not SharedReadEnds.UNKNOWN
        or not getattr(runner, "use_captured_attn_metadata", False)
        or getattr(runner, "_is_full_backend", False)
    ):
        return ends
    snap = snapshot_replay(runner, forward_batch, static_forward_batch)
    return ends if snap is None else snap


def after_publish(result, model_runner, shared_read_ends, device_module):
    """AFTER ``maybe_publish_prefill_shared_read_done``: count the replays whose event upstream
    really recorded (its publish gates may still say no)."""
    pending = getattr(model_runner, RUNNER_PENDING_READ_DONE, None)
    if pending is None:
        return result
    setattr(model_runner, RUNNER_PENDING_READ_DONE, None)
    label, before = pending
    event = getattr(model_runner, "shared_read_done_event", None)
    if event is not None and event is not before:
        _count(f"replays_published.{label}")
    else:
        _fallback("not_published")
    return result


HOOKS = (
    Hook(
        f"{RUNNER}._prepare_forward_metadata_for_replay",
        "method",
        "self, forward_batch, static_forward_batch, shape_key",
        HookType.AROUND,
        around_prepare_replay,
    ),
    Hook(
        PUBLISHER,
        "function",
        "model_runner, shared_read_ends, device_module",
        HookType.AFTER,
        after_publish,
    ),
)


def explain_for_deployment(plan) -> str:
    """For `plan`: whether this deployment's (a graph_plan.GraphPlan) prefill replays publish
    read-done."""
    facts, prefill = plan.facts, plan.prefill
    if not facts.deepseek_v4:
        return "not a DeepSeek-V4 model: upstream's barrier unchanged"
    if prefill.backend != "breakable" or not prefill.buckets:
        return "no breakable prefill graph: nothing to publish (eager steps publish upstream)"
    if facts.speculative_algorithm:
        return f"falls back to upstream: {FALLBACK_REASONS['not_published']}"
    if facts.context_parallel:
        return f"falls back to upstream: {FALLBACK_REASONS['cp']}"
    if facts.hisparse:
        return f"falls back to upstream: {FALLBACK_REASONS['hisparse']}"
    return (
        f"prefill and mixed replays of up to {max(prefill.buckets)} tokens build their "
        "chunk cache at replay prepare and publish read-done"
    )


PATCH = Patch(
    id=PATCH_ID,
    summary="DSV4 breakable prefill/mixed replays: chunk cache built at replay prepare, "
    "WAR read-done published",
    flags=(FLAG,),
    hooks=HOOKS,
    is_enabled=lambda: bool(FLAG.get()),
    explain=explain_for_deployment,
    why=(
        "under a breakable prefill graph upstream never publishes DeepSeek-V4's WAR read-done "
        "event: the runner asks for no snapshot, the metadata refresh drops the sparse-prefill "
        "chunk cache and the first attention break rebuilds it from the shared tables "
        "mid-forward, so the scheduler's next writes wait for the whole forward"
    ),
    how=(
        "AROUND PrefillCudaGraphRunner._prepare_forward_metadata_for_replay: the chunk cache is "
        "built in the replay prepare, sync-free, for the rows the attention break will see, and "
        "PRE_REPLAY is returned so upstream's own publisher records the event; every upstream "
        "gate still holds"
    ),
    upstream_pr=(
        "SGLang PR #30420 (breakable CUDA graphs for DeepSeek-V4's mixed-chunk steps) builds the "
        "chunk cache at replay prepare and publishes the WAR read-done event the same way"
    ),
    retired_by="upstream snapshots DeepSeek-V4's captured metadata at replay prepare",
    docs_page="docs/war-read-done.md",
)
