"""The mixed split's switches and per-step state.

Flags (registered in SGLang's envs), the attribute names the patch adds to upstream objects,
the fallback reasons, the activity counters it keeps, and :class:`SplitPlan`, the split of one
step, stored on that step's ``DSV4Metadata`` and bound to the ForwardBatch the attention sees.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sglang_mixgraph import counters
from sglang_mixgraph.core.decode_tail import TailInputs
from sglang_mixgraph.core.mixed_boundary import MixedBoundary
from sglang_mixgraph.fallback import fallback_once
from sglang_mixgraph.flags import bool_flag, choice_flag
from sglang_mixgraph.upstream_attrs import METADATA_SPLIT_PLAN

if TYPE_CHECKING:  # the planner is not loaded with the plugin: the annotation only
    from sglang_mixgraph.planner.split_view import SplitView

PATCH_ID = "mixed_split"
BACKEND = "sglang.srt.layers.attention.deepseek_v4_backend.DeepseekV4AttnBackend"
FORWARD_BATCH = "sglang.srt.model_executor.forward_batch_info.ForwardBatch"
EAGER_RUNNER = "sglang.srt.model_executor.runner.eager_runner.EagerRunner"

SPLIT_FLAG = bool_flag(
    "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN",
    False,
    "DSV4: split mixed prefill/decode steps at the boundary; decode rows use the fp8 decode "
    "kernel, the sparse-prefill workspace covers only the prefill requests.",
)
# Default `adaptive`: on the H200 in-server sweep (docs/results/mixed_split_inserver_fit_h200.md)
# `always` loses up to 15 % on c128 layers with a prefill chunk; `adaptive` never loses over 1 %.
POLICY_FLAG = choice_flag(
    "SGLANG_MIXGRAPH_SPLIT_POLICY",
    "adaptive",
    ("always", "adaptive"),
    "With the mixed split on: `always` splits every step with decode rows; `adaptive` splits "
    "only where the per-GPU cost model predicts a gain.",
    off_value="always",
)

TAIL_GRAPHS_FLAG = bool_flag(
    "SGLANG_MIXGRAPH_SPLIT_TAIL_GRAPHS",
    False,
    "With the mixed split on: replay each split layer's decode tail from a CUDA graph captured "
    "per layer and bucket of decode rows (static inputs, one launch) instead of calling the "
    "decode kernel eagerly. With one split schedule per step, measured on an H100: 0.043 ms less "
    "host per split layer than the eager tail, 0.009-0.050 ms more GPU per layer "
    "(docs/results/split_tail_graphs_h200.md).",
)


def tail_graphs_act() -> bool:
    """Whether this process's split replays its decode tails from CUDA graphs (the capture
    estimate then counts their memory)."""
    return bool(SPLIT_FLAG.get()) and bool(TAIL_GRAPHS_FLAG.get())


# The compress ratios of a DSV4 (not V4.1) model: SWA-only, CSA, HCA.
ALL_RATIOS = (0, 4, 128)

# Speculative algorithms whose MIXED steps the split takes: the target forward runs the running
# requests as 1-token decodes and the draft reads only its hidden states and tokens afterwards.
# NEXTN/MTP is EAGLE. EAGLE3 is not here: SGLang refuses it for DeepSeek-V4 at model init
# (`configure_aux_hidden_state_capture` needs `set_eagle3_layers_to_capture`, which
# `DeepseekV4ForCausalLM` lacks), so its mixed steps were never run to verify.
SPLIT_SPEC_ALGORITHMS = ("EAGLE",)
EAGLE3 = "EAGLE3"
EAGLE3_REFUSED = (
    "SGLang refuses EAGLE3 for DeepSeek-V4 at model init "
    "(model_runner_components.attention_backend_setup.configure_aux_hidden_state_capture: "
    "DeepseekV4ForCausalLM has no set_eagle3_layers_to_capture)"
)
# How `boundary.decode_tail_of` recognises a MIXED step: still labelled MIXED (a breakable-graph
# replay's live batch), or run as EXTEND by `EagerRunner.execute` (every eager MIXED step).
MIXED_STEP_WAYS = ("mixed", "mixed_run_as_extend")


def _spec_algorithm_name(name: str | None) -> str | None:
    """SGLang's algorithm for a ``--speculative-algorithm`` value (NEXTN is EAGLE), by name."""
    if not name:
        return None
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algo = SpeculativeAlgorithm.from_string(name)
    return None if algo.is_none() else getattr(algo, "name", str(algo))


def _online_c128_mtp() -> bool:
    # The same two switches upstream's OnlineC128MTPController.enabled reads (with MTP on).
    from sglang.srt.environ import envs

    return bool(
        envs.SGLANG_OPT_USE_ONLINE_COMPRESS.get() and envs.SGLANG_EXPERIMENTAL_ONLINE_C128_MTP.get()
    )


@dataclass(frozen=True)
class Fallback:
    """One reason a step goes to upstream: its key (the counters'), its text (the log's), and
    for `plan` and `advise` how a whole deployment shows it, or None where only a step can
    tell. `deployment` reads only what `SplitView` declares (a graph_plan.GraphPlan, or the
    facts a running server reports). `_unsupported_reason` checks the same keys on the live
    objects."""

    key: str
    text: str
    deployment: Callable[[SplitView], bool] | None = None


