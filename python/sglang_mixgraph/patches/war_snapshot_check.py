"""Debug check: nothing reads the scheduler-shared tables after a forward published read-done.

Once a prefill forward publishes its WAR read-done event, the scheduler may rewrite
``req_to_token`` and ``full_to_swa_index_mapping`` for the next batch while that forward still
runs (``Scheduler._apply_war_barrier``). A reader of those tables that runs later in the same
forward reads whatever the scheduler wrote: silent corruption. With
``SGLANG_DEBUG_WAR_SNAPSHOT=1`` every reader of the two tables in SGLang's DeepSeek-V4 backend,
its ``dsv4`` modules and its memory pool (``READERS``; what the others are is ``NOT_HOOKED``)
raises :class:`WarSnapshotViolation`, naming the reader and the forward, when it runs after its
forward published read-done; the mark ends at the WAR barrier or when the next forward starts.
A read issued before the publish on another CUDA stream than the one the event is recorded on
is not ordered by the event: the publish raises for it. Off: no hook is installed, so it costs
nothing. For tests and debugging only; it changes no result. Retired when upstream ships its
own snapshot assertions.
"""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookType

from sglang_mixgraph import counters
from sglang_mixgraph.flags import bool_flag
from sglang_mixgraph.registry import Hook, Patch

PATCH_ID = "war_snapshot_check"
BACKEND = "sglang.srt.layers.attention.deepseek_v4_backend.DeepseekV4AttnBackend"
POOL = "sglang.srt.mem_cache.deepseek_v4_memory_pool.DeepSeekV4TokenToKVPool"
DSV4 = "sglang.srt.layers.attention.dsv4"
MODEL_RUNNER = "sglang.srt.model_executor.model_runner.ModelRunner"
PUBLISHER = (
    "sglang.srt.model_executor.runner_utils.shared_read_event."
    "maybe_publish_prefill_shared_read_done"
)

FLAG = bool_flag(
    "SGLANG_DEBUG_WAR_SNAPSHOT",
    False,
    "Debug: raise when a DSV4 reader of req_to_token / full_to_swa_index_mapping runs after its "
    "prefill forward published the WAR read-done event.",
)


class WarSnapshotViolation(RuntimeError):
    """A scheduler-shared table was read after read-done was published for the forward."""


class _Published:
    """The forward that published read-done last, until the barrier or the next forward."""

    def __init__(self):
        self._runner = None  # the model runner (lives as long as the process)
        self._pass_id = -1
        self._backend = ""

    def mark(self, model_runner) -> None:
        self._runner = model_runner
        self._pass_id = getattr(model_runner, "forward_pass_id", -1)
        self._backend = type(getattr(model_runner, "attn_backend", None)).__name__

    def clear(self) -> None:
        self._runner = None

    def active(self) -> str | None:
        """The published forward, described, while it is still the current one."""
        runner = self._runner
        if runner is None or getattr(runner, "forward_pass_id", -1) != self._pass_id:
            return None
        return f"forward #{self._pass_id} ({self._backend})"


PUBLISHED = _Published()


def _current_stream():
    """The CUDA stream reads and the event are issued on; None without CUDA (CPU runs)."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.current_stream()


class _StreamReads:
    """The watched reads of the running forward so far, each with the stream it was issued on."""

    def __init__(self):
        self._reads = []

    def add(self, reader: str, stream) -> None:
        if stream is not None:
            self._reads.append((reader, stream))

    def off(self, stream) -> list:
        """The reads issued on another stream than ``stream``."""
        if stream is None:
            return []
        return [(reader, s) for reader, s in self._reads if s != stream]

    def clear(self) -> None:
        self._reads.clear()


READS = _StreamReads()


def _violation(message: str) -> WarSnapshotViolation:
    counters.count(PATCH_ID, "violations")
    return WarSnapshotViolation(
        f"{message} (SGLANG_DEBUG_WAR_SNAPSHOT). SGLANG_FORCE_COARSE_WAR_BARRIER=1 keeps the "
        "whole-forward barrier meanwhile."
    )


def around_publish(original, model_runner, shared_read_ends, device_module):
    """AROUND ``maybe_publish_prefill_shared_read_done``: mark the forward when this call
    recorded a new event (upstream's gates may keep it back; a loop without the WAR barrier
    leaves the previous event in the mailbox). A read of this forward issued on another stream
    than the event's is not ordered before the event: raise for it."""
    before = getattr(model_runner, "shared_read_done_event", None)
    result = original(model_runner, shared_read_ends, device_module)
    event = getattr(model_runner, "shared_read_done_event", None)
    if event is not None and event is not before:
        stream = _current_stream()
        off = READS.off(stream)
        READS.clear()
        if off:
            reader, other = off[0]
            raise _violation(
                f"{reader} read its table on stream {other}, but forward "
                f"#{getattr(model_runner, 'forward_pass_id', -1)} published the WAR read-done "
                f"event on stream {stream}, which does not order that read"
            )
        PUBLISHED.mark(model_runner)
        counters.count(PATCH_ID, "forwards_marked")
    return result


