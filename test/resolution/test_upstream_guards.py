"""The upstream guards pass on the installed sglang and fail, naming the place, on a doctored one."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch

from sglang_mixgraph.resolution import upstream_guards as ug


def test_every_guard_holds_on_the_installed_sglang():
    report = ug.guard_report()
    assert [g["name"] for g in report] == [g.name for g in ug.GUARDS]
    assert [g for g in report if not g["ok"]] == []


def _owner(path):
    owner_path, attr = path.rsplit(".", 1)
    try:
        return importlib.import_module(owner_path), attr
    except ModuleNotFoundError:
        mod, cls = owner_path.rsplit(".", 1)
        return getattr(importlib.import_module(mod), cls), attr


def _plain(*args, **kwargs):
    return None


def _forward_cuda_without_split_op(self, x, forward_batch):
    if is_graph_dsa_split_op_surface(forward_batch) and not self.dsa_enable_prefill_cp:  # noqa: F821
        return is_in_breakable_cuda_graph()  # noqa: F821
    return x


def _split_op_always_full(layer_id, x, q_lora, positions, topk_result):
    indexer = forward_context.dsa_indexers[layer_id]  # noqa: F821
    n = forward_batch.extend_num_tokens  # noqa: F821
    indexer._fused_q_prepare_and_store(x, q_lora, positions, num_tokens=n)
    indexer._store_index_k_cache(x, out_cache_loc=None)


def _fused_q_without_num_tokens(self, x, q_lora, positions, forward_batch, layer_id, act_quant):
    return self._fused_k_prepare_and_store(x, positions, forward_batch, layer_id, act_quant)


def _memory_settings_without_cap(server_args):
    cfg = server_args
    if use_mla_backend(server_args):  # noqa: F821
        return min(4096, cfg.chunked_prefill_size)
    return cfg.chunked_prefill_size


def _body_with_a_live_tail(
    self, forward_batch, static_forward_batch, static_num_tokens, raw_num_tokens, shape_key, **kw
):
    # The eager tail on a view of the live batch, as upstream's full-graph branch does.
    tail = copy.copy(forward_batch)
    return self.model_runner.model.forward(tail.input_ids, tail.positions, tail, **kw)


def _load_batch_with_bucket_counts(self, forward_batch, **kwargs):
    counts = self.bucket_counts
    return ForwardBatch(  # noqa: F821
        input_ids=forward_batch.input_ids,
        global_num_tokens_for_logprob_gpu=counts,
        global_num_tokens_for_logprob_cpu=forward_batch.global_num_tokens_for_logprob_cpu,
    )


def _gather_the_padded_rows(self):
    self.gathered_buffer = torch.empty(self.global_dp_buffer_len, 16)


SPLIT = f"{ug.SPLIT_OP_MODULE}.bcg_dsa_indexer_prefill_split"


def _mqa_forward_with_a_new_tail_call(self, x, positions, forward_batch, x_quant=None):
    o = x.new_empty(x.shape)
    bcg_deepseek_v4_attention_with_output(x, x, o, 0, 4, None, False)  # noqa: F821
    o = scale_heads(o)  # noqa: F821
    return self._project_wo_b(o)


DOCTORED = [
    (
        "dsv4_attention_tail",
        "sglang.srt.models.deepseek_v4.MQALayer.forward",
        _mqa_forward_with_a_new_tail_call,
        "sglang.srt.models.deepseek_v4.MQALayer.forward, between its attention break and wo_b: "
        "scale_heads",
    ),
    (
        "dsv4_attention_tail",
        "sglang.srt.models.deepseek_v4.MQALayer.forward",
        _plain,
        "sglang.srt.models.deepseek_v4.MQALayer.forward, between its attention break and wo_b: "
        "MQALayer.forward no longer calls bcg_deepseek_v4_attention_with_output before "
        "self._project_wo_b",
    ),
    (
        "dsa_indexer_split_op",
        f"{ug.INDEXER}.forward_cuda",
        _forward_cuda_without_split_op,
        f"{ug.INDEXER}.forward_cuda no longer uses bcg_dsa_indexer_prefill_split",
    ),
    (
        "dsa_indexer_split_op",
        SPLIT,
        _plain,
        f"{SPLIT} is a function, no longer an eager_on_graph break",
    ),
    (
        "dsa_k_only_decided_eagerly",
        f"{ug.SPLIT_OP_MODULE}.pcg_dsa_indexer_prefill_split",
        _split_op_always_full,
        f"{ug.SPLIT_OP_MODULE}.pcg_dsa_indexer_prefill_split no longer uses "
        "_forward_cuda_k_only, _should_skip_logits_computation",
    ),
    (
        "dsa_fusion_aware_store",
        f"{ug.INDEXER}._fused_q_prepare_and_store",
        _fused_q_without_num_tokens,
        f"{ug.INDEXER}._fused_q_prepare_and_store no longer takes num_tokens, enable_dual_stream",
    ),
    (
        "mla_bmm_attention_composite",
        f"{ug.MLA}._eager_bmm_attention",
        _plain,
        f"{ug.MLA}._eager_bmm_attention is a function, no longer an eager_on_graph break",
    ),
    (
        "mla_prefill_capture_default",
        ug.MEMORY_SETTINGS,
        _memory_settings_without_cap,
        f"{ug.MEMORY_SETTINGS} no longer caps MLA prefill capture at 8192",
    ),
    (
        "replay_logits_live_counts",
        f"{ug.PREFILL_RUNNER}._execute_body_capture",
        _body_with_a_live_tail,
        f"{ug.PREFILL_RUNNER}._execute_body_capture no longer runs the logits tail on the "
        "static batch (it gets the live batch)",
    ),
    (
        "replay_logits_live_counts",
        f"{ug.PREFILL_RUNNER}.load_batch",
        _load_batch_with_bucket_counts,
        f"{ug.PREFILL_RUNNER}.load_batch sets the static batch's "
        "global_num_tokens_for_logprob_gpu to 'counts', not the live batch's "
        "(forward_batch.global_num_tokens_for_logprob_gpu)",
    ),
    (
        "replay_logits_live_counts",
        f"{ug.LOGITS}.LogitsMetadata.compute_dp_attention_metadata",
        _gather_the_padded_rows,
        f"{ug.LOGITS}.LogitsMetadata gathers 22528 rows for 1799 live ones (22528 padded)",
    ),
]


@pytest.mark.parametrize(
    "guard, path, replacement, message", DOCTORED, ids=[f"{d[0]}:{d[1]}" for d in DOCTORED]
)
def test_a_doctored_upstream_fails_its_guard_with_the_place(
    monkeypatch, guard, path, replacement, message
):
    owner, attr = _owner(path)
    monkeypatch.setattr(owner, attr, replacement)
    report = {g["name"]: g for g in ug.guard_report()}
    assert report[guard]["ok"] is False
    assert message in report[guard]["problems"]
    failing = {name for name, g in report.items() if not g["ok"]}
    # a new split-op body is no longer the one the eager break wraps
    also = {"dsa_indexer_split_op"} if path.endswith("pcg_dsa_indexer_prefill_split") else set()
    assert failing == {guard} | also


def test_the_logits_guard_runs_upstreams_replay_body_and_leaves_upstream_as_it_was():
    """The tail check runs upstream's own ``_execute_body_capture`` (a rename there is a
    problem, not an exception), and the gather check restores the DP getters it stands in."""
    lp = importlib.import_module(ug.LOGITS)
    getters = {n: getattr(lp, n) for n in ("get_dp_hidden_size", "get_parallel")}
    assert ug._replay_logits_live_counts() == []
    assert {n: getattr(lp, n) for n in getters} == getters
    runner = importlib.import_module(ug.PREFILL_RUNNER.rsplit(".", 1)[0]).PrefillCudaGraphRunner
    body = runner._execute_body_capture
    try:
        del runner._execute_body_capture
        (problem,) = ug._tail_runs_on_the_static_batch()
    finally:
        runner._execute_body_capture = body
    assert problem.startswith(f"{ug.PREFILL_RUNNER}._execute_body_capture: cannot be read")


def test_a_missing_upstream_function_is_reported_not_raised(monkeypatch):
    owner, attr = _owner(f"{ug.INDEXER}._forward_cuda_k_only")
    monkeypatch.delattr(owner, attr)
    (problem,) = ug._k_only_eager()
    assert problem == (
        f"{ug.INDEXER}._forward_cuda_k_only: cannot be read "
        "(LookupError: 'Indexer' has no attribute '_forward_cuda_k_only')"
    )


def test_an_upstream_module_whose_import_raises_is_reported_not_raised(tmp_path, monkeypatch):
    """Used to: the OSError of a kernel library that will not load escaped the guard and doctor
    died with its traceback."""
    (tmp_path / "mixgraph_test_broken_kernel.py").write_text(
        "raise OSError('libbroken_kernel.so: cannot open shared object file')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    (problem,) = ug._uses("mixgraph_test_broken_kernel.attention", "x")
    assert problem == (
        "mixgraph_test_broken_kernel.attention: cannot be read (TargetImportError: importing "
        "mixgraph_test_broken_kernel raised OSError: libbroken_kernel.so: cannot open shared "
        "object file)"
    )


def test_doctor_shows_every_guard_and_fails_on_a_broken_one(monkeypatch, capsys):
    from sglang_mixgraph.resolution.doctor_report import doctor_report, print_doctor

    owner, attr = _owner(ug.MEMORY_SETTINGS)
    monkeypatch.setattr(owner, attr, _memory_settings_without_cap)
    report = doctor_report()
    assert report["ok"] is False
    print_doctor(report)
    out = capsys.readouterr().out
    for guard in ug.GUARDS:
        mark = "BAD" if guard.name == "mla_prefill_capture_default" else "ok "
        assert f"  [{mark}] {guard.name}: {guard.what}" in out
    assert f"      {ug.MEMORY_SETTINGS} no longer caps MLA prefill capture at 8192" in out
    assert out.rstrip().endswith("an upstream guard fails")
