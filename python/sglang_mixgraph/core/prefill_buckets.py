"""Prefill CUDA-graph bucket derivation for mixed chunked prefill. No sglang imports.

What a prefill graph replay sees on one DP rank (see docs/graph-config.md):
- a mixed step is at most ``C`` tokens, C = per-rank chunked prefill size: the prefill budget
  is charged for the decode rows first (`sglang.srt.managers.schedule_policy.PrefillAdder.__init__`),
  and a chunk ends on a KV page boundary (`PrefillAdder._select_prefill_admission`), so with
  pages of P tokens a mixed step that chunks a prompt is between C - P + 1 and C tokens
  (DeepSeek-V4, P = 256, C = 2816: 2560 prefill tokens + d decode rows);
- a prefill-only step, or a mixed step whose queue ran dry, is at most ``C`` tokens;
- a decode batch relabelled to a 1-token EXTEND under DP attention is at most ``R``
  tokens, R = running requests per DP rank
  (max_running_requests // attn_dp_size,
  `sglang.srt.model_executor.pool_configurator.DSV4PoolConfigurator.__init__`).

The runner replays the smallest captured bucket >= the live size, and only when the
bucket is at most ``max_padding`` (2) times the live size; otherwise the step runs
eagerly (`_MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR` and `PrefillCudaGraphRunner.can_replay_locally`
in `sglang.srt.model_executor.runner.prefill_cuda_graph_runner`). Under DP attention every
rank is padded to the bucket of the largest rank
(`sglang.srt.model_executor.forward_batch_info.ForwardBatch.prepare_mlp_sync_batch`).

The derived list is therefore: C, then a halving ladder down to ``min_bucket`` (each
step divides by at most ``max_padding`` and rounds up to a multiple of 8, so every size
from ``min_bucket/max_padding`` to C replays), plus a bucket at R (rounded up to 8) so
relabelled decode batches land without padding beyond alignment, plus, where pages are
large against C, a band of buckets every P/8 tokens in (C - P, C] so that mixed steps pad by
at most P/8 - 1 rows instead of P - 1, everything rounded up to the capture alignment and
capped by the MoE per-rank cap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# The prefill runner's replay cap: a bucket replays only up to this many times the
# live token count (`prefill_cuda_graph_runner._MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR`).
UPSTREAM_MAX_PADDING_FACTOR = 2.0
# Below this many tokens a step is launch-bound whichever list is used; upstream's
# generic list starts at 4 (`cuda_graph_hook.generate_prefill_cuda_graph_batch_sizes`), ours
# stops halving here.
DEFAULT_MIN_BUCKET = 16
# Ladder buckets (all but C) are multiples of this, like upstream's small steps
# (`generate_prefill_cuda_graph_batch_sizes`) and DeepEP's requirement
# (`cuda_graph_hook.apply_deepep_adjustments`).
LADDER_GRANULARITY = 8
# The mixed band: buckets every page/8 tokens below C, added only when a page is at least this
# share of C (below it a mixed step pads by less than 2% without the band).
BAND_MIN_PAGE_SHARE = 0.02
BAND_DIVISIONS = 8


class BucketDerivationError(ValueError):
    """The inputs do not admit a bucket list (for example C above the MoE cap)."""


def derivation_gap(
    *,
    pp_size: int,
    context_parallel: bool,
    speculative: bool,
    chunked: bool,
    pd_decode: bool = False,
    dllm: bool = False,
) -> str | None:
    """Why the derivation leaves a breakable deployment to upstream's list (a phrase), or None.
    The patch's resolution (``planner.graph_plan.unhandled``) and advise's pricing
    (``advise.auto_buckets.unhandled``) both ask it, each from the facts it has."""
    if pp_size > 1:
        return "pipeline parallelism (upstream's PP bucket policy applies)"
    if context_parallel:
        return "prefill context parallelism"
    if speculative:
        return "speculative decoding"
    if pd_decode:
        return "PD decode node"
    if dllm:
        return "diffusion LLM inference"
    if not chunked:
        return "chunked prefill disabled"
    return None


def ceil_align(value: int, alignment: int) -> int:
    if alignment <= 1:
        return int(value)
    return (int(value) + alignment - 1) // alignment * alignment


def bucket_alignment(*, attn_tp_size: int = 1, deepep: bool = False) -> int:
    """Granularity every bucket is rounded up to.

    The runner rounds capture sizes up to the attention-TP width when gathered buffers
    are used (`sglang.srt.utils.common.get_cuda_graph_batch_size_alignment`,
    `prefill_cuda_graph_runner.get_prefill_num_tokens_to_capture`), and DeepEP needs
    multiples of 8 under BCG (`cuda_graph_hook.apply_deepep_adjustments`). Rounding
    here keeps the list we declare equal to the list that is captured.
    """
    alignment = max(1, int(attn_tp_size))
    if deepep:
        alignment = alignment * 8 // math.gcd(alignment, 8)
    return alignment


def mixed_band(top: int, page_size: int, step: int) -> list[int]:
    """Buckets below ``top`` (aligned C) every ``page_size / 8`` tokens (a multiple of ``step``)
    down to the smallest mixed step a page boundary allows, C - P + 1; empty when pages are
    small against C (`BAND_MIN_PAGE_SHARE`) or not below it."""
    if page_size <= 1 or page_size >= top or page_size < BAND_MIN_PAGE_SHARE * top:
        return []
    gap = ceil_align(max(step, math.ceil(page_size / BAND_DIVISIONS)), step)
    lowest = top - page_size + 1
    return [top - j * gap for j in range(1, page_size // gap + 1) if top - j * gap >= lowest]


def derive_prefill_buckets(
    *,
    chunk_per_rank: int,
    running_per_rank: int | None,
    cap: int | None = None,
    alignment: int = 1,
    max_padding: float = UPSTREAM_MAX_PADDING_FACTOR,
    min_bucket: int = DEFAULT_MIN_BUCKET,
    page_size: int = 1,
) -> list[int]:
    """The derived bucket list for one DP rank, ascending.

    chunk_per_rank: C, the per-rank chunked prefill size (the largest bucket).
    running_per_rank: R, max running requests per DP rank (None when unknown).
    cap: the MoE per-rank token cap (MegaMoE); every bucket must be at most this.
    page_size: P, the KV page the scheduler ends chunks on; 1 (or 0) leaves the band out.
    """
    if chunk_per_rank <= 0:
        raise BucketDerivationError(
            f"chunked prefill size per rank must be positive, got {chunk_per_rank}"
        )
    if max_padding <= 1.0:
        raise BucketDerivationError(f"max_padding must be above 1, got {max_padding}")
    alignment = max(1, int(alignment))
    top = ceil_align(chunk_per_rank, alignment)
    step = alignment * LADDER_GRANULARITY // math.gcd(alignment, LADDER_GRANULARITY)
    if cap is not None and top > cap:
        raise BucketDerivationError(
            f"the per-rank chunk {chunk_per_rank} (aligned {top}) exceeds the MoE per-rank "
            f"token cap {cap}"
        )
    floor = max(step, ceil_align(min(min_bucket, top), step))
    buckets = {top, *mixed_band(top, page_size, step)}
    b = top
    while b > floor:
        nxt = max(floor, ceil_align(math.ceil(b / max_padding), step))
        if nxt >= b:  # alignment stops the ladder from shrinking
            break
        buckets.add(nxt)
        b = nxt
    if running_per_rank is not None and 0 < running_per_rank < top:
        rb = ceil_align(running_per_rank, step)
        if rb > top or rb > running_per_rank * max_padding:
            rb = ceil_align(running_per_rank, alignment)
        buckets.add(rb)
    return sorted(b for b in buckets if cap is None or b <= cap)


def bucket_for(size: int, buckets: Sequence[int]) -> int | None:
    """The bucket a live size replays on (the smallest >= size), or None if above all."""
    for b in sorted(buckets):
        if b >= size:
            return b
    return None


def replays(
    size: int, buckets: Sequence[int], max_padding: float = UPSTREAM_MAX_PADDING_FACTOR
) -> bool:
    b = bucket_for(size, buckets)
    return b is not None and b <= size * max_padding


@dataclass(frozen=True)
class PaddingProfile:
    """How a bucket list treats every live size in [lo, hi] (tokens)."""

    lo: int
    hi: int
    count: int
    largest: int
    smallest_replayed: int | None  # smallest size in range that replays
    eager_sizes: int  # sizes in range that run eagerly (above the padding cap or all buckets)
    worst_factor: float  # max bucket/size over replayed sizes
    worst_waste_tokens: int  # max bucket - size over replayed sizes
    mean_factor: float  # mean bucket/size over replayed sizes


def _harmonic(n: int) -> float:
    """H(n) = 1 + 1/2 + ... + 1/n; exact below 64 terms, asymptotic expansion above (error < 1e-15)."""
    if n <= 0:
        return 0.0
    if n < 64:
        return math.fsum(1.0 / k for k in range(1, n + 1))
    inv = 1.0 / n
    inv2 = inv * inv
    return (
        math.log(n) + 0.5772156649015329 + 0.5 * inv - inv2 / 12 + inv2 * inv2 / 120 - inv2**3 / 252
    )


def padding_profile(
    buckets: Sequence[int],
    lo: int = 1,
    hi: int | None = None,
    max_padding: float = UPSTREAM_MAX_PADDING_FACTOR,
) -> PaddingProfile:
    """Profile over every integer size in [lo, hi] (hi defaults to the largest bucket).

    Computed per bucket, not per size, so the cost does not grow with the sizes: bucket b
    serves the sizes above the previous bucket up to b, and replays those of them that are
    at least b / max_padding.
    """
    ordered = sorted(set(int(b) for b in buckets))
    if not ordered:
        raise ValueError("empty bucket list")
    lo = max(1, lo)
    hi = ordered[-1] if hi is None else hi
    worst_factor, worst_waste, factor_sum, replayed = 1.0, 0, 0.0, 0
    smallest = None
    previous = 0
    for b in ordered:
        # sizes previous+1 .. b land on b; those >= ceil(b / max_padding) replay
        first = max(previous + 1, lo, math.ceil(b / max_padding))
        last = min(b, hi)
        previous = b
        if first > last:
            continue
        if smallest is None:
            smallest = first
        replayed += last - first + 1
        worst_factor = max(worst_factor, b / first)
        worst_waste = max(worst_waste, b - first)
        factor_sum += b * (_harmonic(last) - _harmonic(first - 1))
    total = max(0, hi - lo + 1)
    return PaddingProfile(
        lo=lo,
        hi=hi,
        count=len(ordered),
        largest=ordered[-1],
        smallest_replayed=smallest,
        eager_sizes=total - replayed,
        worst_factor=worst_factor,
        worst_waste_tokens=worst_waste,
        mean_factor=factor_sum / replayed if replayed else 0.0,
    )


def mixed_sampling_rows_bound(
    *, running_per_rank: int, attn_dp_size: int, attn_dp_enabled: bool, draft_tokens: int = 1
) -> int:
    """Rows a mixed step hands the logits all-gather, at most.

    Without logprobs a request contributes one sampling row
    (`sglang.srt.managers.scheduler_components.dp_attn.prepare_mlp_sync_batch_raw`). New
    requests are admitted only while running + new < max running requests
    (`sglang.srt.managers.scheduler.Scheduler._get_new_batch_prefill_raw`), and the request
    being chunked is one more row, so one rank contributes at most R + 1 rows. Under DP
    attention the logits processor gathers every rank's rows before the vocab all-gather
    (`sglang.srt.layers.logits_processor.LogitsMetadata.compute_dp_attention_metadata`), so
    the gather sees the sum.
    """
    per_rank = running_per_rank * max(1, draft_tokens) + 1
    return per_rank * attn_dp_size if attn_dp_enabled else per_rank
