"""core.capture_memory: the capture-memory model of a bucket list (per-token terms, the graph
pool, eager indexer logits), the budget and its verdict, and the largest fitting prefix."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_mixgraph.core.capture_memory import (
    GRAPH_OBJECT_BYTES_PER_BUCKET,
    MiB,
    ModelShape,
    SparseIndexerShape,
    decide,
    decode_graph_reserve_bytes,
    estimate_capture_bytes,
    largest_fitting_prefix,
    memory_budget,
)

DSV4 = ModelShape(
    hidden_size=7168,
    hidden_multiplier=4,
    sparse=SparseIndexerShape(index_topk=1024, context_width=1 << 20),
)


def test_dsv4_terms_per_token():
    sparse = DSV4.sparse
    # c4 logits: W/4 fp32 columns (already a multiple of 256) -> 1 MiB per token at 1M context
    assert sparse.logits_bytes_per_token() == (1 << 20) // 4 * 4
    ints = 2 * 1024 + (1 << 20) // 128 + (1 << 20) // 256 + 128 + 16
    assert sparse.metadata_bytes_per_token() == 4 * ints


def test_estimate_sums_per_bucket_terms():
    est = estimate_capture_bytes([2816, 16, 1408], DSV4)
    assert est.buckets == (16, 1408, 2816)
    assert est.terms["graph_objects"] == 3 * GRAPH_OBJECT_BYTES_PER_BUCKET
    assert (
        est.terms["dsv4_indexer_logits"]
        == (16 + 1408 + 2816) * DSV4.sparse.logits_bytes_per_token()
    )
    assert est.total == sum(est.terms.values())
    dense = estimate_capture_bytes([2816, 16, 1408], ModelShape(hidden_size=1024))
    assert "dsv4_indexer_logits" not in dense.terms and dense.total < est.total
    # more buckets never need less memory
    assert estimate_capture_bytes([16, 1408, 2816, 704], DSV4).total > est.total


def test_graph_pool_keeps_the_largest_buckets_activations():
    """The private pool's high-water mark: upstream's per-token activation figure for b_max, and
    with the torch indexer path its per-head logits; measured on the H200 at 18.2 GB (W=8192) and
    9.5 GB (W=2304) for the first of ten buckets, about 50 MiB for each of the others."""
    from sglang_mixgraph.core.capture_memory import (
        ACTIVATION_BYTES_PER_TOKEN,
        TORCH_LOGITS_LIVE_COPIES,
    )

    def shape(width, torch_logits):
        return ModelShape(
            hidden_size=7168,
            hidden_multiplier=4,
            sparse=SparseIndexerShape(
                index_topk=1024, context_width=width, index_heads=64, torch_logits=torch_logits
            ),
        )

    buckets = [16, 24, 48, 88, 176, 256, 352, 704, 1408, 2816]
    fused = estimate_capture_bytes(buckets, shape(8192, False)).terms["graph_pool_activations"]
    assert fused == 2816 * ACTIVATION_BYTES_PER_TOKEN  # the largest bucket alone, not the sum
    per_head = TORCH_LOGITS_LIVE_COPIES * 64 * (8192 // 4) * 4
    torch_term = estimate_capture_bytes(buckets, shape(8192, True)).terms
    assert torch_term["graph_pool_activations"] == 2816 * (ACTIVATION_BYTES_PER_TOKEN + per_head)
    # within 25% of the two captures on the H200 (device memory taken, all ten buckets)
    for width, measured_mib in ((8192, 18712), (2304, 10186)):
        total = estimate_capture_bytes(buckets, shape(width, True)).total / MiB
        assert 0.75 <= total / measured_mib <= 1.25, (width, total)


def test_eager_indexer_logits_leave_the_graph_pool():
    """The live-width indexer patch's capture of the 2816 bucket (W=8192, torch logits) took
    6.5 GiB on the H200, against 16.2 GiB with the logits captured."""
    from sglang_mixgraph.core.capture_memory import ACTIVATION_BYTES_PER_TOKEN

    def shape(eager):
        return ModelShape(
            hidden_size=7168,
            hidden_multiplier=4,
            sparse=SparseIndexerShape(
                index_topk=1024,
                context_width=8192,
                torch_logits=True,
                logits_eager=eager,
            ),
        )

    buckets = [16, 1408, 2816]
    captured, eager = (estimate_capture_bytes(buckets, shape(e)).terms for e in (False, True))
    assert eager["dsv4_indexer_logits"] == 0 < captured["dsv4_indexer_logits"]
    assert eager["graph_pool_activations"] == 2816 * ACTIVATION_BYTES_PER_TOKEN
    assert captured["graph_pool_activations"] > eager["graph_pool_activations"]
    assert eager["dsv4_captured_metadata"] == captured["dsv4_captured_metadata"]


def test_budget_and_verdict():
    decode = decode_graph_reserve_bytes(
        decode_max_bs=512, decode_graph_on=True, attn_dp_enabled=True, attn_dp_size=8
    )
    assert decode == (512 * 2 + 512 * 8 * 3 + 512 * 8 * 1.5) * MiB
    budget = memory_budget(
        total_bytes=300_000 * MiB,
        mem_fraction_static=0.8,
        chunk_per_rank=2816,
        tp_size=8,
        pp_size=1,
        decode_reserve_bytes=decode,
    )
    assert budget.outside_static == 60_000 * MiB
    assert budget.reserves["eager_activations"] == int(2816 * 1.5 * MiB)
    assert budget.available == 60_000 * MiB - sum(budget.reserves.values())
    assert budget.available > 0
    v = decide(budget.available // 2, budget.available)
    assert v.fits and v.margin_bytes == budget.available - budget.available // 2
    assert not decide(int(budget.available * 0.95), budget.available).fits  # inside the 10% margin
    assert not decide(1, -5).fits


def test_largest_fitting_prefix_suggests_a_max_bs():
    buckets = [16, 24, 48, 88, 176, 256, 352, 704, 1408, 2816]
    full = estimate_capture_bytes(buckets, DSV4).total
    suggestion = largest_fitting_prefix(buckets, DSV4, available=int(full * 0.6 / 0.9))
    assert suggestion is not None and suggestion < 2816
    fitting = [b for b in buckets if b <= suggestion]
    assert decide(estimate_capture_bytes(fitting, DSV4).total, int(full * 0.6 / 0.9)).fits
    assert largest_fitting_prefix(buckets, DSV4, available=0) is None


@settings(max_examples=60, deadline=None)
@given(
    buckets=st.lists(st.integers(1, 20000), min_size=1, max_size=40),
    fraction=st.floats(0.0, 1.5),
)
def test_largest_fitting_prefix_equals_the_prefix_by_prefix_definition(buckets, fraction):
    ordered = sorted(set(buckets))
    available = int(estimate_capture_bytes(ordered, DSV4).total * fraction)
    by_definition = None
    for i in range(len(ordered)):
        if decide(estimate_capture_bytes(ordered[: i + 1], DSV4).total, available).fits:
            by_definition = ordered[i]
    assert largest_fitting_prefix(buckets, DSV4, available) == by_definition


def test_largest_fitting_prefix_is_linear_on_huge_lists():
    """`plan` with upstream's generic list for a huge chunk once hung here (quadratic)."""
    import time

    buckets = list(range(16, 2_000_000, 16))
    t = time.perf_counter()
    largest_fitting_prefix(buckets, DSV4, available=1 << 60)
    assert time.perf_counter() - t < 5.0
