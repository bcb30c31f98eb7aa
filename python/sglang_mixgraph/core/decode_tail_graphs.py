"""The split's decode tail replayed from CUDA graphs: one graph per layer and row bucket.

Why: called eagerly, the decode tail costs about 0.15 ms of host per split layer (FlashMLA's
entry allocates its outputs and sets kernel attributes on every call, plus the Python around
it): 14 ms per replayed MIXED step of a 61-layer rank. The same call captured once per (layer,
bucket of decode rows) on static inputs replays as one launch after the step's rows are copied in.
How: one query and one output buffer at the largest bucket, each bucket's graph reading and
writing their leading rows; each compress ratio's indices and lengths in buffers of their own,
refilled when the step's inputs change (a new `TailInputs`) and, for the c4 layers whose top-k
the indexer rewrites per layer, on every call. Rows past the step's decode rows are invalid
(index -1, length 0), so the kernel reads nothing for them. FlashMLA's split schedule depends
on the rows' key counts, which change every step but not from layer to layer: the first call of
a step for each ratio and bucket runs the kernel eagerly on the static buffers with a fresh
scheduling object (FlashMLA makes the schedule), the schedule is copied into the tensors that
ratio and bucket's graphs were captured on, and every later layer replays without making it
again. All graphs share one memory pool and replay one after another on one stream. The
capture is injectable (`capture=`): CPU tests run the buffers with the reference kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sglang_mixgraph.core.decode_tail import HEAD_DIM, KernelFn, MetaFactory, TailInputs

# Decode rows per rank are at most the running requests per rank (256 on the reference
# deployment); a tail wider than the largest bucket takes the plain call.
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# Ratios whose extra indices the indexer rewrites in place for every layer (the c4 top-k).
PER_LAYER_INDICES = frozenset({4})
# The tensors of a FlashMLA scheduling object that hold its schedule (FlashMLASchedMeta).
SCHEDULE_TENSORS = ("tile_scheduler_metadata", "num_splits")

Capture = Callable[[Callable[[], None]], Any]  # captures a function, returns what .replay()s it


def tail_graph_bytes(
    h_q: int,
    index_widths: dict[int, tuple[int, int]],
    *,
    max_rows: int = ROW_BUCKETS[-1],
    dtype_bytes: int = 2,
) -> int:
    """GPU memory the tail graphs of one backend hold at most: the query and output buffers,
    each ratio's index and length buffers (`index_widths`: ratio -> (SWA width, extra width,
    0 for none)), and the largest bucket's kernel output and log-sum-exp in the graphs' shared
    pool (FlashMLA's few scheduling ints are not counted)."""
    rows = max_rows
    row_bytes = rows * h_q * HEAD_DIM * dtype_bytes
    lse_bytes = rows * h_q * 4
    index_bytes = sum(
        rows * (swa + 1 + (extra + 1 if extra else 0)) * 4 for swa, extra in index_widths.values()
    )
    return 3 * row_bytes + lse_bytes + index_bytes


def row_bucket(rows: int, buckets: tuple[int, ...] = ROW_BUCKETS) -> int | None:
    """The smallest bucket holding `rows` decode rows, or None when none does."""
    return next((b for b in buckets if b >= rows), None)


class CudaGraphCapture:
    """Captures a function into a `torch.cuda.CUDAGraph` on a side stream, every graph in one
    pool. Unlike `torch.cuda.graph(...)` it neither synchronizes the device nor empties the
    allocator's cache, which a capture in the middle of a forward cannot afford; the capture
    is thread-local, so other threads' CUDA calls are not caught in it."""

    def __init__(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream()

    def __call__(self, fn: Callable[[], None]) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream()
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
            try:
                fn()
            finally:
                graph.capture_end()
        current.wait_stream(self.stream)
        return graph


def stream_is_capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


@dataclass
class _RowBuffers:
    """The query and output rows every bucket's graph of one head count reads and writes."""

    q: torch.Tensor  # (max rows, 1, h_q, 512)
    out: torch.Tensor


@dataclass
class _IndexBuffers:
    """One compress ratio's indices and lengths, at the largest bucket."""

    swa: torch.Tensor  # (max rows, 1, W) int32
    swa_len: torch.Tensor | None  # (max rows,) int32; None where the step has no lengths
    extra: torch.Tensor | None
    extra_len: torch.Tensor | None
    filled: int = 0  # rows [0, filled) may hold valid entries; the rest are invalid
    tail: TailInputs | None = None  # the step inputs the buffers hold


@dataclass
class _Schedule:
    """The scheduling object one ratio and bucket's graphs were captured on, and the step
    whose schedule its tensors hold."""

    meta: Any
    tail: TailInputs


def _copy_schedule(into: Any, made: Any) -> bool:
    """Copies `made`'s schedule into `into`'s tensors; False where their tensors differ in
    shape (then `made` must take `into`'s place, and the graphs on it be captured again)."""
    pairs = [(getattr(into, n, None), getattr(made, n, None)) for n in SCHEDULE_TENSORS]
    if not all(
        isinstance(old, torch.Tensor)
        and isinstance(new, torch.Tensor)
        and (old.shape, old.dtype) == (new.shape, new.dtype)
        for old, new in pairs
    ):
        return False
    for old, new in pairs:
        old.copy_(new)
    return True


def _like_rows(t: torch.Tensor | None, rows: int, fill: int) -> torch.Tensor | None:
    if t is None:
        return None
    return torch.full((rows, *t.shape[1:]), fill, dtype=t.dtype, device=t.device)


class TailGraphs:
    """The decode tails of one attention backend as CUDA graphs (see the module docstring).

    `unreplayable(rows)` says why a tail of `rows` decode rows must take the plain call (None:
    it can replay); `run(...)` then returns the tail's `(rows, 1, h_q, 512)` output, valid
    until the next call, and whether a graph replayed it (False: the step's first call for
    its ratio and bucket, which makes the schedule eagerly), or None when the capture failed
    (`broken` says why; every later call is unreplayable).
    """

    def __init__(
        self,
        kernel: KernelFn,
        meta_factory: MetaFactory,
        *,
        buckets: tuple[int, ...] = ROW_BUCKETS,
        capture: Capture | None = None,
    ) -> None:
        self.kernel = kernel
        self.meta_factory = meta_factory
        self.buckets = tuple(sorted(buckets))
        self._capture = capture
        self._rows: dict[tuple, _RowBuffers] = {}
        self._indices: dict[int, _IndexBuffers] = {}
        self._schedules: dict[tuple[int, int, int], _Schedule] = {}  # (ratio, bucket, heads)
        # (layer, bucket) -> (the operands' addresses and layouts it was captured on, graph)
        self._graphs: dict[tuple[int, int], tuple[tuple, Any]] = {}
        self.broken: str | None = None
        self.captures = 0

    @property
    def max_rows(self) -> int:
        return self.buckets[-1]

    def unreplayable(self, rows: int) -> str | None:
        if self.broken is not None:
            return "capture_failed"
        if row_bucket(rows, self.buckets) is None:
            return "too_many_rows"
        if stream_is_capturing():
            return "capturing"  # a breakable graph's capture runs its break eagerly
        return None

    def run(
        self,
        layer_id: int,
        tail: TailInputs,
        q: torch.Tensor,
        swa_cache: torch.Tensor,
        attn_sink: torch.Tensor,
        extra_cache: torch.Tensor | None,
    ) -> tuple[torch.Tensor, bool] | None:
        rows = tail.num_rows
        bucket = row_bucket(rows, self.buckets)
        buffers = self._row_buffers(q)
        index = self._index_buffers(tail)
        buffers.q[:rows].copy_(q)
        self._fill(index, tail)
        operands = (buffers, index, swa_cache, attn_sink, extra_cache)
        key = (tail.ratio, bucket, q.shape[-2])
        schedule = self._schedules.get(key)
        if schedule is None or schedule.tail is not tail:
            return self._schedule_call(key, schedule, tail, operands)[:rows], False
        # What the graph bakes in: each operand's address and layout. Not the tensor objects: the
        # model hands the sink as a new slice view per call (`MqaAttentionBase._local_attn_sink`).
        baked = (
            buffers.q,
            index.swa,
            index.swa_len,
            index.extra,
            index.extra_len,
            swa_cache,
            extra_cache,
            attn_sink,
            *(getattr(schedule.meta, n) for n in SCHEDULE_TENSORS),
        )
        layout = tuple(
            None if t is None else (t.data_ptr(), t.shape, t.stride(), t.dtype) for t in baked
        )
        entry = self._graphs.get((layer_id, bucket))
        if entry is None or entry[0] != layout:
            graph = self._new_graph(bucket, tail, operands, schedule.meta)
            if graph is None:
                return None
            entry = self._graphs[(layer_id, bucket)] = (layout, graph)
        entry[1].replay()
        return buffers.out[:rows], True

    def _schedule_call(self, key, schedule: _Schedule | None, tail: TailInputs, operands):
        """A step's first call for this ratio and bucket: the kernel, eagerly on the static
        buffers with a fresh scheduling object, whose schedule the graphs then read. Returns
        the kernel's output over the whole bucket."""
        made = self.meta_factory()
        bucket = key[1]
        out = self._kernel_call(
            bucket, self._bucket_kwargs(bucket, tail, operands[1], made), operands
        )
        if schedule is not None and _copy_schedule(schedule.meta, made):
            schedule.tail = tail
        else:
            self._schedules[key] = _Schedule(meta=made, tail=tail)
        return out

    # ------------------------------------------------------------------ buffers

    def _row_buffers(self, q: torch.Tensor) -> _RowBuffers:
        key = (q.shape[-2], q.dtype, q.device)
        buffers = self._rows.get(key)
        if buffers is None:
            shape = (self.max_rows, 1, q.shape[-2], HEAD_DIM)
            buffers = _RowBuffers(q=q.new_zeros(shape), out=q.new_zeros(shape))
            self._rows[key] = buffers
        return buffers

    def _index_buffers(self, tail: TailInputs) -> _IndexBuffers:
        index = self._indices.get(tail.ratio)
        if index is not None and index.tail is tail:
            return index  # checked when this step's inputs first came
        kw = tail.kernel_kwargs
        swa, swa_len = kw["indices"], kw["topk_length"]
        extra, extra_len = kw["extra_indices_in_kvcache"], kw["extra_topk_length"]
        if index is None or not _same_layout(index, swa, swa_len, extra, extra_len):
            rows = self.max_rows
            index = _IndexBuffers(
                swa=_like_rows(swa, rows, -1),
                swa_len=_like_rows(swa_len, rows, 0),
                extra=_like_rows(extra, rows, -1),
                extra_len=_like_rows(extra_len, rows, 0),
            )
            self._indices[tail.ratio] = index
        return index

    @staticmethod
    def _fill(index: _IndexBuffers, tail: TailInputs) -> None:
        kw, rows = tail.kernel_kwargs, tail.num_rows
        if index.tail is tail:
            if tail.ratio in PER_LAYER_INDICES:
                index.extra[:rows].copy_(kw["extra_indices_in_kvcache"])
            return
        pairs = (
            (index.swa, kw["indices"], -1),
            (index.swa_len, kw["topk_length"], 0),
            (index.extra, kw["extra_indices_in_kvcache"], -1),
            (index.extra_len, kw["extra_topk_length"], 0),
        )
        for buffer, source, invalid in pairs:
            if buffer is None:
                continue
            buffer[:rows].copy_(source)
            if rows < index.filled:
                buffer[rows : index.filled].fill_(invalid)
        index.filled, index.tail = rows, tail

    # ------------------------------------------------------------------ capture

    @staticmethod
    def _bucket_kwargs(bucket: int, tail: TailInputs, index: _IndexBuffers, meta) -> dict:
        """The kernel's arguments over the bucket's leading rows of the static index buffers."""
        return {
            **tail.kernel_kwargs,
            "indices": index.swa[:bucket],
            "topk_length": _rows(index.swa_len, bucket),
            "extra_indices_in_kvcache": _rows(index.extra, bucket),
            "extra_topk_length": _rows(index.extra_len, bucket),
            "tile_scheduler_metadata": meta,
        }

    def _kernel_call(self, bucket: int, kwargs: dict, operands) -> torch.Tensor:
        buffers, _, swa_cache, attn_sink, extra_cache = operands
        return self.kernel(
            q=buffers.q[:bucket],
            k_cache=swa_cache,
            attn_sink=attn_sink,
            extra_k_cache=extra_cache,
            **kwargs,
        )[0]

    def _new_graph(self, bucket: int, tail: TailInputs, operands, meta):
        buffers, index = operands[0], operands[1]
        kwargs = self._bucket_kwargs(bucket, tail, index, meta)

        def call() -> None:
            buffers.out[:bucket].copy_(self._kernel_call(bucket, kwargs, operands))

        try:
            call()  # warm-up outside the capture (kernel attributes, lazy module loads)
            if self._capture is None:
                self._capture = CudaGraphCapture()  # one pool and side stream for every graph
            graph = self._capture(call)
        except Exception as e:  # the tails then take the plain call for good
            self.broken = f"{type(e).__name__}: {e}"
            return None
        self.captures += 1
        return graph


def _rows(t: torch.Tensor | None, rows: int) -> torch.Tensor | None:
    return None if t is None else t[:rows]


def _same_layout(index: _IndexBuffers, swa, swa_len, extra, extra_len) -> bool:
    def same(buffer, source):
        if (buffer is None) != (source is None):
            return False
        return buffer is None or (
            buffer.shape[1:] == source.shape[1:] and buffer.dtype == source.dtype
        )

    return (
        same(index.swa, swa)
        and same(index.swa_len, swa_len)
        and same(index.extra, extra)
        and same(index.extra_len, extra_len)
    )
