"""Capture-memory model for breakable prefill CUDA graphs. No sglang imports.

An estimate, not a measurement: it states which allocations a BCG prefill capture
keeps alive, per the upstream code (modules under the installed `sglang.srt`), and sums
them for a bucket list. docs/graph-config.md walks through every term.

Needed, for buckets b_1..b_n (tokens per rank), largest b_max:
- graph objects: n x 8 MiB, upstream's own per-bucket estimate of non-torch graph
  memory (`arg_groups.memory_hook.reserve_for_graph_mb`);
- static inputs and the shared output buffer, sized once for b_max
  (`PrefillCudaGraphRunner.__init__`'s input buffers in
  `model_executor.runner.prefill_cuda_graph_runner`; the shared output buffer of
  `BreakableCudaGraphBackend.capture_one` in `model_executor.runner_backend`);
- the activations of the captured segments: buckets capture largest first into one
  private graph pool (`PrefillCudaGraphRunner._capture_one_stream`,
  `BreakableCudaGraphBackend.capture_session`), which keeps the largest bucket's high-water
  mark and which eager forwards cannot reuse (upstream's reserve assumes they can: "Only
  non-torch memory is counted", `reserve_for_graph_mb`). Counted as upstream's own eager
  activation figure for b_max tokens (1.5 MiB a token, `handle_gpu_memory_settings`), plus,
  where the c4 indexer computes its logits in torch (`SGLANG_FP8_PAGED_MQA_LOGITS_TORCH`),
  its per-head fp32 logits [b_max, index heads, W/4] times the copies alive at the peak.
  Measured on the H200 (DeepSeek-V4-Pro attention, 2816-token bucket, torch logits): the
  first bucket took 18.2 GB at W=8192 and 9.5 GB at W=2304, the other nine about 50 MiB each
  (docs/results/rank_slice_h200.md); the copies factor is the slope between the two;
- DeepSeek-V4 only, per bucket (sum over buckets):
  * the captured attention metadata, kept per bucket
    (`PrefillCudaGraphRunner._init_forward_metadata_for_capture`) and built at the capture
    context width W (`DeepseekV4AttnBackend.init_forward_metadata_for_breakable_cuda_graph_capture`
    and `._prefill_graph_context_width` in `layers.attention.deepseek_v4_backend`; W is
    --cuda-graph-prefill-max-context or the pool's context width, 1296): c4 sparse page
    and raw indices (2 x index_topk int32, `DSV4AttnMetadata.init_flashmla_related`), c128
    page indices (W/128 int32), the indexer page table (W/page_size int32), SWA page
    indices (the window), a few scalars;
  * the c4 indexer logits, fp32 [b, W/4] rows padded to 256 columns
    (`layers.attention.mqa_logits_utils.mqa_logits_row_bytes`), never row-chunked under
    capture (`layers.attention.dsv4.metadata.PagedIndexerMetadata._mqa_logits_budget`).
    Upstream's DSV4 rule says this scratch "is pinned in the capture pool and OOMs"
    (`arg_groups.cuda_graph_hook.disable_breakable_cudagraph_if_incompatible`); we take
    that at its word and count it for every bucket (conservative).
  Neither logits term is counted when the live-width indexer patch acts: it computes the
  logits in an eager break, outside the pool (its capture of the 2816 bucket took 6.4 GiB
  against 15.8 GiB without it, same launch, docs/results/rank_slice_h200.md).

Available: the GPU memory outside the static fraction, total x (1 - mem_fraction_static)
(weights and the KV pool live inside the fraction; `memory_hook.handle_gpu_memory_settings`),
minus what upstream reserves there for everything else: 512 MiB of backend metadata, eager
activations for one chunk, the parallel-size slack (all three in `handle_gpu_memory_settings`),
decode graphs (`reserve_for_graph_mb`), DeepEP buffers (`reserve_for_deepep_a2a_mb`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

# Where the effects a patch declares are defined; importable from here too (`resolution.resolve`).
from sglang_mixgraph.core.capture_effects import CaptureEffect  # noqa: F401

MiB = 1 << 20
GiB = 1 << 30

# `memory_hook.reserve_for_graph_mb`: "len(prefill_cuda_graph_config.bs) * 8" MiB for
# non-MLA models.
GRAPH_OBJECT_BYTES_PER_BUCKET = 8 * MiB
# `memory_hook.handle_gpu_memory_settings`: "activation_tokens * 1.5" MiB.
ACTIVATION_BYTES_PER_TOKEN = int(1.5 * MiB)
# `handle_gpu_memory_settings`: constant backend metadata.
CONSTANT_RESERVE_BYTES = 512 * MiB
# `handle_gpu_memory_settings`: activation tokens are at least 2048.
MIN_ACTIVATION_TOKENS = 2048
# `mqa_logits_utils.MQA_LOGITS_BYTES_PER_ELEM` and `MQA_LOGITS_ROW_ALIGN_ELEMS`.
LOGITS_BYTES_PER_ELEM = 4
LOGITS_ROW_ALIGN = 256
# Static per-token input slots: input ids, positions, out cache loc, seq/extend
# bookkeeping; int64 each (`prefill_cuda_graph_runner._PREFILL_STATIC_FIELDS`).
STATIC_INPUT_BYTES_PER_TOKEN = 8 * 8
# Per-head c4 indexer logits alive at once at the pool's peak when the indexer computes them in
# torch: the slope of two captures at W=8192 and W=2304 on the H200 (8.4), rounded down.
TORCH_LOGITS_LIVE_COPIES = 8
# Default safety margin: the estimate must fit in this fraction of what is available.
DEFAULT_MARGIN_FRACTION = 0.10


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class SparseIndexerShape:
    """The DeepSeek-V4 parts of the model that size per-bucket capture metadata."""

    index_topk: int
    context_width: int  # W: capture context width in tokens
    page_size: int = 256
    swa_window: int = 128
    c4_ratio: int = 4
    c128_ratio: int = 128
    scalar_ints_per_token: int = 16
    index_heads: int = 64
    torch_logits: bool = False  # the indexer's logits in torch (per head), not deep_gemm
    # The live-width indexer patch runs the logits in an eager break: outside the graph pool.
    logits_eager: bool = False
    # The split's decode-tail graphs (their query heads; 0: they do not run) hold their own
    # buffers and pool next to the prefill graphs (core.decode_tail_graphs.tail_graph_bytes).
    decode_tail_heads: int = 0

    def metadata_bytes_per_token(self) -> int:
        ints = (
            2 * self.index_topk
            + _ceil_div(self.context_width, self.c128_ratio)
            + _ceil_div(self.context_width, self.page_size)
            + self.swa_window
            + self.scalar_ints_per_token
        )
        return 4 * ints

    def logits_bytes_per_token(self) -> int:
        if self.logits_eager:
            return 0
        cols = _ceil_div(self.context_width, self.c4_ratio)
        cols = _ceil_div(cols, LOGITS_ROW_ALIGN) * LOGITS_ROW_ALIGN
        return cols * LOGITS_BYTES_PER_ELEM

    def decode_tail_graph_bytes(self) -> int:
        if not self.decode_tail_heads:
            return 0
        from sglang_mixgraph.core.decode_tail_graphs import tail_graph_bytes

        swa = _ceil_div(self.swa_window, 64) * 64  # index widths are padded to 64
        c128 = _ceil_div(_ceil_div(self.context_width, self.c128_ratio), 64) * 64
        widths = {0: (swa, 0), self.c4_ratio: (swa, self.index_topk), self.c128_ratio: (swa, c128)}
        return tail_graph_bytes(self.decode_tail_heads, widths)

    def torch_logits_peak_bytes_per_token(self) -> int:
        """Per-head fp32 logits over W/4 columns, the copies alive at the peak (torch path)."""
        if not self.torch_logits or self.logits_eager:
            return 0
        cols = _ceil_div(self.context_width, self.c4_ratio)
        return TORCH_LOGITS_LIVE_COPIES * self.index_heads * cols * LOGITS_BYTES_PER_ELEM


@dataclass(frozen=True)
class ModelShape:
    hidden_size: int
    hidden_multiplier: int = 1  # DSV4 hyper-connections carry hc_mult residual copies
    dtype_bytes: int = 2
    sparse: SparseIndexerShape | None = None  # DeepSeek-V4 only


# The estimate's terms in words (the keys of `_terms`), for the lines a user reads.
TERM_WORDS = {
    "graph_objects": "graph objects",
    "static_buffers": "static inputs and output",
    "graph_pool_activations": "the largest bucket's activations in the graph pool",
    "dsv4_captured_metadata": "captured attention metadata",
    "dsv4_indexer_logits": "c4 indexer logits",
    "dsv4_decode_tail_graphs": "the split's decode-tail graphs",
}


@dataclass(frozen=True)
class CaptureEstimate:
    buckets: tuple[int, ...]
    terms: dict[str, int]  # bytes per term

    @property
    def total(self) -> int:
        return sum(self.terms.values())

    def largest_terms(self, count: int = 2) -> str:
        """The largest terms in words, e.g. "4.1 GiB the largest bucket's activations in the
        graph pool, 154 MiB static inputs and output": what a user would cut first."""
        top = sorted(self.terms.items(), key=lambda kv: -kv[1])[:count]
        return ", ".join(f"{fmt_bytes(v)} {TERM_WORDS[k]}" for k, v in top)


