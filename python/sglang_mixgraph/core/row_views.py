"""Views of a row-major buffer, carried over to another buffer of the same row shape.

A breakable capture hands the model views of a static buffer ``[N, ...]`` (the bucket's rows);
an eager break that computes the same values for the live rows only holds a contiguous
``[n, ...]`` tensor with the same row shape. ``RowView`` records how a view sits in the static
buffer (its shape past the rows, its strides, its offset inside the first row) and ``rebase``
builds the same view of the live tensor, so a captured call site can be replayed eagerly on the
live rows. Only views that keep every row (the row dimension first, at the buffer's row stride)
are carried over: anything else is not a per-row view and is refused with ``None``. Pure torch,
no SGLang import.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowView:
    """How a view sits in a contiguous ``[N, ...]`` buffer: everything but the row count."""

    tail: tuple[int, ...]  # the view's shape past its row dimension
    stride: tuple[int, ...]  # the view's strides, the row stride first
    offset: int  # elements from the buffer's first element, inside the first row


def shares_storage(t: torch.Tensor, base: torch.Tensor) -> bool:
    return t.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


def row_view_of(view: torch.Tensor, base: torch.Tensor) -> RowView | None:
    """The ``RowView`` of ``view`` in ``base``, or None where ``view`` is not a view of every
    row of the contiguous ``base`` at its row stride."""
    if base.dim() == 0 or view.dim() == 0 or not base.is_contiguous():
        return None
    if not shares_storage(view, base) or view.dtype != base.dtype:
        return None
    row = base.stride(0)
    offset = view.storage_offset() - base.storage_offset()
    if view.shape[0] != base.shape[0] or view.stride(0) != row or not 0 <= offset < row:
        return None
    # The last element of a row of the view must stay inside that row of the buffer.
    last = offset + sum(
        (n - 1) * s for n, s in zip(view.shape[1:], view.stride()[1:], strict=True) if n
    )
    if last >= row:
        return None
    return RowView(tuple(view.shape[1:]), tuple(view.stride()), offset)


def rebase(rv: RowView, rows: torch.Tensor) -> torch.Tensor:
    """The view ``rv`` describes, of the contiguous ``rows`` (``[n, ...]``, the buffer's row
    shape): the same elements of each of its ``n`` rows."""
    if not rows.is_contiguous() or rows.stride(0) != rv.stride[0]:
        raise ValueError(
            f"rows of stride {rows.stride(0) if rows.dim() else None} (contiguous: "
            f"{rows.is_contiguous()}) cannot carry a view of row stride {rv.stride[0]}"
        )
    return rows.as_strided((rows.shape[0], *rv.tail), rv.stride, rows.storage_offset() + rv.offset)
