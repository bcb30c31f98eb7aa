"""SGLANG_MIXGRAPH_BCG_COMPRESS_PLAN_CAP=1: DeepSeek-V4 breakable prefill captures launch the
c4/c128 compressors over a plan capped to the events a batch can have, not one row per token.

Upstream builds the capture's compressor prefill plan at the bucket's N rows
(``DeepseekV4AttnBackend._build_forward_metadata`` with ``use_prefill_cuda_graph=True``), and
``compress_forward`` / ``compress_norm_rope_store`` size their grids from the plan's rows, so
every replay launches N x 8 ``flash_c128_prefill`` blocks although a step has about N/128
events; the rows past the live events are invalid and return at once. The planner writes the
valid rows first (``plan_compress_prefill_kernel0`` in c_plan.cuh appends through a counter and
pads the tail), so here ``CompressorBackendMixin._get_paged_compress_metadata`` hands a capture
the plan with ``plan_c`` viewed to its first ``core.compress_events.plan_cap`` rows, a bound
that holds for every batch of at most the request pool's size; the view shares storage, so
upstream's full-size refresh at replay is untouched, and ``plan_w`` is never capped. Each
replay's batch is checked on the host first; a batch over the cap runs eagerly (said once).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mixgraph import counters
from sglang_mixgraph.core.compress_events import batch_bound, compress_events, plan_cap
from sglang_mixgraph.fallback import fallback_once
from sglang_mixgraph.flags import bool_flag
from sglang_mixgraph.registry import Hook, Patch
from sglang_mixgraph.upstream_attrs import BACKEND_COMPRESS_PLAN_CAPS

PATCH_ID = "compress_plan_cap"
COMPRESSOR_MODULE = "sglang.srt.layers.attention.dsv4.compressor_v2"
GET_PLAN = f"{COMPRESSOR_MODULE}.CompressorBackendMixin._get_paged_compress_metadata"
PLAN_MODULE = "sglang.kernels.ops.attention.dsv4.compress"
PREFILL_PLAN = f"{PLAN_MODULE}.CompressorPrefillPlan"
BCG_CONTEXT = "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context"
IN_BCG = f"{BCG_CONTEXT}.is_in_breakable_cuda_graph"
RUNNER = "sglang.srt.model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner"
CAN_RUN = f"{RUNNER}.can_run_graph"

FLAG = bool_flag(
    "SGLANG_MIXGRAPH_BCG_COMPRESS_PLAN_CAP",
    False,
    "DeepSeek-V4 breakable prefill graphs: capture the c4/c128 compressors over a plan capped to "
    "the compress events a batch can have (upstream launches one block row per bucket token).",
)

FALLBACKS = {
    "online": "online c128 compression (SGLANG_OPT_USE_ONLINE_COMPRESS) builds its own plan: "
    "not capped",
    "no_pool": "the attention backend has no request pool size: plans not capped",
    "exact_plan": "a prefill plan whose rows are not the step's query rows (an exact host "
    "plan) inside a breakable graph: not capped",
    "no_lens": "a replay without host sequence/extend lengths cannot be checked: runs eagerly",
    "over_cap": "a batch has more compress events than the captured plan's cap: runs eagerly",
}


def _fallback(key: str) -> None:
    fallback_once(PATCH_ID, FALLBACKS[key], key=key)


@functools.cache
def _module(name: str):
    return importlib.import_module(name)


def _in_breakable_graph() -> bool:
    return _module(BCG_CONTEXT).is_in_breakable_cuda_graph()


def request_bound(backend) -> int | None:
    """The most requests a batch on ``backend`` holds: the request pool's slots (every request of
    a batch holds one) and the backend's own graph batch limit, which
    ``PrefillCudaGraphRunner.can_replay_locally`` enforces; None without a pool."""
    pool = getattr(getattr(backend, "model_runner", None), "req_to_token_pool", None)
    size = getattr(pool, "size", None)
    if size is None:
        return None
    limit = getattr(backend, "prefill_cuda_graph_max_batch_size", None)
    return int(size) if limit is None else min(int(size), int(limit))


def capped_plan(plan, ratio: int, max_batch: int):
    """``plan`` with ``plan_c`` viewed to its cap (the same storage), or ``plan`` when the cap
    keeps every row."""
    rows = plan.plan_c.shape[0]
    cap = plan_cap(rows, ratio, max_batch)
    if cap >= rows:
        return plan
    return plan._replace(plan_c=plan.plan_c[:cap])


def around_get_paged_compress_metadata(original, self, compress_ratio, *args, **kwargs):
    """AROUND ``CompressorBackendMixin._get_paged_compress_metadata``: inside a breakable graph,
    a prefill plan comes back with its compress rows capped; everything else as upstream."""
    plan = original(self, compress_ratio, *args, **kwargs)
    if not FLAG.get() or not _in_breakable_graph():
        return plan
    if not isinstance(plan, _module(PLAN_MODULE).CompressorPrefillPlan):
        return plan  # decode plans hold one row per request already
    if _module(COMPRESSOR_MODULE)._use_online_compress(compress_ratio):
        _fallback("online")
        return plan
    rows = plan.plan_c.shape[0]
    out_loc = self._get_out_loc(compress_ratio)
    if out_loc is None or out_loc.shape[0] != rows or plan.plan_w.shape[0] != rows:
        # The cap bounds the events of a plan sized to the step's query rows (the capture's
        # GPU plan); a host plan already holds exactly its events.
        _fallback("exact_plan")
        return plan
    bound = request_bound(self)
    if bound is None:
        _fallback("no_pool")
        return plan
    ratio = int(compress_ratio)
    self.__dict__.setdefault(BACKEND_COMPRESS_PLAN_CAPS, {})[ratio] = bound
    capped = capped_plan(plan, ratio, batch_bound(rows, bound))
    if capped is not plan:
        counters.count(PATCH_ID, f"plans_capped.c{ratio}")
    return capped


def replay_fits(caps: dict[int, int], seq_lens, extend_lens) -> bool:
    """Does a batch fit every capped plan? Its events at each ratio against the cap of a plan
    as small as its own rows (its bucket is never smaller, and caps grow with rows): always
    true for a batch within the request bound the plans were capped for."""
    rows = sum(extend_lens)
    return all(
        compress_events(seq_lens, extend_lens, ratio)
        <= plan_cap(rows, ratio, batch_bound(rows, bound))
        for ratio, bound in caps.items()
    )


def around_can_run_graph(original, self, forward_batch, *args, **kwargs):
    """AROUND ``PrefillCudaGraphRunner.can_run_graph``: a batch upstream would replay is checked
    against the capped plans on the host; one that does not fit runs eagerly, or, where DP ranks
    already agreed to replay, stops with the reason (an eager rank would desync the group)."""
    ok = original(self, forward_batch, *args, **kwargs)
    if not ok or not FLAG.get():
        return ok
    caps = getattr(self.model_runner.attn_backend, BACKEND_COMPRESS_PLAN_CAPS, None)
    if not caps:
        return ok
    seq_lens, extend_lens = forward_batch.seq_lens_cpu, forward_batch.extend_seq_lens_cpu
    if seq_lens is None or extend_lens is None:
        fits, key = False, "no_lens"
    else:
        fits, key = replay_fits(caps, _ints(seq_lens), _ints(extend_lens)), "over_cap"
    if fits:
        counters.count(PATCH_ID, "batches_checked")
        return True
    if getattr(forward_batch, "global_num_tokens_cpu", None) is not None:
        raise RuntimeError(
            f"sglang-mixgraph {PATCH_ID}: {FALLBACKS[key]}, but the DP ranks already voted to "
            f"replay; set {FLAG.name}=0 (caps by ratio: {caps})"
        )
    _fallback(key)
    return False


def _ints(values) -> list[int]:
    return [int(v) for v in (values.tolist() if hasattr(values, "tolist") else values)]


def explain_for_deployment(plan) -> str:
    """For `plan`: whether this deployment (a graph_plan.GraphPlan) captures capped plans."""
    if not plan.facts.deepseek_v4:
        return "not a DeepSeek-V4 model: no compressor plans"
    if plan.prefill.backend != "breakable" or not plan.prefill.buckets:
        return "no breakable prefill graph: eager steps size their plans exactly"
    return (
        "breakable prefill captures launch the c4/c128 compressors over plans capped to "
        "(N + (r-1)*B)/r rows (B: the request pool's size) instead of N; each replay's batch is "
        "checked on the host"
    )


HOOKS = (
    Hook(
        GET_PLAN,
        "method",
        "self, compress_ratio",
        HookType.AROUND,
        around_get_paged_compress_metadata,
    ),
    Hook(CAN_RUN, "method", "self, forward_batch", HookType.AROUND, around_can_run_graph),
)

PATCH = Patch(
    id=PATCH_ID,
    summary="DeepSeek-V4 breakable prefill captures run the compressors over capped plans",
    flags=(FLAG,),
    hooks=HOOKS,
    is_enabled=lambda: bool(FLAG.get()),
    explain=explain_for_deployment,
    why=(
        "DeepSeek-V4's breakable prefill capture builds the compressor prefill plan with one "
        "compress row per bucket token, and flash_c128_prefill / flash_c4_prefill / the "
        "norm-rope store size their grids from it: every replay launches N x 8 c128 blocks for "
        "about N/128 events (0.15 ms eager, 2.0 ms replayed over 29 calls on an H100)"
    ),
    how=(
        "inside a breakable graph, CompressorBackendMixin._get_paged_compress_metadata returns "
        "the prefill plan with plan_c viewed to its first min(N, (N + (r-1)*B)//r) rows (B: the "
        "request pool's size), where the planner puts every valid row; the view shares the "
        "plan's storage, so the replay refresh is upstream's; PrefillCudaGraphRunner."
        "can_run_graph checks each batch's events against the cap on the host"
    ),
    upstream_pr=None,
    retired_by=(
        "upstream's compressor prefill kernels reading a device-side count of valid plan rows "
        "(or a capture plan sized to the events), so captured grids no longer scale with N"
    ),
    docs_page="docs/compress-plan-cap.md",
    reads=(
        (PREFILL_PLAN, type),
        (IN_BCG, Callable),
        (f"{COMPRESSOR_MODULE}._use_online_compress", Callable),
        (f"{COMPRESSOR_MODULE}.CompressorBackendMixin._get_out_loc", Callable),
    ),
)
