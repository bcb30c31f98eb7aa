"""SGLANG_OPT_DSV4_BCG_LIVE_WIDTH_INDEXER=1: DeepSeek-V4's c4 indexer scores the live context in
breakable prefill/MIXED replays, not the capture width.

Upstream captures the c4 indexer (``dsv4.indexer.C4Indexer.forward`` ->
``C4IndexerBackendMixin.forward_c4_indexer``) inside the breakable graph, at the page table the
replay metadata is built with: ``DeepseekV4AttnBackend._prefill_graph_context_width``, the pool's
whole context unless ``--cuda-graph-prefill-max-context`` bounds it. Every replay then computes
logits ``[rows, width / 4]`` (the torch fallback's work scales with it) and keeps them in the graph
pool. Here the compressor stays captured and the rest of the indexer (Q, weights, logits, top-k)
runs as one eager break per c4 layer (``eager_on_graph``, as upstream's V4.1 low-ratio sources
do), over the page table narrowed to the live batch's longest sequence. Rows stay at the
bucket's, so the captured DeepGEMM schedule and top-k plans stay valid. It narrows only steps
whose requests hold at most top-k c4 entries each: upstream's top-k returns such a row's entries
in order whatever the width, while a longer row's picks may come in another order over a
narrower table; those steps keep the capture width (said once). It acts with upstream's stream
overlap off (SGLANG_OPT_USE_MULTI_STREAM_OVERLAP=0): with it on, the indexer runs on a side
stream in captures, where a break cannot go; the patch then falls back and says so.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mixgraph import counters
from sglang_mixgraph.core.attention_rows import batch_attention_rows
from sglang_mixgraph.core.capture_effects import CaptureEffect
from sglang_mixgraph.fallback import fallback_once
from sglang_mixgraph.flags import bool_flag
from sglang_mixgraph.registry import Hook, Patch

PATCH_ID = "live_width_indexer"
INDEXER = "sglang.srt.layers.attention.dsv4.indexer.C4Indexer"
BCG_MODULE = (
    "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph"
)
BCG_CONTEXT = "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context"
TC_CONTEXT = "sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph"
REPLAY_TAIL = "sglang.srt.models.deepseek_v4_replay_tail"

FLAG = bool_flag(
    "SGLANG_OPT_DSV4_BCG_LIVE_WIDTH_INDEXER",
    False,
    "DeepSeek-V4 breakable prefill graph: the c4 indexer's logits and top-k run in an eager "
    "break per c4 layer over the live context instead of the capture width (the compressor "
    "stays captured).",
)

# Upstream's own switch of the DSV4 attention's stream overlap (sglang.srt.environ.envs).
MULTI_STREAM_FLAG = "SGLANG_OPT_USE_MULTI_STREAM_OVERLAP"

FALLBACKS = {
    "multi_stream": "the c4 indexer runs on a side stream in breakable captures (upstream's "
    f"stream overlap, {MULTI_STREAM_FLAG}=1, its default): a break there would end the segment "
    "with the side streams unjoined; set "
    f"{MULTI_STREAM_FLAG}=0 for the live-width indexer (it gives up that overlap)",
    "replay_tail": "a decoder replay-tail graph: its capture pass never computed the "
    "activations a break would score",
    "long_rows": "a step with a request of more than top-k c4 entries: upstream's top-k may "
    "return the same entries in another order over a narrower page table (another rounding in "
    "the attention), so such steps keep the capture width",
}

C4_RATIO = 4


def live_pages(seq_lens_cpu, page_size: int, width_pages: int) -> int:
    """Pages of the page table that hold the longest sequence of the step (at least one, at
    most the captured width). Padded rows can only make this wider, never narrower."""
    longest = int(max(seq_lens_cpu)) if len(seq_lens_cpu) else 0
    return max(1, min(width_pages, -(-longest // page_size)))


def narrowing_is_exact(seq_lens_cpu, topk: int) -> bool:
    """Whether the top-k of every row of the step is the same at any page-table width: each
    row sees at most ``seq // 4`` c4 entries, and upstream returns a row with at most top-k of
    them as those entries in order (the sequential rows of
    ``dsv4.indexer._topk_transform_vectorized``), without ranking them over the width."""
    longest = int(max(seq_lens_cpu)) if len(seq_lens_cpu) else 0
    return longest // C4_RATIO <= topk


def _indexer_at_live_width(original, indexer, x, q_lora, attn_backend, q_lora_quant) -> None:
    """The eager break: upstream's indexer minus its compressor, at the live width. Reads the
    step from the forward context at run time (the break's arguments are the capture's)."""
    tc = importlib.import_module(TC_CONTEXT)
    forward_batch = tc.get_tc_piecewise_forward_context().forward_batch
    if batch_attention_rows(forward_batch) == 0:
        return  # an idle rank's step: the attention break reads no top-k either
    meta = attn_backend.forward_metadata.indexer_metadata
    full = meta.page_table
    pages = live_pages(forward_batch.seq_lens_cpu, meta.page_size, full.shape[1])
    topk = attn_backend.forward_metadata.core_metadata.c4_sparse_page_indices.shape[1]
    if pages < full.shape[1] and not narrowing_is_exact(forward_batch.seq_lens_cpu, topk):
        fallback_once(PATCH_ID, FALLBACKS["long_rows"], key="long_rows")
        counters.count(PATCH_ID, "breaks_full_width")
        pages = full.shape[1]
    meta.page_table = full[:, :pages]  # a view: row stride kept, columns contiguous
    try:
        original(
            indexer,
            x=x,
            q_lora=q_lora,
            forward_batch=forward_batch,
            attn_backend=attn_backend,
            skip_compressor=True,
            q_lora_quant=q_lora_quant,
        )
    finally:
        meta.page_table = full
    counters.count(PATCH_ID, "breaks_run")
    if pages < full.shape[1]:
        counters.count(PATCH_ID, "breaks_narrowed")


def _multi_stream_on() -> bool:
    from sglang.srt.environ import envs

    return bool(getattr(envs, MULTI_STREAM_FLAG).get())


def acts_in_captures() -> bool:
    """Whether breakable captures of this process run the indexer's logits in the patch's eager
    break (the capture-memory estimate then leaves them out of the graph pool)."""
    return bool(FLAG.get()) and not _multi_stream_on()


@functools.cache
def _break():
    return importlib.import_module(BCG_MODULE).eager_on_graph(_indexer_at_live_width)


def _acts_here(forward_batch, enable_multi_stream: bool) -> bool:
    """Whether this call is a c4 indexer inside a breakable prefill/MIXED graph that the patch
    handles; a handled-elsewhere case says why once."""
    if not importlib.import_module(BCG_CONTEXT).is_in_breakable_cuda_graph():
        return False
    if not forward_batch.forward_mode.is_extend():
        return False
    if enable_multi_stream:
        fallback_once(PATCH_ID, FALLBACKS["multi_stream"], key="multi_stream")
        return False
    if importlib.import_module(REPLAY_TAIL).in_replay_tail_graph():
        fallback_once(PATCH_ID, FALLBACKS["replay_tail"], key="replay_tail")
        return False
    return True


def around_c4_indexer_forward(
    original,
    self,
    x,
    q_lora,
    forward_batch,
    attn_backend,
    enable_multi_stream=False,
    q_lora_ready=None,
    skip_compressor=False,
    q_lora_quant=None,
):
    """Compressor captured, the rest of the indexer an eager break at the live width."""
    if not FLAG.get() or not _acts_here(forward_batch, enable_multi_stream):
        return original(
            self,
            x=x,
            q_lora=q_lora,
            forward_batch=forward_batch,
            attn_backend=attn_backend,
            enable_multi_stream=enable_multi_stream,
            q_lora_ready=q_lora_ready,
            skip_compressor=skip_compressor,
            q_lora_quant=q_lora_quant,
        )
    if not skip_compressor:
        # Upstream's _forward_prepare_normal runs it after Q and weights; nothing it writes
        # is read by them, and the logits (in the break) still come after it.
        attn_backend.forward_indexer_compressor(
            x=x,
            forward_batch=forward_batch,
            layer_id=self.layer_id,
            compressor=self.compressor,
        )
    counters.count(PATCH_ID, "layers_wrapped")
    return _break()(original, self, x, q_lora, attn_backend, q_lora_quant)


def explain_for_deployment(plan) -> str:
    """For `plan`: whether this deployment's (a graph_plan.GraphPlan) c4 indexer breaks."""
    facts, prefill = plan.facts, plan.prefill
    if not facts.deepseek_v4:
        return "not a DeepSeek-V4 model: no c4 indexer"
    if prefill.backend != "breakable" or not prefill.buckets:
        return "no breakable prefill graph: eager steps already score the live context"
    if _multi_stream_on():
        return f"falls back to upstream: {FALLBACKS['multi_stream']}"
    return (
        "each c4 layer's indexer logits and top-k run in an eager break at the live context "
        "(one more segment per c4 layer); the compressor stays captured"
    )


