"""The planner's result (`graph_plan.GraphPlan`) in the words `plan` and the patches share.

The capture estimate of a bucket list in words (`capture_words`, `list_words`), whether it was
fitted on this plan's model and GPU (`estimate_applies`, `calibration_gap`, `fits_word`), and
why `SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto` would leave a deployment's prefill list to upstream
(`auto_stands_aside`). `resolution.plan_format` builds `plan`'s text and JSON on them; the
graph-config patch says with them what its switches would do in a planned deployment (its
`Patch.explain_if_on`), which it could not if they lived with the commands. They read the typed
result only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sglang_mixgraph.core.capture_memory import fmt_bytes, model_calibrated, not_calibrated_for

if TYPE_CHECKING:
    from sglang_mixgraph.planner.graph_plan import BucketList, GraphPlan


def gpu_name(plan: GraphPlan) -> str:
    return plan.gpu.split(" ", 1)[0]  # GraphPlan.gpu is target_gpu's describe(): name first


# The hidden size of the DeepSeek-V4 the capture estimate was fitted on (DeepSeek-V4-Pro); the
# Flash model shares its architecture name with a smaller shape (hidden 4096).
CALIBRATED_HIDDEN = 7168
FLASH_HIDDEN = 4096


def calibration_gap(plan: GraphPlan) -> str | None:
    """The model and/or GPU of this plan the capture estimate was not fitted on, or None:
    a DeepSeek-V4 of another size than the Pro (the Flash) counts as another model."""
    gap = not_calibrated_for(plan.facts.architectures, gpu_name(plan))
    hidden = plan.facts.shape.hidden_size
    if not plan.facts.deepseek_v4 or hidden == CALIBRATED_HIDDEN:
        return gap
    variant = "DeepSeek-V4-Flash" if hidden == FLASH_HIDDEN else f"a DeepSeek-V4 of hidden {hidden}"
    return variant if gap is None else f"{variant} on {gap}"


def estimate_applies(plan: GraphPlan) -> bool:
    """Whether the capture estimate applies to this plan's model (it was fitted on one)."""
    return model_calibrated(plan.facts.architectures)


def fits_word(fits: bool | None, gap: str | None) -> str:
    """The estimate's verdict; where it was not calibrated, what it says and that it is no
    verdict (a model or GPU it was never measured on)."""
    if fits is None:
        return "unknown"
    if gap is None:
        return "fits" if fits else "does not fit"
    side = "within" if fits else "over"
    return f"{side} the available memory by the estimate, uncalibrated for {gap}"


def capture_words(plan: GraphPlan, side: BucketList) -> str:
    """A list's capture estimate in words, or that there is none for this model."""
    if not estimate_applies(plan):
        return "capture not estimated for this model"
    return (
        f"capture {fmt_bytes(side.capture.estimate.total)} "
        f"({fits_word(side.capture.fits, calibration_gap(plan))})"
    )


def list_words(plan: GraphPlan, side: BucketList) -> str:
    return f"{len(side.buckets)} buckets up to {max(side.buckets)}, {capture_words(plan, side)}"


def auto_stands_aside(plan: GraphPlan) -> str | None:
    """Why SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto would leave this deployment's prefill list as
    upstream resolves it, by the rule its hook applies (`prefill_settlement.settle_prefill`:
    out of scope, buckets the user set, or a configuration the derivation does not handle);
    None where it acts."""
    from sglang.srt.model_executor.cuda_graph_config import Backend

    from sglang_mixgraph.planner.graph_plan import unhandled

    facts = plan.facts
    if facts.out_of_scope is not None:
        return f"the patch acts on mixed chunked prefill of DeepSeek-V4 and GLM-5 only ({facts.out_of_scope})"
    if facts.prefill_graph.user_set & {"bs", "max_bs"}:
        return "the prefill buckets are set explicitly"
    reason = unhandled(facts) if facts.prefill_graph.backend == Backend.BREAKABLE else None
    return None if reason is None else f"the derivation does not handle {reason}"
