"""Host-side boundary of a mixed prefill/decode step and the join of its two outputs (no sglang).

A MIXED batch lists the prefill requests first and the decode requests after them
(``ScheduleBatch.mix_with_running`` appends the running requests through
``ScheduleBatch.merge_batch`` and extends ``extend_lens`` by ``[1] * running_bs``). With ``P``
prefill and ``D`` decode requests the query rows are laid out as

    [0, b0)            prefill rows, b0 = sum(extend_seq_lens[:P])
    [b0, b0 + D)       one row per decode request
    [b0 + D, num_rows) padding rows (eager DP-attention padding is appended after the decode
                       rows: ``ForwardBatch._pad_inputs_to_size``); no kernel's.

Everything is computed from host-side Python lists so no device synchronization happens. A
DP-attention decode batch that upstream relabels to a 1-token EXTEND
(``ScheduleBatch.convert_decode_to_extend``) is the case ``P == 0``, ``b0 == 0``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import torch


@dataclasses.dataclass(frozen=True)
class MixedBoundary:
    """Where the decode tail of one mixed step starts and ends (all host ints)."""

    num_prefill_reqs: int  # P
    num_decode_reqs: int  # D
    b0: int  # first decode row == number of prefill rows
    num_rows: int  # q rows the attention sees, padding included

    @property
    def decode_end(self) -> int:
        return self.b0 + self.num_decode_reqs

    @property
    def num_padding_rows(self) -> int:
        return self.num_rows - self.decode_end

    @property
    def prefill_rows(self) -> slice:
        return slice(0, self.b0)

    @property
    def decode_rows(self) -> slice:
        return slice(self.b0, self.decode_end)

    @property
    def padding_rows(self) -> slice:
        return slice(self.decode_end, self.num_rows)


def _host_ints(values: Iterable, name: str) -> list[int]:
    if isinstance(values, torch.Tensor):
        # A device tensor here would force a synchronization; the boundary is host math.
        raise TypeError(f"{name} must be a host list of ints, not a tensor")
    listed = list(values)
    if set(map(type, listed)) <= {int}:  # the scheduler's lists: plain ints, checked in C
        return listed
    out = []
    for v in listed:
        if isinstance(v, bool) or not isinstance(v, int):
            try:
                iv = int(v)
            except (TypeError, ValueError):
                raise TypeError(f"{name} holds a non-integer {v!r}") from None
            if iv != v:
                raise TypeError(f"{name} holds a non-integer {v!r}")
            v = iv
        out.append(int(v))
    return out


def compute_mixed_boundary(
    extend_seq_lens: Sequence[int],
    num_decode_reqs: int,
    num_rows: int | None = None,
) -> MixedBoundary:
    """The boundary of one step from the per-request extend lengths (host list).

    ``extend_seq_lens`` covers every request, prefill ones first; the last ``num_decode_reqs``
    must each have extend length 1. ``num_rows`` is the number of q rows the attention gets
    (defaults to ``sum(extend_seq_lens)``); rows beyond ``b0 + D`` are padding.
    """
    lens = _host_ints(extend_seq_lens, "extend_seq_lens")
    d = int(num_decode_reqs)
    if d < 0 or d > len(lens):
        raise ValueError(f"num_decode_reqs={d} outside [0, {len(lens)}]")
    p = len(lens) - d
    if lens and min(lens) < 0:
        raise ValueError("extend lengths must be non-negative")
    tail = lens[p:]
    if tail.count(1) != len(tail):
        raise ValueError(f"decode requests must extend by exactly 1 token, got {tail}")
    b0 = sum(lens[:p])
    total = b0 + d
    rows = total if num_rows is None else int(num_rows)
    if rows < total:
        raise ValueError(f"num_rows={rows} is smaller than the {total} real rows")
    return MixedBoundary(num_prefill_reqs=p, num_decode_reqs=d, b0=b0, num_rows=rows)


def assemble_rows(
    boundary: MixedBoundary,
    prefill_out: torch.Tensor | None,
    decode_out: torch.Tensor | None,
    out: torch.Tensor | None = None,
    like: torch.Tensor | None = None,
) -> torch.Tensor:
    """One ``(num_rows, ...)`` output in the original row order; padding rows are zero.

    ``prefill_out`` has ``b0`` rows and ``decode_out`` has ``D`` rows (either may be ``None``
    when that part is empty). ``out`` may be given to write into a preallocated buffer.
    """
    ref = prefill_out if prefill_out is not None and prefill_out.shape[0] else decode_out
    if ref is None:
        ref = like
    if ref is None:
        raise ValueError("need an output part or `like` to know the row shape")
    if prefill_out is not None and prefill_out.shape[0] != boundary.b0:
        raise ValueError(f"prefill part has {prefill_out.shape[0]} rows, expected {boundary.b0}")
    if decode_out is not None and decode_out.shape[0] != boundary.num_decode_reqs:
        raise ValueError(
            f"decode part has {decode_out.shape[0]} rows, expected {boundary.num_decode_reqs}"
        )
    if out is None:
        if boundary.num_padding_rows == 0 and prefill_out is not None and decode_out is not None:
            return torch.cat([prefill_out, decode_out], dim=0)
        out = ref.new_empty((boundary.num_rows,) + tuple(ref.shape[1:]))
    if boundary.b0:
        out[boundary.prefill_rows] = prefill_out
    if boundary.num_decode_reqs:
        out[boundary.decode_rows] = decode_out
    if boundary.num_padding_rows:
        out[boundary.padding_rows].zero_()
    return out


def copy_in_join(
    boundary: MixedBoundary, all_rows_out: torch.Tensor, decode_out: torch.Tensor | None
) -> torch.Tensor:
    """The split's join: ``all_rows_out`` is the sparse prefill over every row of the step with
    a workspace of the prefill requests only, so its decode and padding rows hold no keys and
    come out as zeros; the decode kernel's rows are copied into it. Returns ``all_rows_out``."""
    if all_rows_out.shape[0] != boundary.num_rows:
        raise ValueError(
            f"sparse-prefill output has {all_rows_out.shape[0]} rows, expected {boundary.num_rows}"
        )
    if boundary.num_decode_reqs:
        if decode_out is None or decode_out.shape[0] != boundary.num_decode_reqs:
            raise ValueError(f"decode part must have {boundary.num_decode_reqs} rows")
        all_rows_out[boundary.decode_rows].copy_(decode_out)
    return all_rows_out