def _terms(count: int, largest: int, total_tokens: int, model: ModelShape) -> dict[str, int]:
    """The estimate's terms for `count` buckets, the largest `largest`, summing `total_tokens`."""
    terms = {
        "graph_objects": GRAPH_OBJECT_BYTES_PER_BUCKET * count,
        "static_buffers": largest
        * (
            STATIC_INPUT_BYTES_PER_TOKEN
            + model.hidden_size * model.hidden_multiplier * model.dtype_bytes
        ),
        "graph_pool_activations": largest
        * (
            ACTIVATION_BYTES_PER_TOKEN
            + (model.sparse.torch_logits_peak_bytes_per_token() if model.sparse else 0)
        ),
    }
    if model.sparse is not None:
        terms["dsv4_captured_metadata"] = total_tokens * model.sparse.metadata_bytes_per_token()
        terms["dsv4_indexer_logits"] = total_tokens * model.sparse.logits_bytes_per_token()
        if model.sparse.decode_tail_heads:
            terms["dsv4_decode_tail_graphs"] = model.sparse.decode_tail_graph_bytes()
    return terms


def estimate_capture_bytes(buckets: Sequence[int], model: ModelShape) -> CaptureEstimate:
    ordered = tuple(sorted(set(int(b) for b in buckets)))
    if not ordered:
        return CaptureEstimate(ordered, {})
    return CaptureEstimate(ordered, _terms(len(ordered), ordered[-1], sum(ordered), model))


