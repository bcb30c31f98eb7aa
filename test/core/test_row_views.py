"""core.row_views: a view of every row of a bucket's buffer, carried over to live rows."""

from __future__ import annotations

import pytest
import torch

from sglang_mixgraph.core.row_views import rebase, row_view_of, shares_storage

ROWS, HEADS, DIM = 6, 4, 8


def _buffer():
    return torch.arange(ROWS * HEADS * DIM, dtype=torch.float32).view(ROWS, HEADS, DIM)


@pytest.mark.parametrize(
    "take",
    [
        lambda b: b[..., -2:],  # the RoPE columns
        lambda b: b[:, 1:3, :],  # a head slice
        lambda b: b.view(ROWS, 2, -1),  # the [rows, groups, -1] view
        lambda b: b[:, 1:3, :][..., -3:],
        lambda b: b[:, :, ::2],
        lambda b: b,
    ],
)
def test_a_view_of_every_row_lands_on_the_same_elements_of_fewer_rows(take):
    buffer = _buffer()
    view = take(buffer)
    rv = row_view_of(view, buffer)
    assert rv is not None
    for live in (ROWS, 3, 1):
        rows = buffer[:live].clone()
        got = rebase(rv, rows)
        assert torch.equal(got, take(buffer)[:live])
        got.add_(1000)  # it is a view of the live rows, not a copy
        assert torch.equal(
            rows, torch.where(_mask(take, live), buffer[:live] + 1000, buffer[:live])
        )


def _mask(take, live):
    """Which elements of ``live`` rows the view takes."""
    mask = torch.zeros(ROWS, HEADS, DIM, dtype=torch.bool)
    take(mask).fill_(True)
    return mask[:live]


@pytest.mark.parametrize(
    "take",
    [
        lambda b: b[:3],  # not every row
        lambda b: b[::2],  # another row stride
        lambda b: b.transpose(0, 1),  # rows not first
        lambda b: b.view(-1)[5 : 5 + ROWS * 10].view(ROWS, 10),  # another row stride
        lambda b: b.as_strided((ROWS - 1, HEADS * DIM), (HEADS * DIM, 1), 5),  # not every row
        lambda b: b.clone(),  # another storage
        lambda b: b.view(torch.int32),  # another dtype
    ],
)
def test_anything_but_a_per_row_view_is_refused(take):
    buffer = _buffer()
    assert row_view_of(take(buffer), buffer) is None


def test_a_view_reaching_into_the_next_row_is_refused():
    big = torch.zeros(ROWS + 1, HEADS, DIM)
    buffer = big[:ROWS]
    across = big.view(-1).as_strided((ROWS, HEADS * DIM), (HEADS * DIM, 1), 5)
    assert row_view_of(across, buffer) is None
    assert row_view_of(big.view(-1).as_strided((ROWS, 8), (HEADS * DIM, 1), 5), buffer) is not None


def test_a_strided_buffer_is_refused():
    buffer = torch.zeros(HEADS, ROWS, DIM).transpose(0, 1)
    assert row_view_of(buffer[..., :2], buffer) is None


def test_rows_of_another_layout_cannot_carry_the_view():
    buffer = _buffer()
    rv = row_view_of(buffer[..., -2:], buffer)
    with pytest.raises(ValueError, match="row stride"):
        rebase(rv, torch.zeros(3, HEADS, DIM * 2))
    with pytest.raises(ValueError, match="contiguous: False"):
        rebase(rv, torch.zeros(HEADS, 3, DIM).transpose(0, 1))


def test_shares_storage_tells_views_from_copies():
    buffer = _buffer()
    assert shares_storage(buffer[2:, 1], buffer)
    assert not shares_storage(buffer.clone(), buffer)
