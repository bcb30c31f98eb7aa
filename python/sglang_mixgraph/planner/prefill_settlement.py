"""The one answer the `graph_config` resolution hook gets from the planner: `settle_prefill`.

Late in resolution (AROUND `mega_moe_hook.validate_mega_moe_token_budget_for_model`, once the
chunk, the bucket list and the memory settings are final) the hook asks once and gets a
`PrefillSettlement`: the bucket list to apply or why upstream's stays, how a deferred
DeepSeek-V4 rule ends (the capture-memory estimate decides, or upstream's rule stands), the
lines to log, and the startup validations of the configuration that results. It is computed
from the deployment's facts as they stand before the hook applies anything
(`deployment_facts.read_deployment`, which the hook calls); the hook applies and logs, and
decides nothing. The texts here are the ones the
server logs, so `plan` and startup cannot say different things.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sglang_mixgraph.bcg_rules import GraphDecisions, Source, speculative_warning
from sglang_mixgraph.planner.deployment_facts import Deployment
from sglang_mixgraph.planner.graph_plan import Validation

if TYPE_CHECKING:  # upstream's enum, imported where a function runs
    from sglang.srt.model_executor.cuda_graph_config import Backend


@dataclass(frozen=True)
class Said:
    """One line for the server log, at `level` (logging.INFO, logging.WARNING)."""

    level: int
    text: str


@dataclass(frozen=True)
class RuleSettlement:
    """How the DeepSeek-V4 rule the rule hook deferred ends in this resolution."""

    source: Source
    action: str | None  # the rule's new action as `plan` shows it; None: unchanged
    disable: bool  # the prefill graph goes off
    fallback: str | None = None  # why upstream's rule stands (counted and said once)
    said: Said | None = None
    # The estimate keeps the graph on under speculative decoding (`bcg_rules.speculative_warning`).
    speculative_warning: str | None = None


@dataclass(frozen=True)
class PrefillSettlement:
    """What the resolution hook applies: buckets, the deferred rule's end, validations."""

    out_of_scope: str | None  # the deployment left the patch's scope: nothing else applies
    bucket_policy: str  # as `plan` reports it
    upstream_max_bs: int | None  # upstream's prefill max_bs before the derivation
    buckets: tuple[int, ...] | None  # the derived list to apply; None: upstream's stays
    bucket_fallback: str | None  # why the derivation fell back to upstream's list
    bucket_said: Said | None
    rule: RuleSettlement | None  # None: no rule was deferred
    validations: tuple[Validation, ...]


def _upstream_rule_stands(why: str, action: str) -> RuleSettlement:
    """The deferral is only a promise that the estimate decides later; wherever the estimate
    cannot decide (no memory numbers, no bucket list, the deployment left the patch's scope
    later in resolution) upstream's rule must hold, or BCG would stay on where SGLang alone
    turns it off (`cuda_graph_hook.disable_breakable_cudagraph_if_incompatible`)."""
    return RuleSettlement(
        Source.UPSTREAM_RULE,
        action,
        disable=True,
        fallback=f"capture-memory estimate: {why}; upstream's DSV4 rule applies",
    )


def _derived_buckets(facts: Deployment):
    """(the derived list or None, the bucket policy, the fallback reason or None, a note on
    the list for the log)."""
    from sglang.srt.model_executor.cuda_graph_config import Backend

    from sglang_mixgraph.core.prefill_buckets import BucketDerivationError
    from sglang_mixgraph.planner.graph_plan import derive_fitting_buckets, unhandled

    prefill = facts.prefill_graph
    if prefill.user_set & {"bs", "max_bs"}:
        return None, "user", None, ""
    if prefill.backend == Backend.DISABLED:
        return None, "prefill graph off", None, ""
    reason = unhandled(facts)
    if reason is None:
        try:
            derived, note = derive_fitting_buckets(facts, prefill.max_bs)
            return derived, "auto", None, note
        except BucketDerivationError as e:
            reason = str(e)
    return None, f"upstream (fallback: {reason})", reason, ""


