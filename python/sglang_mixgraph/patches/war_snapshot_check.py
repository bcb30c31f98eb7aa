"""Debug check: nothing reads the scheduler-shared tables after a forward published read-done.

Once a prefill forward publishes its WAR read-done event, the scheduler may rewrite
``req_to_token`` and ``full_to_swa_index_mapping`` for the next batch while that forward still
runs (``Scheduler._apply_war_barrier``). A reader of those tables that runs later in the same
forward reads whatever the scheduler wrote: silent corruption. With
``SGLANG_DEBUG_WAR_SNAPSHOT=1`` every known DSV4 reader (the metadata build, the sparse-prefill
chunk-cache build, the SWA location translation, the V4.1 index-K slots) raises
:class:`WarSnapshotViolation`, naming the reader and the forward, when it runs after its
forward published read-done; the mark ends at the WAR barrier or when the next forward starts.
Off: no hook is installed, so it costs nothing. For tests and debugging only; it changes no
result. Retired when upstream ships its own snapshot assertions.
"""

from __future__ import annotations

from typing import Optional

from sglang.srt.plugins.hook_registry import HookType

from sglang_mixgraph import counters
from sglang_mixgraph.flags import bool_flag
from sglang_mixgraph.registry import Hook, Patch

PATCH_ID = "war_snapshot_check"
BACKEND = "sglang.srt.layers.attention.deepseek_v4_backend.DeepseekV4AttnBackend"
POOL = "sglang.srt.mem_cache.deepseek_v4_memory_pool.DeepSeekV4TokenToKVPool"
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

    def active(self) -> Optional[str]:
        """The published forward, described, while it is still the current one."""
        runner = self._runner
        if runner is None or getattr(runner, "forward_pass_id", -1) != self._pass_id:
            return None
        return f"forward #{self._pass_id} ({self._backend})"


PUBLISHED = _Published()


def around_publish(original, model_runner, shared_read_ends, device_module):
    """AROUND ``maybe_publish_prefill_shared_read_done``: mark the forward when this call
    recorded a new event (upstream's gates may keep it back; a loop without the WAR barrier
    leaves the previous event in the mailbox)."""
    before = getattr(model_runner, "shared_read_done_event", None)
    result = original(model_runner, shared_read_ends, device_module)
    event = getattr(model_runner, "shared_read_done_event", None)
    if event is not None and event is not before:
        PUBLISHED.mark(model_runner)
        counters.count(PATCH_ID, "forwards_marked")
    return result


def before_war_barrier(scheduler):
    """BEFORE ``Scheduler._apply_war_barrier``: the scheduler may write the tables from here on,
    and the forward's host-side reads are over."""
    PUBLISHED.clear()


def _reader(target: str, tables: str):
    """A BEFORE hook for one reader: raise before it reads anything, so no state changes."""
    name = ".".join(target.split(".")[-2:])

    def check(*args, **kwargs):
        forward = PUBLISHED.active()
        if forward is not None:
            counters.count(PATCH_ID, "violations")
            raise WarSnapshotViolation(
                f"{name} read {tables} after {forward} published the WAR read-done event; the "
                "scheduler may already be rewriting it (SGLANG_DEBUG_WAR_SNAPSHOT). "
                "SGLANG_FORCE_COARSE_WAR_BARRIER=1 keeps the whole-forward barrier meanwhile."
            )

    check.__name__ = f"check_{name.rsplit('.', 1)[-1]}"
    return check


_READERS = (
    (
        f"{BACKEND}._build_forward_metadata",
        "method",
        "self, forward_batch",
        "req_to_token",
    ),
    (
        f"{BACKEND}._build_sparse_prefill_chunk_cache",
        "method",
        "self, forward_batch, core_attn_metadata, *, num_qo_tokens",
        "req_to_token and full_to_swa_index_mapping",
    ),
    (
        f"{POOL}.translate_loc_from_full_to_swa",
        "method",
        "self, kv_indices",
        "full_to_swa_index_mapping",
    ),
    (
        "sglang.srt.layers.attention.dsv4.v41_indexer.scoring.prefill_k_slots",
        "function",
        "*, req_to_token, req_pool_indices, seq_lens_cpu, ratio",
        "req_to_token",
    ),
)

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
) + tuple(
    Hook(target, kind, sig, HookType.BEFORE, _reader(target, tables))
    for target, kind, sig, tables in _READERS
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
)