def decode_graph_reserve_bytes(
    *,
    decode_max_bs: int,
    decode_graph_on: bool,
    attn_dp_enabled: bool,
    attn_dp_size: int,
    prefill_node: bool = False,
) -> int:
    """Upstream's decode-graph reserve (`memory_hook.reserve_for_graph_mb`), in bytes."""
    if prefill_node:
        return 0
    mib = 0.0
    if decode_graph_on:
        mib += decode_max_bs * 2
    if attn_dp_enabled:
        mib += decode_max_bs * attn_dp_size * 3
        if decode_max_bs > 300:
            mib += decode_max_bs * attn_dp_size * 1.5
    return int(mib * MiB)


@dataclass(frozen=True)
class MemoryBudget:
    total_bytes: int
    mem_fraction_static: float
    reserves: dict[str, int] = field(default_factory=dict)  # bytes, kept for everything else

    @property
    def outside_static(self) -> int:
        return round(self.total_bytes * (1.0 - self.mem_fraction_static))

    @property
    def available(self) -> int:
        return self.outside_static - sum(self.reserves.values())


def memory_budget(
    *,
    total_bytes: int,
    mem_fraction_static: float,
    chunk_per_rank: int,
    tp_size: int,
    pp_size: int,
    decode_reserve_bytes: int,
    deepep_reserve_bytes: int = 0,
) -> MemoryBudget:
    activation_tokens = max(chunk_per_rank, MIN_ACTIVATION_TOKENS)
    reserves = {
        "constant": CONSTANT_RESERVE_BYTES,
        "eager_activations": activation_tokens * ACTIVATION_BYTES_PER_TOKEN,
        "parallel_slack": int(tp_size * pp_size / 8 * 1024 * MiB),  # `handle_gpu_memory_settings`
        "decode_graphs": decode_reserve_bytes,
    }
    if deepep_reserve_bytes:
        reserves["deepep"] = deepep_reserve_bytes
    return MemoryBudget(total_bytes, mem_fraction_static, reserves)


