"""The query-row count a replayed DSV4 attention break sees (no sglang).

Under a breakable prefill graph the runner replays a static EXTEND batch padded to the bucket
(``PrefillCudaGraphRunner.load_batch``): its token tensors have the bucket's rows and its
``global_num_token_non_padded_cpu`` is the live batch's, copied unchanged (set by
``ForwardBatch._init_num_token_non_padded`` when the batch was built; tests and other
builders may leave it None). The attention break (``deepseek_v4_attention_with_output`` in
``sglang.srt.models.deepseek_v4``) slices query, key/value and ``out_cache_loc`` to that count,
and a None slice keeps every row: the attention then sees the whole bucket. Upstream's lazy
chunk-cache build in ``DeepseekV4AttnBackend._forward_prefill_sparse`` is sized from the sliced
query (``num_qo_tokens=q.shape[0]``), so this count is also the one any cache built ahead of
the break must have.

Every patch that sizes something for the replayed attention takes its rows from here
(``patches/replay_read_done.py``, ``patches/mixed_split/plan.py``, ``patches/wo_a_in_break.py``):
two rules would plan one count while the attention sees another.
"""

from __future__ import annotations


def replay_attention_rows(global_num_token_non_padded_cpu: int | None, static_rows: int) -> int:
    """Rows of the replayed attention break: ``static_rows`` (the static batch's padded token
    rows, i.e. the bucket) sliced to ``global_num_token_non_padded_cpu`` exactly as the break
    slices its query, so None keeps the whole bucket and a count past the bucket is cut to it.
    0 is an idle DP rank (upstream's break zeroes its output and calls no attention)."""
    rows = None if global_num_token_non_padded_cpu is None else int(global_num_token_non_padded_cpu)
    return len(range(int(static_rows))[:rows])


def batch_attention_rows(static_forward_batch) -> int:
    """:func:`replay_attention_rows` of a replay's static batch (any object with
    ``global_num_token_non_padded_cpu`` and ``input_ids``; a batch without ``input_ids`` has
    0 rows)."""
    input_ids = getattr(static_forward_batch, "input_ids", None)
    static_rows = 0 if input_ids is None else int(input_ids.shape[0])
    return replay_attention_rows(
        getattr(static_forward_batch, "global_num_token_non_padded_cpu", None), static_rows
    )
