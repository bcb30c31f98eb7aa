"""Which rows of a step are its decode tail, from what the scheduler built.

``ScheduleBatch.mix_with_running`` appends the running (decode) requests after the prefill
requests. ``ForwardBatch.init_new`` keeps no count of them, so an AFTER hook records it; an
AFTER hook on ``EagerRunner.load_batch`` carries the record onto the copy the eager forward
runs, because ``EagerRunner.execute`` relabels a MIXED batch to EXTEND and copies it.
"""

from __future__ import annotations

from sglang_mixgraph.upstream_attrs import FORWARD_BATCH_BUILT_MIXED, FORWARD_BATCH_NUM_DECODE


def after_forward_batch_init_new(result, cls, batch, model_runner, **kwargs):
    """AFTER ``ForwardBatch.init_new``: remember how many decode requests end the batch.

    ``init_new`` reads ``batch.decoding_reqs`` only for ``contains_last_prefill_chunk``
    and keeps no count; we keep ``len(decoding_reqs)`` when those requests are exactly the tail
    of ``batch.reqs`` (``ScheduleBatch.mix_with_running`` appends them through ``merge_batch``;
    ``ScheduleBatch.convert_decode_to_extend`` makes every request one).
    """
    num_decode = None
    mode = getattr(batch, "forward_mode", None)
    decoding = getattr(batch, "decoding_reqs", None)
    if mode is not None and decoding and (mode.is_mixed() or mode.is_extend_without_speculative()):
        reqs = list(getattr(batch, "reqs", ()) or ())
        d = len(decoding)
        tail = reqs[len(reqs) - d :] if d <= len(reqs) else []
        if len(tail) == d and all(a is b for a, b in zip(tail, decoding, strict=False)):
            num_decode = d
    setattr(result, FORWARD_BATCH_NUM_DECODE, num_decode)
    # The label can change before the forward (EagerRunner.execute runs MIXED as EXTEND);
    # what the scheduler built cannot.
    setattr(result, FORWARD_BATCH_BUILT_MIXED, num_decode is not None and mode.is_mixed())
    return None


def after_eager_load_batch(result, runner, forward_batch, pp_proxy_tensors=None, **kwargs):
    """AFTER ``EagerRunner.load_batch``: the batch the eager forward runs is a new ForwardBatch.

    ``load_batch`` returns ``dataclasses.replace`` of the live batch (through
    ``CudaGraphBufferRegistry.extract_buffer``, or directly with
    ``SGLANG_EAGER_INPUT_NO_COPY``), which keeps dataclass fields only, so what
    ``after_forward_batch_init_new`` recorded would be lost before
    ``init_forward_metadata`` runs. Carry it over.
    """
    if result is not None and result is not forward_batch:
        for attr in (FORWARD_BATCH_NUM_DECODE, FORWARD_BATCH_BUILT_MIXED):
            if hasattr(forward_batch, attr):
                setattr(result, attr, getattr(forward_batch, attr))
    return None


def decode_tail_of(forward_batch) -> tuple | None:
    """``(decode requests at the end of this step's batch, how the step was recognised)``, or
    None when unknown / not a candidate. The ways, as counted in ``steps_seen.<way>``:

    * ``mixed``: a MIXED batch (``ScheduleBatch.mix_with_running``) still labelled MIXED;
    * ``mixed_run_as_extend``: the same batch after ``EagerRunner.execute`` relabelled it
      EXTEND ("a mixed batch is extend-shaped"); recognised only because ``init_new`` saw it
      MIXED with its decode requests as the tail, never from the label;
    * ``dp_decode_relabel``: DP attention padded a DECODE batch to a 1-token EXTEND
      (``ForwardBatch.prepare_mlp_sync_batch``, ``_original_forward_mode`` = DECODE);
    * ``converted_decode``: ``ScheduleBatch.convert_decode_to_extend`` (every request decodes).
    """
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    mode = forward_batch.forward_mode
    d = getattr(forward_batch, FORWARD_BATCH_NUM_DECODE, None)
    if mode == ForwardMode.MIXED:
        return (d, "mixed") if d else None
    if mode == ForwardMode.EXTEND:
        original = getattr(forward_batch, "_original_forward_mode", None)
        if original is not None and original.is_decode():
            lens = forward_batch.extend_seq_lens_cpu or []
            return (len(lens), "dp_decode_relabel") if lens else None
        if not d or original is not None:
            return None
        if getattr(forward_batch, FORWARD_BATCH_BUILT_MIXED, False):
            return d, "mixed_run_as_extend"
        if d == forward_batch.batch_size:
            return d, "converted_decode"
    return None


def num_decode_requests(forward_batch) -> int | None:
    """Decode requests at the end of this step's batch, or None when unknown / not a candidate."""
    tail = decode_tail_of(forward_batch)
    return tail[0] if tail else None