# In the order `plan` names the first that holds.
FALLBACKS = (
    Fallback(
        "dsv41",
        "DSV4.1 (interleaved KV layouts, low-ratio c1/c2 layers)",
        lambda plan: plan.facts.model_type == "deepseek_v41",
    ),
    Fallback(
        "trtllm",
        "trtllm attention backend (no sparse-prefill path to split)",
        lambda plan: plan.facts.dsv4_attn_backend == "trtllm",
    ),
    Fallback(
        "mega",
        "mega attention backend (fused RoPE prefill/decode kernels)",
        lambda plan: plan.facts.dsv4_attn_backend == "flashmla_mega",
    ),
    Fallback("sm120", "SM120", lambda plan: plan.gpu_sm_major == 12),
    Fallback(
        "spec_eagle3",
        f"EAGLE3 (not verified: {EAGLE3_REFUSED})",
        # By the flag's value: it names no alias (`SpeculativeAlgorithm.from_string`).
        lambda plan: (plan.facts.speculative_algorithm or "").upper() == EAGLE3,
    ),
    Fallback(
        "spec",
        "speculative decoding outside a mixed step of EAGLE/NEXTN (a verify step, a relabelled "
        "decode step, or another algorithm)",
        lambda plan: _spec_algorithm_name(plan.facts.speculative_algorithm)
        not in (None, EAGLE3, *SPLIT_SPEC_ALGORITHMS),
    ),
    Fallback(
        "spec_online_c128",
        "online c128 MTP compression (its per-request compressor state is not split)",
        lambda plan: bool(plan.facts.speculative_algorithm) and _online_c128_mtp(),
    ),
    Fallback("spec_draft", "the speculative draft model's own forward"),
    Fallback("spec_verify", "a mixed step carrying a speculative verify input"),
    Fallback("cp", "context parallelism", lambda plan: plan.facts.context_parallel),
    Fallback("hisparse", "hisparse", lambda plan: plan.facts.hisparse),
    Fallback("low_ratio", "DSV4.1 low-ratio (c1/c2) layers"),
    Fallback("late_tail", "decoder SWA bounded replay (late-layer tail)"),
    Fallback("dspark", "DSpark draft backend"),
    Fallback("request_window", "request-window SWA layout"),
    Fallback("encoder_replay", "encoder SWA replay rows"),
    Fallback("xpu", "XPU"),
    Fallback(
        "heads",
        "query head count outside the decode kernel's {64, 128} (or not known at plan time)",
    ),
    Fallback("rows", "metadata rows do not cover the decode tail"),
    Fallback("tail_layout", "decode-tail metadata not in the decode kernel's layout"),
    Fallback("boundary", "decode requests are not the 1-token tail of the batch"),
    Fallback("shape", "attention rows differ from the planned step"),
)
FALLBACK_REASONS = {f.key: f.text for f in FALLBACKS}
FALLBACKS_BY_KEY = {f.key: f for f in FALLBACKS}


def fall_back(reason_key: str) -> None:
    """Count a fallback of the patch for ``reason_key`` (a ``FALLBACKS`` key), said once."""
    fallback_once(PATCH_ID, FALLBACK_REASONS[reason_key], key=reason_key)


def count_event(event: str, n: int = 1) -> None:
    """Add ``n`` to the patch's counter ``event``."""
    counters.count(PATCH_ID, event, n)


# --------------------------------------------------------------------------------------------
# per-step state
# --------------------------------------------------------------------------------------------


class SplitPlanError(RuntimeError):
    """A planned step's attention does not match what the plan checked, after read-done may
    have been published for it: going back to upstream would read ``req_to_token`` /
    ``full_to_swa_index_mapping`` after the publish. The plan-time checks make this
    unreachable in sglang 0.5.23; reaching it means the installed code changed under the patch."""


@dataclass
class SplitPlan:
    """The split of one step, stored on the step's ``DSV4Metadata`` (attribute ``mixgraph_split``).

    Every layer of the step takes the split path (``adaptive`` decides the whole step); the
    only chunk cache of the step is the prefill-only one (none without prefill rows).
    """

    boundary: MixedBoundary
    forward_batch_ref: Any  # weakref to the ForwardBatch the plan was made for
    # The decode tail's inputs per compress ratio of the model (core.decode_tail.TailInputs),
    # built once for the step; the kernel (the backend's ``_flash_mla_with_kvcache``).
    tails: dict[int, TailInputs]
    kernel: Callable[..., Any]
    # Whether read-done may be published for this step before its first layer (upstream's
    # gates allow it, and the step is eager or a replay with replay_read_done on): a layer that
    # does not match the plan then raises SplitPlanError instead of going back to upstream.
    may_publish: bool = True
    # The prefill-only chunk cache, once built (None without prefill rows).
    prefill_cache: Any = None
    # The query head count of the step's layers, set by its first split layer.
    heads: int | None = None
    # Diagnostics for tests and logs.
    policy: str = "always"
    decode_calls: dict[int, int] = field(default_factory=dict)
    tail_builds: dict[int, int] = field(default_factory=dict)

    def matches(self, forward_batch) -> bool:
        ref = self.forward_batch_ref
        target = ref() if isinstance(ref, weakref.ref) else ref
        return target is forward_batch


def get_plan(backend) -> SplitPlan | None:
    metadata = getattr(backend, "forward_metadata", None)
    return getattr(metadata, METADATA_SPLIT_PLAN, None)


def ref_to(obj):
    """A weak reference to ``obj``, or ``obj`` itself where it takes none (``SplitPlan.matches``
    reads either)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return obj
