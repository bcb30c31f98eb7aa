"""Guard: a replayed mixed step's DP logits gather is sized from the live per-rank counts.

Upstream 0.5.23 already does this, and the mixed steady state under breakable graphs relies on
it: ``PrefillCudaGraphRunner.load_batch`` builds a fresh static ForwardBatch per replay that
carries the live ``global_num_tokens_for_logprob_*``, and ``LogitsMetadata`` sizes its gather
buffer as their sum. Either half changing (the static batch taking the bucket's counts, or the
buffer taking the padded length) would gather bucket x DP rows of hidden states per step.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from types import SimpleNamespace

import torch
from sglang.srt.layers import logits_processor as lp
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import PrefillCudaGraphRunner

LOGPROB_FIELDS = ("global_num_tokens_for_logprob_gpu", "global_num_tokens_for_logprob_cpu")


def _static_batch_keywords():
    """Keyword -> source of the ``ForwardBatch(...)`` call in upstream's ``load_batch``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(PrefillCudaGraphRunner.load_batch)))
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "ForwardBatch"
    ]
    assert len(calls) == 1, "load_batch should build exactly one static ForwardBatch"
    return {k.arg: ast.unparse(k.value) for k in calls[0].keywords}


def test_replay_static_batch_carries_the_live_logprob_counts():
    kw = _static_batch_keywords()
    for field in LOGPROB_FIELDS:
        assert kw.get(field) == f"forward_batch.{field}", (field, kw.get(field))


def test_gather_buffer_is_the_sum_of_live_counts(monkeypatch):
    # A replay at a 2816-token bucket on 8 DP ranks whose live sampling rows are 257 per rank
    # (256 decode rows + the prefill request) except one idle rank.
    live = [257] * 7 + [0]
    bucket_rows = 2816 * 8
    monkeypatch.setattr(lp, "get_dp_hidden_size", lambda: 16)
    monkeypatch.setattr(lp, "get_dp_dtype", lambda: torch.float32)
    monkeypatch.setattr(lp, "get_dp_device", lambda: "cpu")
    monkeypatch.setattr(lp, "get_parallel", lambda: SimpleNamespace(attn_dp_rank=2))
    fb = ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=257,
        input_ids=torch.zeros(2816, dtype=torch.int64),
        req_pool_indices=torch.zeros(257, dtype=torch.int32),
        seq_lens=torch.ones(257, dtype=torch.int32),
        out_cache_loc=torch.zeros(2816, dtype=torch.int64),
        seq_lens_sum=257,
        global_num_tokens_gpu=torch.tensor([2816] * 8),
        global_num_tokens_for_logprob_gpu=torch.tensor(live),
        global_num_tokens_for_logprob_cpu=list(live),
        global_dp_buffer_len=bucket_rows,
    )
    meta = lp.LogitsMetadata.from_forward_batch(fb)
    meta.compute_dp_attention_metadata()
    assert meta.gathered_buffer.shape[0] == sum(live) < bucket_rows
    assert int(meta.dp_local_start_pos) == 2 * 257 and int(meta.dp_local_num_tokens) == 257