def _estimate_settles(backend: Backend, facts: Deployment, buckets: list[int]) -> RuleSettlement:
    from sglang.srt.model_executor.cuda_graph_config import Backend

    from sglang_mixgraph.core.capture_memory import fmt_bytes
    from sglang_mixgraph.planner.graph_plan import UNKNOWN_BUDGET, capture_chunk, capture_estimate

    if backend != Backend.BREAKABLE:
        return RuleSettlement(Source.UPSTREAM_LATER, None, disable=False)
    if not buckets:
        # Nothing to estimate (chunked prefill off gives upstream an empty list).
        return _upstream_rule_stands(
            "no prefill buckets", "disables (no prefill buckets to estimate)"
        )
    report = capture_estimate(facts, buckets, capture_chunk(facts, buckets))
    verdict = report.verdict
    if verdict is None:
        return _upstream_rule_stands(UNKNOWN_BUDGET, "disables (estimate unavailable)")
    sizes = (
        f"estimated capture memory {fmt_bytes(verdict.needed)} for {len(buckets)} buckets up to "
        f"{max(buckets)} tokens"
    )
    margin = int(verdict.margin_fraction * 100)
    if verdict.fits:
        spec = facts.speculative_algorithm
        return RuleSettlement(
            Source.ESTIMATE,
            "replaced by the capture-memory estimate: fits",
            disable=False,
            speculative_warning=speculative_warning("SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto", spec)
            if spec
            else None,
            said=Said(
                logging.INFO,
                f"sglang-mixgraph: breakable prefill CUDA graph kept on for DeepSeek-V4: {sizes} "
                f"fits in {fmt_bytes(verdict.available)} (after weights, KV pool and the static "
                f"reserve; {margin}% margin).",
            ),
        )
    hints = ["fewer buckets (--cuda-graph-bs-prefill)"]
    if report.advice_max_bs_prefill:
        hints.append(f"--cuda-graph-max-bs-prefill {report.advice_max_bs_prefill}")
    if report.shape.sparse is not None:
        hints.append(
            f"a smaller --cuda-graph-prefill-max-context (now {report.shape.sparse.context_width})"
        )
    if report.advice_mem_fraction_static is not None:
        hints.append(
            f"--mem-fraction-static {report.advice_mem_fraction_static} or lower "
            f"(now {facts.mem_fraction_static})"
        )
    hints.append("or capture anyway with SGLANG_EXPERIMENTAL_FORCE_BCG=1")
    return RuleSettlement(
        Source.ESTIMATE,
        "replaced by the capture-memory estimate: does not fit, disabled",
        disable=True,
        said=Said(
            logging.WARNING,
            f"sglang-mixgraph: breakable prefill CUDA graph disabled for DeepSeek-V4: {sizes} "
            f"(of which {report.estimate.largest_terms()}) does not fit in "
            f"{fmt_bytes(verdict.available)} available after weights, KV pool and the static "
            f"reserve (with a {margin}% margin). To keep it on, try: {'; '.join(hints)}.",
        ),
    )


def settle_out_of_scope(why: str, record: GraphDecisions) -> PrefillSettlement:
    """The answer for a deployment that left the patch's scope after the rule hook saw it in
    scope (mixed chunk or the model changed later in resolution): upstream's rule stands."""
    pending = record.prefill_backend_source is Source.ESTIMATE_PENDING
    return PrefillSettlement(
        out_of_scope=why,
        bucket_policy=f"upstream ({why})",
        upstream_max_bs=None,
        buckets=None,
        bucket_fallback=None,
        bucket_said=None,
        rule=_upstream_rule_stands(why, f"disables ({why} later in resolution)")
        if pending
        else None,
        validations=(),
    )


def settle_prefill(facts: Deployment, record: GraphDecisions) -> PrefillSettlement:
    """The planner's whole answer for one in-scope resolution with
    SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto (`settle_out_of_scope` for the others).

    Raises GraphConfigError when the chunk cannot fit under the MegaMoE cap (`derive_buckets`).
    """
    from sglang.srt.model_executor.cuda_graph_config import Backend

    from sglang_mixgraph.planner.graph_plan import prefill_validations

    if facts.out_of_scope is not None:
        return settle_out_of_scope(facts.out_of_scope, record)
    pending = record.prefill_backend_source is Source.ESTIMATE_PENDING
    prefill = facts.prefill_graph
    upstream = list(prefill.buckets)
    derived, policy, fallback, note = _derived_buckets(facts)
    applied = derived is not None and derived != upstream
    final = derived if applied else upstream
    said = None
    if applied:
        said = Said(
            logging.INFO,
            "sglang-mixgraph: prefill CUDA-graph buckets derived for mixed chunked prefill "
            f"(SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto): {derived} instead of {len(upstream)} "
            f"generic buckets up to {max(upstream) if upstream else None}"
            f"{f' ({note})' if note else ''}.",
        )
    rule = _estimate_settles(prefill.backend, facts, final) if pending else None
    backend = Backend.DISABLED if rule is not None and rule.disable else prefill.backend
    return PrefillSettlement(
        out_of_scope=None,
        bucket_policy=policy,
        upstream_max_bs=prefill.max_bs,
        buckets=tuple(derived) if applied else None,
        bucket_fallback=fallback,
        bucket_said=said,
        rule=rule,
        validations=tuple(prefill_validations(facts, backend, final)),
    )
