"""core.prefill_buckets: the derived bucket list (properties and the reference deployment),
the mixed band, the MegaMoE cap, alignment, padding and the mixed sampling-rows bound."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_mixgraph.core.prefill_buckets import (
    BucketDerivationError,
    bucket_alignment,
    bucket_for,
    derivation_gap,
    derive_prefill_buckets,
    mixed_sampling_rows_bound,
    padding_profile,
    replays,
)


@settings(max_examples=200, deadline=None)
@given(
    chunk=st.integers(1, 40000),
    running=st.one_of(st.none(), st.integers(1, 4096)),
    alignment=st.sampled_from([1, 2, 4, 8]),
    cap_slack=st.one_of(st.none(), st.integers(0, 5000)),
)
def test_derived_buckets_properties(chunk, running, alignment, cap_slack):
    top = -(-chunk // alignment) * alignment
    cap = None if cap_slack is None else top + cap_slack
    buckets = derive_prefill_buckets(
        chunk_per_rank=chunk, running_per_rank=running, cap=cap, alignment=alignment
    )
    assert buckets == sorted(set(buckets))
    assert buckets[-1] == top  # always contains C (as captured) and nothing above it
    assert all(b % alignment == 0 for b in buckets)
    if cap is not None:
        assert max(buckets) <= cap
    # every size from the ladder floor to C replays within upstream's 2x padding cap
    lo = math.ceil(min(top, 16) / 2)  # the ladder stops halving at 16 tokens
    for size in range(max(1, lo), top + 1):
        assert replays(size, buckets), (size, buckets)
    # a relabelled decode batch of R tokens replays too
    # a relabelled decode batch of R tokens replays too (up to the capture alignment,
    # which the runner applies to every batch anyway)
    if running is not None and running <= top:
        aligned = -(-running // alignment) * alignment
        assert bucket_for(running, buckets) <= max(2 * running, aligned)
    # short: the halving ladder plus R
    assert len(buckets) <= max(1, math.ceil(math.log2(max(top, 16) / 8))) + 2


def test_reference_deployment_list():
    buckets = derive_prefill_buckets(chunk_per_rank=2816, running_per_rank=256, cap=2816)
    assert buckets == [16, 24, 48, 88, 176, 256, 352, 704, 1408, 2816]


def test_mixed_band_for_deepseek_v4_pages():
    """DeepSeek-V4's 256-token pages: a chunk ends on a page, so mixed steps are 2560 prefill
    tokens + d decode rows (2561..2816, as the H200 slice's server logged); the band puts a
    bucket every 32 tokens there instead of padding them all to 2816."""
    band = [2592, 2624, 2656, 2688, 2720, 2752, 2784]
    buckets = derive_prefill_buckets(
        chunk_per_rank=2816, running_per_rank=256, cap=2816, page_size=256
    )
    assert buckets == [16, 24, 48, 88, 176, 256, 352, 704, 1408, *band, 2816]
    assert max(bucket_for(2560 + d, buckets) - (2560 + d) for d in range(1, 257)) == 31
    # One-token pages (or none known) end chunks anywhere: mixed steps are C, no band.
    assert derive_prefill_buckets(chunk_per_rank=2816, running_per_rank=256, page_size=1) == (
        derive_prefill_buckets(chunk_per_rank=2816, running_per_rank=256)
    )


@settings(max_examples=200, deadline=None)
@given(
    chunk=st.integers(64, 40000),
    page=st.sampled_from([1, 16, 32, 64, 128, 256, 512]),
    alignment=st.sampled_from([1, 2, 4, 8]),
)
def test_mixed_band_properties(chunk, page, alignment):
    top = -(-chunk // alignment) * alignment
    plain = derive_prefill_buckets(chunk_per_rank=chunk, running_per_rank=None, alignment=alignment)
    banded = derive_prefill_buckets(
        chunk_per_rank=chunk, running_per_rank=None, alignment=alignment, page_size=page
    )
    band = sorted(set(banded) - set(plain))
    assert set(plain) <= set(banded) and banded[-1] == top
    assert all(b % alignment == 0 and top - page < b < top for b in band)
    assert len(band) <= 8
    if page <= 1 or page >= top or page < 0.02 * top:
        assert band == []
    else:
        step = alignment * 8 // math.gcd(alignment, 8)  # the ladder's granularity
        gap = -(-max(step, -(-page // 8)) // step) * step  # page/8, rounded up to it
        # every mixed size a page boundary allows pads by less than one band step
        for size in range(top - page + 1, top + 1):
            assert bucket_for(size, banded) - size < gap, (size, banded)


def test_chunk_above_cap_is_rejected():
    with pytest.raises(BucketDerivationError, match="exceeds the MoE per-rank token cap 2048"):
        derive_prefill_buckets(chunk_per_rank=2816, running_per_rank=256, cap=2048)


def test_alignment_for_attn_tp_and_deepep():
    assert bucket_alignment(attn_tp_size=1) == 1
    assert bucket_alignment(attn_tp_size=4) == 4
    assert bucket_alignment(attn_tp_size=1, deepep=True) == 8
    assert bucket_alignment(attn_tp_size=3, deepep=True) == 24
    buckets = derive_prefill_buckets(chunk_per_rank=1000, running_per_rank=100, alignment=3)
    assert buckets[-1] == 1002 and all(b % 3 == 0 for b in buckets)


def test_padding_profile_exact_small_case():
    prof = padding_profile([4, 8], lo=1, hi=8)
    # sizes 1 (4x) runs eagerly; 2 -> 4 (2x), 3 -> 4, 4, 5..8 -> 8
    assert prof.eager_sizes == 1
    assert prof.smallest_replayed == 2
    assert prof.worst_factor == 2.0
    assert prof.worst_waste_tokens == 3  # 5 -> 8
    expected_mean = (4 / 2 + 4 / 3 + 1 + 8 / 5 + 8 / 6 + 8 / 7 + 1) / 7
    assert prof.mean_factor == pytest.approx(expected_mean)


def test_bucket_for_a_size_above_every_bucket_is_none():
    assert bucket_for(5000, [512]) is None
    assert not replays(5000, [512])


def test_mixed_sampling_rows_bound():
    assert (
        mixed_sampling_rows_bound(running_per_rank=256, attn_dp_size=8, attn_dp_enabled=True)
        == 8 * 257
    )
    assert (
        mixed_sampling_rows_bound(running_per_rank=256, attn_dp_size=8, attn_dp_enabled=False)
        == 257
    )


_PLAIN = dict(pp_size=1, context_parallel=False, speculative=False, chunked=True)


@pytest.mark.parametrize(
    "change, reason",
    [
        ({}, None),
        ({"pp_size": 2}, "pipeline parallelism (upstream's PP bucket policy applies)"),
        ({"context_parallel": True}, "prefill context parallelism"),
        ({"speculative": True}, "speculative decoding"),
        ({"pd_decode": True}, "PD decode node"),
        ({"dllm": True}, "diffusion LLM inference"),
        ({"chunked": False}, "chunked prefill disabled"),
        # the first gap found is the one named
        ({"pp_size": 4, "speculative": True, "chunked": False}, "pipeline parallelism (upstream"),
    ],
)
def test_derivation_gap_names_what_leaves_the_list_to_upstream(change, reason):
    got = derivation_gap(**{**_PLAIN, **change})
    assert got is None if reason is None else got.startswith(reason)