HOOKS = (
    Hook(
        f"{INDEXER}.forward",
        "method",
        "self, x, q_lora, forward_batch, attn_backend, enable_multi_stream, q_lora_ready, "
        "skip_compressor, q_lora_quant",
        HookType.AROUND,
        around_c4_indexer_forward,
    ),
)

PATCH = Patch(
    id=PATCH_ID,
    summary="DSV4 breakable prefill graph: c4 indexer logits and top-k at the live context",
    flags=(FLAG,),
    hooks=HOOKS,
    is_enabled=lambda: bool(FLAG.get()),
    explain=explain_for_deployment,
    capture_effects=lambda: (
        frozenset({CaptureEffect.INDEXER_LOGITS_EAGER}) if acts_in_captures() else frozenset()
    ),
    why=(
        "upstream captures DeepSeek-V4's c4 indexer in the breakable prefill graph at the "
        "capture width (the whole context unless --cuda-graph-prefill-max-context bounds it): "
        "every replay scores rows x width/4 logits, which the torch fallback pays in time and "
        "every install in graph-pool memory"
    ),
    how=(
        "the compressor stays captured; Q, weights, logits and top-k run in one eager break per "
        "c4 layer (eager_on_graph) over the page table narrowed to the step's longest sequence; "
        "rows stay the bucket's, so the captured schedules hold"
    ),
    retired_by=(
        "upstream's C4Indexer running its logits at an eager break or at a live-width page "
        "table in breakable replays (as its V4.1 low-ratio sources do)"
    ),
    docs_page="docs/capture-width.md",
    reads=(
        (f"{BCG_MODULE}.eager_on_graph", Callable),
        (f"{BCG_CONTEXT}.is_in_breakable_cuda_graph", Callable),
        (f"{TC_CONTEXT}.get_tc_piecewise_forward_context", Callable),
        (f"{REPLAY_TAIL}.in_replay_tail_graph", Callable),
    ),
)
