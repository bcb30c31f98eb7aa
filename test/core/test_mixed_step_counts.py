"""core.mixed_step_counts: the closed-form key sums against brute force, one request's key
pairs row by row, `StepCounts` giving every layer kind's `StepShape` as `from_lists` does (from
lists and from tensors), the layers per compress ratio of a model, and the workspace rows as
upstream sizes them."""

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sglang_mixgraph.core import mixed_step_counts as m
from sglang_mixgraph.core.mixed_boundary import compute_mixed_boundary
from sglang_mixgraph.core.mixed_step_counts import workspace_tokens


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 3000),
    st.integers(0, 3000),
    st.sampled_from([1, 4, 128]),
    st.one_of(st.none(), st.integers(0, 300)),
)
def test_closed_form_floor_sums_match_brute_force(lo, hi, r, cap):
    brute = sum(min(x // r, cap) if cap is not None else x // r for x in range(lo, hi + 1))
    assert m.sum_min_floor_div(lo, hi, r, cap) == brute


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3000), st.integers(1, 3000), st.integers(1, 300))
def test_closed_form_linear_sums_match_brute_force(lo, hi, cap):
    assert m.sum_min_linear(lo, hi, cap) == sum(min(x, cap) for x in range(lo, hi + 1))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 5000), st.sampled_from([4, 128]))
def test_request_keys_counts_each_row(seq, ext, ratio):
    assume(ext <= seq)
    topk = None if ratio == 128 else 1024
    brute = 0
    for pos in range(seq - ext, seq):
        x = pos + 1
        brute += min(x, 128) + (x // ratio if topk is None else min(x // ratio, topk))
    assert m.request_keys(seq, ext, ratio, topk) == brute


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 3000), st.integers(0, 40000)), max_size=4),
    st.lists(st.integers(1, 40000), max_size=64),
    st.sampled_from([None, 512, 1024]),
    st.booleans(),
)
def test_step_counts_give_every_ratios_shape_as_from_lists(prefill, decode, topk, as_tensor):
    exts = [e for e, _ in prefill] + [1] * len(decode)
    seqs = [e + p for e, p in prefill] + decode
    src = torch.tensor(seqs, dtype=torch.int32) if as_tensor else seqs
    counts = m.StepCounts.from_lists(src, exts, len(decode), topk=topk)
    for ratio in (0, 4, 128):
        assert counts.shape(ratio) == m.StepShape.from_lists(
            ratio, seqs, exts, len(decode), topk=topk
        )


def test_layer_mix_counts_layers_per_ratio():
    assert m.layer_mix([0, 0, 4, 128, 4]) == {0: 2, 4: 2, 128: 1}
    assert m.layer_mix([]) == {}


def test_workspace_tokens_follow_upstream_sizing():
    seqs, exts = [1000, 50, 300, 300], [200, 50, 1, 1]
    # SWA: min(seq, ext + 127)
    assert workspace_tokens(seqs, exts, 0) == (0, 327 + 50 + 128 + 128)
    # c4: whole history per request
    assert workspace_tokens(seqs, exts, 4)[0] == 250 + 12 + 75 + 75
    # c128: max(max_seq // 128, 1) slots per request
    assert workspace_tokens(seqs, exts, 128)[0] == 4 * 7
    # prefill-only workspace of a split excludes exactly the decode requests' share (c4, SWA)
    b = compute_mixed_boundary(exts, 2)
    ps, pe = seqs[: b.num_prefill_reqs], exts[: b.num_prefill_reqs]
    assert (ps, pe) == ([1000, 50], [200, 50])
    comp_all, swa_all = workspace_tokens(seqs, exts, 4)
    comp_pre, swa_pre = workspace_tokens(ps, pe, 4)
    comp_dec, swa_dec = workspace_tokens(seqs[2:], exts[2:], 4)
    assert (comp_all, swa_all) == (comp_pre + comp_dec, swa_pre + swa_dec)