@dataclass(frozen=True)
class Verdict:
    fits: bool
    needed: int
    available: int
    margin_fraction: float

    @property
    def margin_bytes(self) -> int:
        return self.available - self.needed


def decide(
    needed: int, available: int, margin_fraction: float = DEFAULT_MARGIN_FRACTION
) -> Verdict:
    """BCG stays on when the estimate fits in available x (1 - margin)."""
    fits = available > 0 and needed <= available * (1.0 - margin_fraction)
    return Verdict(fits=fits, needed=needed, available=available, margin_fraction=margin_fraction)


def largest_fitting_prefix(
    buckets: Sequence[int],
    model: ModelShape,
    available: int,
    margin_fraction: float = DEFAULT_MARGIN_FRACTION,
) -> int | None:
    """The largest max-bucket b such that the buckets <= b fit; None if none do.

    Used to suggest a --cuda-graph-max-bs-prefill when the estimate does not fit.
    """
    ordered = sorted(set(int(b) for b in buckets))
    best, tokens = None, 0
    for count, b in enumerate(ordered, 1):  # one pass: the estimate of a prefix grows with it
        tokens += b
        if not decide(
            sum(_terms(count, b, tokens, model).values()), available, margin_fraction
        ).fits:
            break
        best = b
    return best


@dataclass(frozen=True)
class Calibration:
    """What the estimate's measured parts (the torch-logits peak, TORCH_LOGITS_LIVE_COPIES, and
    the check of the whole against real captures) were fitted and checked on."""

    model: str  # in words
    architectures: tuple[str, ...]  # the HF architectures that model has
    gpus: tuple[str, ...]  # as `plan --target-gpu` names them

    @property
    def gpu_words(self) -> str:
        return " and the ".join(self.gpus)


# DeepSeek-V4-Pro's attention stack: fitted on one H200 (docs/results/rank_slice_h200.md),
# checked within 12% of SGLang's own captures on one H100 (docs/results/replay_cost_h100.md)
# and, with the same bytes per shape, on one H200 (docs/results/bcg_auto_h200.md).
CALIBRATION = Calibration("DeepSeek-V4-Pro", ("DeepseekV4ForCausalLM",), ("H200", "H100"))


def not_calibrated_for(architectures: Sequence[str], gpu: str) -> str | None:
    """The model and/or GPU of a deployment the estimate was not fitted on, in words (e.g.
    "GlmMoeDsaForCausalLM on the B300"), or None where it was fitted."""
    parts = []
    if not set(architectures) & set(CALIBRATION.architectures):
        parts.append(", ".join(architectures) or "this model")
    if gpu.upper() not in CALIBRATION.gpus:
        parts.append(f"the {gpu}")
    return " on ".join(parts) or None


def model_calibrated(architectures: Sequence[str]) -> bool:
    """Whether the estimate was fitted on this model. Its activation term (bytes per captured
    token) is the model's attention and MoE stack measured on one GPU; another model's is not
    that, while the same model on another GPU keeps it (then the verdict is only hedged)."""
    return bool(set(architectures) & set(CALIBRATION.architectures))


def fmt_bytes(n: int) -> str:
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n >= GiB:
        return f"{sign}{n / GiB:.1f} GiB"
    return f"{sign}{n / MiB:.0f} MiB"
