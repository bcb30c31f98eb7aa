import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_mixgraph.core.mixed_boundary import assemble_rows, compute_mixed_boundary

batches = st.tuples(
    st.lists(st.integers(1, 300), min_size=0, max_size=4),  # prefill extend lengths
    st.integers(0, 8),  # decode requests
    st.integers(0, 6),  # padding rows
)


def _boundary(batch):
    """A drawn batch's extend lengths (prefill, then decode) and its boundary."""
    pre, d, pad = batch
    lens = pre + [1] * d
    return lens, compute_mixed_boundary(lens, d, sum(lens) + pad)


@settings(max_examples=200, deadline=None)
@given(batches)
def test_boundary_partitions_rows(batch):
    pre, d, pad = batch
    lens, b = _boundary(batch)
    assert b.num_prefill_reqs == len(pre)
    assert b.b0 == sum(pre)
    assert b.decode_end == b.b0 + d
    assert b.num_padding_rows == pad
    rows = list(range(b.num_rows))
    parts = rows[b.prefill_rows] + rows[b.decode_rows] + rows[b.padding_rows]
    assert parts == rows
    assert len(rows[b.decode_rows]) == d


def test_dp_relabelled_decode_batch_has_boundary_zero():
    b = compute_mixed_boundary([1, 1, 1], 3)
    assert (b.b0, b.num_prefill_reqs, b.num_decode_reqs, b.num_rows) == (0, 0, 3, 3)


def test_single_token_prefill_is_not_a_decode():
    # a prefill request extending by 1 token, before the decode tail
    b = compute_mixed_boundary([1, 1, 1], 1)
    assert b.b0 == 2 and b.decode_rows == slice(2, 3)


def test_boundary_rejects_bad_inputs():
    with pytest.raises(ValueError):
        compute_mixed_boundary([5, 2], 1)  # decode extending by 2
    with pytest.raises(ValueError):
        compute_mixed_boundary([5, 1], 1, num_rows=5)  # fewer rows than real rows
    with pytest.raises(ValueError):
        compute_mixed_boundary([5, 1], 3)
    with pytest.raises(TypeError):
        compute_mixed_boundary(torch.tensor([5, 1]), 1)  # no device/host tensors: host lists only
    with pytest.raises(TypeError):
        compute_mixed_boundary([5.5, 1], 1)
    with pytest.raises(ValueError):
        compute_mixed_boundary([-3, 1, 1], 1)
    with pytest.raises(ValueError):
        compute_mixed_boundary([4, 1, 0], 2)  # a decode request extending by 0


def test_boundary_takes_plain_and_integral_lengths_alike():
    plain = compute_mixed_boundary([300, 0, 1, 1], 2, num_rows=310)
    assert (plain.num_prefill_reqs, plain.num_decode_reqs, plain.b0) == (2, 2, 300)
    assert compute_mixed_boundary((300.0, 0, 1, 1.0), 2, num_rows=310) == plain
    assert compute_mixed_boundary(iter([300, 0, 1, 1]), 2, num_rows=310) == plain


@settings(max_examples=50, deadline=None)
@given(batches)
def test_assemble_rows_keeps_order_and_zeroes_padding(batch):
    _, d, _ = batch
    _, b = _boundary(batch)
    full = torch.randn(b.num_rows, 3)
    o_pre = full[: b.b0].clone() if b.b0 else None
    o_dec = full[b.b0 : b.decode_end].clone() if d else None
    if o_pre is None and o_dec is None:
        out = assemble_rows(b, None, None, like=full)
    else:
        out = assemble_rows(b, o_pre, o_dec)
    assert out.shape == full.shape
    assert torch.equal(out[: b.decode_end], full[: b.decode_end])
    assert (out[b.decode_end :] == 0).all()
