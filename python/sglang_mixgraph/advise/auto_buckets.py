"""The prefill buckets `SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto` would capture on a running server.

advise recommends `auto` for a host-bound eager MIXED step, so it prices the replay in the
buckets `auto` would capture, not in the server's current list: SGLang's generic list pads a
chunk-1280 MIXED step of 1,037 rows to 1,280 (+23%), `auto`'s band to 1,056 (+2%). The list
comes from the same derivation the patch applies (`core.prefill_buckets.derive_prefill_buckets`,
as `planner.graph_plan.derive_buckets` calls it), on what `/server_info` says: the per-rank
chunk, the running requests per DP rank, the KV page, the attention-TP alignment. The mixed band
(buckets every page/8 tokens just below the chunk) is DeepSeek-V4's only where its capture
estimate fits, which `/server_info` cannot tell (`plan` can): both lists are returned, with the
band and without. Where the user set the prefill buckets, or `auto` leaves the deployment to
upstream, the server's own list stays the price.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_mixgraph.advise.server import ServerFacts
from sglang_mixgraph.core.prefill_buckets import (
    BucketDerivationError,
    bucket_alignment,
    derivation_gap,
    derive_prefill_buckets,
)


@dataclass(frozen=True)
class AutoBuckets:
    banded: tuple[int, ...]  # with the mixed band (DeepSeek-V4, where its capture fits)
    narrow: tuple[int, ...]  # without it (every other model, or a band that does not fit)


def unhandled(facts: ServerFacts) -> str | None:
    """Why `auto` would keep the server's list here (buckets the user set, an unsupported
    backend, then `core.prefill_buckets.derivation_gap` on what `/server_info` shows), or None."""
    if facts.prefill_buckets_user_set:
        return "the prefill buckets are set on the command line (they win over auto)"
    if facts.prefill_graph.backend not in ("breakable", "disabled"):
        return f"prefill graph backend {facts.prefill_graph.backend!r}"
    return derivation_gap(
        pp_size=facts.pp_size,
        context_parallel=bool(facts.context_parallel),
        speculative=bool(facts.speculative_algorithm),
        chunked=bool(facts.chunked_prefill_size) and facts.chunked_prefill_size > 0,
    )


def auto_prefill_buckets(facts: ServerFacts) -> AutoBuckets | None:
    """The lists `auto` would derive for this server, or None where it keeps the server's."""
    if unhandled(facts) is not None:
        return None
    attn_dp = max(1, facts.attn_dp_size)
    top = facts.chunked_prefill_size
    if facts.prefill_graph.buckets:  # upstream's own cap on the prefill max_bs
        top = min(top, max(facts.prefill_graph.buckets))
    running = facts.max_running_requests

    def derive(page_size: int) -> tuple[int, ...]:
        return tuple(
            derive_prefill_buckets(
                chunk_per_rank=top,
                running_per_rank=None if running is None else max(1, running // attn_dp),
                alignment=bucket_alignment(
                    attn_tp_size=max(1, facts.tp_size // attn_dp),
                    deepep=facts.moe_a2a_backend == "deepep",
                ),
                page_size=page_size,
            )
        )

    try:
        narrow = derive(1)
        return AutoBuckets(derive(facts.page_size or 1) if facts.deepseek_v4 else narrow, narrow)
    except BucketDerivationError:
        return None
