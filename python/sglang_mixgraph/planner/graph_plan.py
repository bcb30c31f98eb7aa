"""The graph planner: what a resolved deployment's prefill graph configuration is and needs.

It takes a deployment's typed facts (`deployment_facts.Deployment`), never the server
arguments, and owns the one prefill bucket derivation (`derive_buckets`: the `graph_config`
patch applies it during resolution, and `plan` shows it with the same inputs), the
capture-memory estimate (`capture_estimate`), the startup validations (`validations`) and
the whole report of a resolution (`graph_plan` -> `GraphPlan`, which carries the memory line
`memory_fit.memory_fit` computed beside it). Results are typed;
`sglang-mixgraph plan` turns them into text or JSON (resolution/plan_format.py). Nothing here
changes a resolution or logs: the patch's hooks decide, this module computes. sglang is imported inside the functions only, so the plugin
stays cheap to load.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sglang_mixgraph.bcg_rules import GraphDecisions, RuleMatch
from sglang_mixgraph.core.capture_memory import (
    CaptureEstimate,
    MemoryBudget,
    ModelShape,
    Verdict,
)
from sglang_mixgraph.core.prefill_buckets import PaddingProfile, derivation_gap
from sglang_mixgraph.planner.deployment_facts import Deployment
from sglang_mixgraph.planner.memory_fit import MemoryFit
from sglang_mixgraph.target_gpu import GpuSpec

if TYPE_CHECKING:  # upstream's enum, imported where a function runs
    from sglang.srt.model_executor.cuda_graph_config import Backend

# Upstream's floor for the logits all-gather
# (`sglang.srt.layers.logits_processor.LogitsProcessor.__init__`).
LOGITS_GATHER_FLOOR = 128


class GraphConfigError(ValueError):
    """A prefill graph configuration that would fail during capture."""


# --------------------------------------------------------------------------- bucket derivation


def unhandled(facts: Deployment) -> str | None:
    """A configuration the derivation does not handle (upstream's list stays), or None."""
    from sglang.srt.model_executor.cuda_graph_config import Backend

    backend = facts.prefill_graph.backend
    if backend != Backend.BREAKABLE:
        return None if backend == Backend.DISABLED else f"prefill graph backend {backend!r}"
    return derivation_gap(
        pp_size=facts.memory.pp_size,
        context_parallel=bool(facts.prefill_cp),
        speculative=facts.speculative_algorithm is not None,
        chunked=bool(facts.chunked),
        pd_decode=facts.disaggregation_mode == "decode",
        dllm=bool(facts.dllm),
    )


def bucket_top(facts: Deployment, upstream_max_bs: int | None) -> int:
    """The largest size the prefill list must serve: the per-rank chunk, under upstream's
    own cap on the prefill max_bs (MLA 8192, --max-total-tokens; see
    `sglang.srt.arg_groups.memory_hook.handle_gpu_memory_settings`)."""
    return min(facts.chunk_per_rank, upstream_max_bs) if upstream_max_bs else facts.chunk_per_rank


def derive_buckets(
    facts: Deployment, upstream_max_bs: int | None, *, band: bool = True
) -> list[int]:
    """The derived prefill bucket list: the patch applies it, `plan` shows it.

    upstream_max_bs: the prefill max_bs upstream resolved before the patch replaced it.
    band: with the mixed band (buckets below C for the page-floored mixed steps); the
    settlement leaves it out when the capture estimate fits only without it.
    Raises GraphConfigError when the chunk cannot fit under the MegaMoE cap (capture would
    fail), BucketDerivationError when the inputs admit no list.
    """
    from sglang_mixgraph.core.prefill_buckets import (
        bucket_alignment,
        ceil_align,
        derive_prefill_buckets,
    )

    top = bucket_top(facts, upstream_max_bs)
    cap = facts.mega_moe_cap
    alignment = bucket_alignment(
        attn_tp_size=facts.attn_tp_size, deepep=facts.moe_a2a_backend == "deepep"
    )
    if cap is not None and ceil_align(top, alignment) > cap:
        # A steady mixed step is C tokens, so its bucket cannot fit under the cap. Upstream
        # checks the chunk against the cap only for some checkpoints
        # (`mega_moe_hook.validate_mega_moe_token_budget_for_model`); capture would assert.
        raise GraphConfigError(
            f"MegaMoE: the per-rank chunked prefill size {top} (a steady mixed step, so the "
            f"largest prefill CUDA-graph bucket) exceeds SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK="
            f"{cap}. Raise the variable to at least {ceil_align(top, alignment)}, lower "
            f"--chunked-prefill-size to {cap * facts.attn_dp_size} or less, or --disable-prefill-cuda-graph."
        )
    return derive_prefill_buckets(
        chunk_per_rank=top,
        running_per_rank=facts.running_per_rank,
        cap=cap,
        alignment=alignment,
        page_size=facts.page_size if band else 1,
    )


def derive_fitting_buckets(facts: Deployment, upstream_max_bs: int | None) -> tuple[list[int], str]:
    """The derived list with the mixed band where it is safe, and a note when it was left out.

    The band only for DeepSeek-V4, whose capture the estimate models (each band bucket pins
    its own captured metadata and indexer logits), and only when the estimate says the list
    with it fits: at a context width of 1M the band alone would take about 20 GiB.
    """
    narrow = derive_buckets(facts, upstream_max_bs, band=False)
    if not facts.deepseek_v4:
        return narrow, ""
    banded = derive_buckets(facts, upstream_max_bs, band=True)
    if banded == narrow:
        return narrow, ""
    verdict = capture_estimate(facts, banded, capture_chunk(facts, banded)).verdict
    if verdict is not None and verdict.fits:
        return banded, ""
    return narrow, (
        f"without the {len(banded) - len(narrow)} mixed-band buckets below {max(banded)}: "
        "with them the capture estimate does not fit"
    )


# --------------------------------------------------------------------------- capture estimate


def memory_for(facts: Deployment, chunk_per_rank: int) -> MemoryBudget | None:
    """core.capture_memory.MemoryBudget from the deployment's memory settings and its GPU."""
    from sglang.srt.utils.common import get_device_memory_capacity

    from sglang_mixgraph.core.capture_memory import MiB, decode_graph_reserve_bytes, memory_budget

    mem = facts.memory
    gpu_mib = get_device_memory_capacity(mem.device)
    if not gpu_mib or facts.mem_fraction_static is None:
        return None
    return memory_budget(
        total_bytes=int(gpu_mib * MiB),
        mem_fraction_static=float(facts.mem_fraction_static),
        chunk_per_rank=chunk_per_rank,
        tp_size=facts.tp_size,
        pp_size=mem.pp_size,
        decode_reserve_bytes=decode_graph_reserve_bytes(
            decode_max_bs=mem.decode_max_bs,
            decode_graph_on=mem.decode_graph_on,
            attn_dp_enabled=facts.dp_attention,
            attn_dp_size=facts.attn_dp_size,
            prefill_node=mem.prefill_node,
        ),
        # `memory_hook.reserve_for_deepep_a2a_mb`
        deepep_reserve_bytes=(
            2 * 1024 * MiB
            if mem.decode_graph_on and not mem.prefill_node and facts.moe_a2a_backend == "deepep"
            else 0
        ),
    )


@dataclass(frozen=True)
class CaptureReport:
    """The capture-memory estimate of one bucket list against the deployment's budget."""

    estimate: CaptureEstimate
    shape: ModelShape
    budget: MemoryBudget | None  # None: GPU memory or mem_fraction_static unknown
    verdict: Verdict | None  # None with the budget
    kv_sized_after_capture: bool = False  # capture memory then comes out of the KV pool
    advice_max_bs_prefill: int | None = None  # only when it does not fit
    advice_mem_fraction_static: float | None = None

    @property
    def fits(self) -> bool | None:
        return None if self.verdict is None else self.verdict.fits


UNKNOWN_BUDGET = "GPU memory or mem_fraction_static unknown"


def capture_chunk(facts: Deployment, buckets: Sequence[int]) -> int:
    """The chunk the eager activation reserve is sized for (the largest bucket without one)."""
    return facts.chunk_per_rank if facts.chunked else max(buckets)


def capture_estimate(
    facts: Deployment, buckets: Sequence[int], chunk_per_rank: int
) -> CaptureReport:
    from sglang_mixgraph.core.capture_memory import (
        decide,
        estimate_capture_bytes,
        largest_fitting_prefix,
    )

    shape = facts.shape
    est = estimate_capture_bytes(buckets, shape)
    budget = memory_for(facts, chunk_per_rank)
    if budget is None:
        return CaptureReport(est, shape, None, None)
    verdict = decide(est.total, budget.available)
    fitting = mfs = None
    if not verdict.fits:
        fitting = largest_fitting_prefix(buckets, shape, budget.available)
        mfs = _mem_fraction_that_fits(est.total, budget, verdict.margin_fraction)
    return CaptureReport(
        est,
        shape,
        budget,
        verdict,
        kv_sized_after_capture=facts.memory.kv_sized_after_capture,
        advice_max_bs_prefill=fitting,
        advice_mem_fraction_static=mfs,
    )


def _mem_fraction_that_fits(needed: int, budget: MemoryBudget, margin: float) -> float | None:
    reserves = sum(budget.reserves.values())
    outside = needed / (1.0 - margin) + reserves
    mfs = 1.0 - outside / budget.total_bytes
    return round(mfs, 3) if mfs > 0 else None


# --------------------------------------------------------------------------- validations


@dataclass(frozen=True)
class Validation:
    """One startup check of the final prefill graph configuration."""

    name: str
    ok: bool
    message: str
    warning: bool = False  # a failed check that warns instead of stopping startup
    rows: int | None = None  # the logits check, when it resizes: rows it sizes for
    upstream_rows: int | None = None

    @property
    def blocks(self) -> bool:
        return not self.ok and not self.warning


def validations(facts: Deployment) -> list[Validation]:
    """Startup checks of the deployment's prefill graph configuration (none out of scope)."""
    if facts.out_of_scope is not None:
        return []
    return prefill_validations(
        facts, facts.prefill_graph.backend, list(facts.prefill_graph.buckets)
    )


def prefill_validations(
    facts: Deployment, backend: Backend, buckets: Sequence[int]
) -> list[Validation]:
    """Startup checks of a prefill graph configuration: `backend` with `buckets`."""
    from sglang.srt.model_executor.cuda_graph_config import Backend

    from sglang_mixgraph.core.prefill_buckets import ceil_align

    out = []
    cap = facts.mega_moe_cap
    name = "mega_moe_cap_covers_prefill_buckets"
    if cap is not None and backend != Backend.DISABLED and buckets:
        # The runner rounds capture sizes up to the attention-TP width
        # (`prefill_cuda_graph_runner.get_prefill_num_tokens_to_capture`).
        captured = sorted({ceil_align(b, facts.attn_tp_size) for b in buckets})
        over = [b for b in captured if b > cap]
        if over:
            msg = (
                f"MegaMoE: prefill CUDA-graph buckets {over} (tokens per rank, as captured) exceed "
                f"SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK={cap}; capture would fail the "
                f"MegaMoE token assert (sglang.srt.layers.moe.mega_moe.run_mega_routed_experts). Raise "
                f"the variable to at least {max(over)}, drop those buckets from --cuda-graph-bs-prefill, "
                f"set --cuda-graph-max-bs-prefill {cap} or lower, or --disable-prefill-cuda-graph."
            )
            out.append(Validation(name, False, msg))
        else:
            out.append(
                Validation(
                    name, True, f"largest prefill bucket {max(captured)} <= MegaMoE cap {cap}"
                )
            )
    out.append(logits_gather_check(facts))
    return out


def logits_gather_check(facts: Deployment) -> Validation:
    """Whether the logits multimem all-gather covers a mixed step's sampling rows."""
    from sglang_mixgraph.core.prefill_buckets import mixed_sampling_rows_bound

    name = "logits_multimem_gather_covers_mixed_steps"
    # The gatherer serves the TP vocab all-gather unless the DP LM head (attn-TP group) is
    # used (`sglang.srt.layers.logits_processor.LogitsProcessor.__init__`).
    if facts.tp_size <= 1 or facts.dp_lm_head:
        return Validation(name, True, "not used (tp 1 or --enable-dp-lm-head)")
    if not facts.mixed_chunk:
        return Validation(name, True, "mixed chunk off: upstream sizing covers decode steps")
    mrr = facts.max_running_requests
    draft = facts.draft_tokens
    # as `triton_symm_mem_ag.recommended_max_tokens` sizes it without prefill
    upstream_rows = max((mrr or 0) * draft, LOGITS_GATHER_FLOOR)
    if not mrr:
        return Validation(
            name,
            False,
            f"max_running_requests is sized at runtime, so the multimem all-gather is built for "
            f"{LOGITS_GATHER_FLOOR} rows; mixed steps with more sampling rows fall back to NCCL. "
            f"Set --max-running-requests to size it.",
            warning=True,
        )
    bound = mixed_sampling_rows_bound(
        running_per_rank=facts.running_per_rank,
        attn_dp_size=facts.attn_dp_size,
        attn_dp_enabled=facts.dp_attention,
        draft_tokens=draft,
    )
    if bound <= upstream_rows:
        return Validation(name, True, f"capacity {upstream_rows} rows >= mixed bound {bound}")
    if facts.speculative_algorithm is not None:
        return Validation(
            name,
            False,
            f"mixed steps gather up to {bound} rows but the multimem all-gather holds "
            f"{upstream_rows}; larger steps fall back to NCCL (not resized under speculative decoding)",
            warning=True,
        )
    return Validation(
        name,
        True,
        f"sized prefill-aware: {bound} rows (upstream sizes {upstream_rows}, which a mixed step "
        f"of R+1 rows per rank exceeds and would fall back to NCCL)",
        rows=bound,
        upstream_rows=upstream_rows,
    )


# --------------------------------------------------------------------------- the plan


class DecidedBy(enum.Enum):
    """What decided a graph backend."""

    USER = "user"
    ESTIMATE = "estimate"
    FORCE = "force"
    UPSTREAM_RULE = "upstream rule"
    UPSTREAM = "upstream"
    UPSTREAM_DEFAULT = "upstream default"
    DEFAULT = "default"


@dataclass(frozen=True)
class Decision:
    kind: DecidedBy
    detail: str = ""
    rule: str | None = None  # with UPSTREAM_RULE
    reason: str = ""  # upstream's reason for that rule


@dataclass(frozen=True)
class PrefillGraph:
    backend: str
    decided_by: Decision
    rules: tuple[RuleMatch, ...]
    max_bs: int | None
    buckets: tuple[int, ...]


@dataclass(frozen=True)
class DecodeGraph:
    backend: str
    decided_by: Decision
    max_bs: int | None
    buckets: tuple[int, ...]

    @property
    def bucket_count(self) -> int:
        return len(self.buckets)


@dataclass(frozen=True)
class BucketList:
    """One prefill bucket list as `plan` compares them."""

    buckets: tuple[int, ...]
    contains_top: bool  # the list has a bucket at exactly the largest size it must serve
    capture: CaptureReport
    padding: PaddingProfile


@dataclass(frozen=True)
class BucketLists:
    """Upstream's generic list against the derived one, and the final list."""

    policy: str
    final: tuple[int, ...]
    upstream: BucketList | None
    derived: BucketList | None
    derived_error: str | None  # why there is no derived list


@dataclass(frozen=True)
class GraphPlan:
    gpu: str
    gpu_sm_major: int
    facts: Deployment
    flags: dict[str, str]
    prefill: PrefillGraph
    decode: DecodeGraph
    capture: CaptureReport | None  # of the final list; None without one
    buckets: BucketLists | None  # None: chunked prefill is off, nothing to derive from
    validations: tuple[Validation, ...]
    plugin_loaded: bool  # without the plugin the validations are reported, not enforced
    # What the server logs where our switch keeps the graph on under speculative decoding
    # (`bcg_rules.speculative_warning`), or None.
    speculative_warning: str | None = None
    memory: MemoryFit | None = None  # do the weights fit; None: mem_fraction_static unknown

    @property
    def prefill_off_but_estimated(self) -> bool:
        from sglang.srt.model_executor.cuda_graph_config import Backend

        return self.prefill.backend == Backend.DISABLED and self.capture is not None

    @property
    def ok(self) -> bool:
        return not self.plugin_loaded or not any(v.blocks for v in self.validations)


def breakable_phases(plan: GraphPlan) -> list[str]:
    """The phases ("prefill", "decode") of a plan whose CUDA graphs are breakable."""
    graphs = {"prefill": plan.prefill, "decode": plan.decode}
    return [p for p, g in graphs.items() if g.backend == "breakable"]


def _bucket_list(facts: Deployment, buckets: Sequence[int], top: int) -> BucketList | None:
    from sglang_mixgraph.core.prefill_buckets import padding_profile

    if not buckets:
        return None
    return BucketList(
        buckets=tuple(buckets),
        contains_top=top in buckets,
        capture=capture_estimate(facts, buckets, facts.chunk_per_rank),
        padding=padding_profile(buckets, lo=16, hi=max(top, max(buckets))),
    )


def _bucket_lists(
    facts: Deployment, record: GraphDecisions | None, plugin_loaded: bool
) -> BucketLists:
    from sglang.srt.arg_groups.cuda_graph_hook import generate_prefill_cuda_graph_batch_sizes

    from sglang_mixgraph.core.prefill_buckets import BucketDerivationError

    prefill = facts.prefill_graph
    upstream_max_bs = (
        record.upstream_max_bs
        if record is not None and record.upstream_max_bs is not None
        else prefill.max_bs
    )
    top = bucket_top(facts, upstream_max_bs)
    derived = error = None
    try:
        derived, _ = derive_fitting_buckets(facts, upstream_max_bs)
    except (BucketDerivationError, GraphConfigError) as e:
        error = str(e)
    if record is not None and record.bucket_policy:
        policy = record.bucket_policy
    else:
        policy = "upstream" if plugin_loaded else "upstream (sglang-mixgraph is not loaded)"
    return BucketLists(
        policy=policy,
        final=prefill.buckets,
        upstream=_bucket_list(facts, generate_prefill_cuda_graph_batch_sizes(top), top),
        derived=_bucket_list(facts, derived, top),
        derived_error=error,
    )


def _prefill_decision(facts: Deployment, record: GraphDecisions | None) -> Decision:
    from sglang.srt.model_executor.cuda_graph_config import Backend

    from sglang_mixgraph.bcg_rules import Source

    backend = facts.prefill_graph.backend
    if "backend" in facts.prefill_graph.user_set:
        return Decision(
            DecidedBy.USER, f"prefill backend set explicitly to {backend!r}; no rule evaluated"
        )
    source = record.prefill_backend_source if record is not None else None
    if source is Source.ESTIMATE:
        return Decision(
            DecidedBy.ESTIMATE, "capture-memory estimate (replaces the blanket DeepSeek-V4 rule)"
        )
    if source is Source.FORCED:
        return Decision(
            DecidedBy.FORCE, "SGLANG_EXPERIMENTAL_FORCE_BCG=1 overrode the rules listed"
        )
    if source is Source.UPSTREAM_RULE:
        name = record.deciding_rule
        reason = next((m.reason for m in record.rule_matches if m.name == name), "")
        return Decision(DecidedBy.UPSTREAM_RULE, rule=name, reason=reason)
    if source is not None:
        return Decision(DecidedBy.UPSTREAM, source.value)
    if backend == Backend.DISABLED:
        if facts.memory.pp_size > 1:
            return Decision(
                DecidedBy.UPSTREAM_DEFAULT,
                "pipeline parallelism: BCG prefill is opt-in "
                "(sglang.srt.arg_groups.cuda_graph_hook.apply_cuda_graph_compatibility)",
            )
        if facts.rules_holding:
            first = facts.rules_holding[0]
            return Decision(DecidedBy.UPSTREAM_RULE, rule=first.name, reason=first.reason)
        return Decision(
            DecidedBy.UPSTREAM, "disabled elsewhere in resolution (platform or feature check)"
        )
    return Decision(
        DecidedBy.DEFAULT, f"upstream default {backend!r}; no incompatibility rule holds"
    )


def graph_plan(
    facts: Deployment,
    record: GraphDecisions | None,
    gpu: GpuSpec,
    *,
    plugin_loaded: bool,
    memory: MemoryFit | None = None,
) -> GraphPlan:
    """The prefill/decode graph configuration of a finished resolution, and why: from its
    facts (`deployment_facts.read_deployment`), the record of what our hooks decided
    (`bcg_rules.recorded`, None without one) and the target GPU (`target_gpu.GpuSpec`).
    Call it where that GPU is described (`target_gpu.described_gpu`): the budget reads its
    memory."""
    from sglang_mixgraph.flags import FLAGS

    if record is not None and record.rule_matches:
        rules = tuple(record.rule_matches)
    else:
        rules = tuple(RuleMatch(r.name, r.reason, "holds") for r in facts.rules_holding)
    prefill, decode = facts.prefill_graph, facts.decode_graph
    final = list(prefill.buckets)
    return GraphPlan(
        gpu=gpu.describe(),
        gpu_sm_major=gpu.sm_major,
        facts=facts,
        flags={
            name: str(FLAGS[name].get())
            for name in ("SGLANG_EXPERIMENTAL_FORCE_BCG", "SGLANG_MIXGRAPH_PREFILL_BUCKETS")
            if name in FLAGS
        },
        prefill=PrefillGraph(
            backend=prefill.backend,
            decided_by=_prefill_decision(facts, record),
            rules=rules,
            max_bs=prefill.max_bs,
            buckets=prefill.buckets,
        ),
        decode=DecodeGraph(
            backend=decode.backend,
            decided_by=Decision(
                DecidedBy.USER if "backend" in decode.user_set else DecidedBy.DEFAULT
            ),
            max_bs=decode.max_bs,
            buckets=decode.buckets,
        ),
        capture=capture_estimate(facts, final, capture_chunk(facts, final)) if final else None,
        buckets=_bucket_lists(facts, record, plugin_loaded) if facts.chunked else None,
        validations=tuple(validations(facts)),
        plugin_loaded=plugin_loaded,
        speculative_warning=record.speculative_warning if record is not None else None,
        memory=memory,
    )