def before_war_barrier(scheduler):
    """BEFORE ``Scheduler._apply_war_barrier``: the scheduler may write the tables from here on,
    and the forward's host-side reads are over."""
    PUBLISHED.clear()
    READS.clear()


def before_forward(model_runner, *args, **kwargs):
    """BEFORE ``ModelRunner.forward``: a new forward; the previous one's reads are over."""
    READS.clear()


def _reader(target: str, tables: str):
    """A BEFORE hook for one reader: raise before it reads anything, so no state changes."""
    name = ".".join(target.split(".")[-2:])

    def check(*args, **kwargs):
        forward = PUBLISHED.active()
        if forward is not None:
            raise _violation(
                f"{name} read {tables} after {forward} published the WAR read-done event; the "
                "scheduler may already be rewriting it"
            )
        READS.add(name, _current_stream())

    check.__name__ = f"check_{name.rsplit('.', 1)[-1]}"
    return check


R2T, F2S = "req_to_token", "full_to_swa_index_mapping"
BOTH = f"{R2T} and {F2S}"
# Every function of the DSV4 backend, its dsv4 modules and its pool that reads a table, with what
# it reads (the kind and parameters the hook needs: "self" for a method, none for a function).
READERS = (
    (f"{BACKEND}._build_forward_metadata", "method", R2T),
    (f"{BACKEND}.make_core_attn_metadata", "method", BOTH),
    (f"{BACKEND}.init_forward_metadata_prefill", "method", R2T),
    (f"{BACKEND}._build_sparse_prefill_chunk_cache", "method", BOTH),
    (f"{BACKEND}._make_target_verify_c128_metadata", "method", R2T),
    (f"{BACKEND}.make_forward_metadata_from_raw_verify", "method", R2T),
    (f"{BACKEND}.make_forward_metadata_from_raw_decode", "method", R2T),
    (f"{BACKEND}.init_forward_metadata_draft_extend", "method", BOTH),
    (f"{BACKEND}._snapshot_low_ratio_k_slots", "method", R2T),
    (f"{BACKEND}._make_low_ratio_prefill_indexer_inputs", "method", R2T),
    (f"{BACKEND}.get_dspark_swa_page_indices", "method", BOTH),
    (f"{POOL}.translate_loc_from_full_to_swa", "method", F2S),
    (f"{DSV4}.compressor_v2.create_paged_compressor_data", "function", BOTH),
    (f"{DSV4}.compressor_v2._create_online_paged_compressor_data", "function", R2T),
    (f"{DSV4}.online_c128_mtp.OnlineC128MTPController.write_prefix_states", "method", R2T),
    (f"{DSV4}.online_c128_mtp.OnlineC128MTPController.commit_pending", "method", R2T),
    (f"{DSV4}.low_ratio_backend_hip._extend_k_slots", "function", R2T),
    (f"{DSV4}.low_ratio_backend_hip.low_ratio_index_topk_hip_extend", "function", R2T),
    (f"{DSV4}.v41_indexer.scoring.prefill_k_slots", "function", R2T),
    (f"{DSV4}.v41_indexer.scoring.decode_scores", "function", R2T),
    (f"{DSV4}.v41_indexer.scoring.select_decode", "function", R2T),
    (f"{DSV4}.v41_indexer.full_topk.FullTopKIndexer._torch_decode", "method", R2T),
    (f"{DSV4}.v41_indexer.dense_blocks.DenseBlocksBackend.publish_decode", "method", R2T),
    (f"{DSV4}.v41_indexer.dense_blocks.DenseBlocksBackend.consume_decode", "method", R2T),
)
_TRANSLATES = "reads the mapping only through translate_loc_from_full_to_swa (hooked)"
_KEEPS = "keeps a reference to the table, reads none of it"
# The rest of what a search of those modules for the two tables finds, and why no hook is needed.
NOT_HOOKED = {
    f"{BACKEND}.__init__": "keeps references to the tables, reads their shapes only",
    f"{BACKEND}._prefill_graph_tail_capacity": "reads the request pool's size, not its table",
    f"{BACKEND}._snapshot_prefill_shared_reads": "reads through _build_sparse_prefill_chunk_cache",
    f"{BACKEND}.init_forward_metadata_prefill.create": "nested in init_forward_metadata_prefill",
    f"{BACKEND}._build_late_layer_tail_metadata": _TRANSLATES,
    f"{BACKEND}._fill_cuda_graph_swa_out_cache_loc": _TRANSLATES,
    f"{BACKEND}.init_forward_metadata_in_graph": _TRANSLATES,
    f"{BACKEND}._install_early_verify_metadata": _TRANSLATES,
    f"{BACKEND}.init_forward_metadata_for_breakable_cuda_graph_capture": _TRANSLATES,
    f"{BACKEND}.prepare_forward_metadata_for_breakable_cuda_graph_replay": _TRANSLATES
    + " and _build_forward_metadata (hooked)",
    f"{BACKEND}.get_swa_out_cache_loc": _TRANSLATES,
    f"{POOL}.__init__": "creates the mapping slot (None)",
    f"{POOL}.register_mapping": "sets the mapping, reads none of it",
    f"{DSV4}.sparse_prefill_utils.SparsePrefillChunkCache.build": (
        "called only by _build_sparse_prefill_chunk_cache (hooked)"
    ),
    f"{DSV4}.v41_indexer.make_full_topk_indexer": _KEEPS,
    f"{DSV4}.v41_indexer.make_candidate_indexer": _KEEPS,
    f"{DSV4}.v41_indexer.full_topk.FullTopKIndexer.__init__": _KEEPS,
    f"{DSV4}.v41_indexer.dense_blocks.DenseBlocksBackend.__init__": _KEEPS,
}

