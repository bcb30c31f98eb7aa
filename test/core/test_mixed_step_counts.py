"""core.mixed_step_counts: the closed-form key sums against brute force, one request's key
pairs row by row, `StepCounts` giving every layer kind's `StepShape` as `from_lists` does (from
lists and from tensors), and the layers per compress ratio of a model."""

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sglang_mixgraph.core import mixed_step_counts as m


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