HOOKS = (
    Hook(
        PUBLISHER,
        "function",
        "model_runner, shared_read_ends, device_module",
        HookType.AROUND,
        around_publish,
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler._apply_war_barrier",
        "method",
        "self",
        HookType.BEFORE,
        before_war_barrier,
    ),
    Hook(f"{MODEL_RUNNER}.forward", "method", "self", HookType.BEFORE, before_forward),
) + tuple(
    Hook(target, kind, "self" if kind == "method" else "", HookType.BEFORE, _reader(target, tables))
    for target, kind, tables in READERS
)

PATCH = Patch(
    id=PATCH_ID,
    summary="debug: raise when a DSV4 shared-table reader runs after its forward published "
    "read-done",
    flags=(FLAG,),
    hooks=HOOKS,
    is_enabled=lambda: bool(FLAG.get()),
    why=(
        "once a prefill forward publishes its WAR read-done event, the scheduler may rewrite "
        "req_to_token and full_to_swa_index_mapping while the forward still runs; a reader later "
        "in that forward reads what the scheduler wrote: silent corruption"
    ),
    how=(
        "debug only: every known DeepSeek-V4 reader of those tables (the metadata build, the "
        "sparse-prefill chunk-cache build, the SWA location translation, the V4.1 index-K "
        "slots) raises WarSnapshotViolation, naming the reader and the forward, when it runs "
        "after its forward published; the mark ends at the WAR barrier or the next forward; off, "
        "no hook is installed"
    ),
    retired_by="upstream ships its own snapshot assertions",
    docs_page="docs/war-read-done.md",
)
