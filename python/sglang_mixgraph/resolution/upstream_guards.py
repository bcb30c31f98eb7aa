"""Guards: what upstream already does under breakable CUDA graphs that the plugin relies on,
checked, not patched.

For GLM-5, SGLang 0.5.23 runs the DSA indexer's non-CP prefill as one eager split op under
breakable graphs (taking the k-only decision inside it), stores the indexer's Q/K for the live
token count, runs the MLA absorb bmm and attention as one eager break, and caps the default
prefill capture of MLA models at 8192 tokens (``drop_empty_segments`` targets the empty segments
these breaks leave; ``plan --preset glm5`` reports them). For every model, a replayed prefill or
mixed step gathers its DP logits for the live rows only (the mixed steady state relies on it).
Each guard reads upstream's code (functions it calls, parameters it takes, decorators it
carries) or runs it on stand-ins, so a release that silently undoes one is caught by ``doctor``
and by the CPU tests, with the exact place. A guard's check returns its problems; none means
upstream still does it.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

DSA = "sglang.srt.layers.attention.dsa"
SPLIT_OP_MODULE = f"{DSA}.dsa_prefill_cuda_graph"
INDEXER = f"{DSA}.dsa_indexer.Indexer"
SURFACE = f"{DSA}.utils.is_graph_dsa_split_op_surface"
MLA = "sglang.srt.models.deepseek_common.attention_forward_methods.forward_mla.DeepseekMLAForwardMixin"
MEMORY_SETTINGS = "sglang.srt.arg_groups.memory_hook.handle_gpu_memory_settings"
BCG_MODULE = (
    "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph"
)
MLA_PREFILL_CAP = 8192
PREFILL_RUNNER = "sglang.srt.model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner"
LOGITS = "sglang.srt.layers.logits_processor"
LOGPROB_FIELDS = ("global_num_tokens_for_logprob_gpu", "global_num_tokens_for_logprob_cpu")


@dataclass(frozen=True)
class Guard:
    name: str
    what: str  # what upstream must keep doing, in one line
    check: Callable[[], list[str]]


def _get(path: str) -> Any:
    """The object at a dotted path (module attribute or class attribute, raw from __dict__).

    Resolved as the registry resolves a hook target: a module on the path whose import raises
    (OSError from a kernel library) is a LookupError naming it, which every guard reports as a
    problem instead of raising out of `doctor`."""
    from sglang_mixgraph.registry import resolve_target

    return resolve_target(path)[2]


def _code(obj: Any) -> types.CodeType:
    fn = obj.__func__ if isinstance(obj, (classmethod, staticmethod)) else obj
    return inspect.unwrap(fn).__code__


def _names(obj: Any) -> set[str]:
    """Global and attribute names a function's code uses, nested functions included."""
    names: set[str] = set()
    todo = [_code(obj)]
    while todo:
        code = todo.pop()
        names.update(code.co_names)
        todo.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return names


def _uses(path: str, *needed: str) -> list[str]:
    try:
        missing = sorted(set(needed) - _names(_get(path)))
    except (LookupError, AttributeError, TypeError) as e:
        return [f"{path}: cannot be read ({type(e).__name__}: {e})"]
    return [f"{path} no longer uses {', '.join(missing)}"] if missing else []


def _takes(path: str, *params: str) -> list[str]:
    try:
        fn = _get(path)
        have = inspect.signature(inspect.unwrap(getattr(fn, "__func__", fn))).parameters
    except (LookupError, AttributeError, TypeError, ValueError) as e:
        return [f"{path}: cannot be read ({type(e).__name__}: {e})"]
    missing = [p for p in params if p not in have]
    return [f"{path} no longer takes {', '.join(missing)}"] if missing else []


def _eager_break_of(path: str, body: str | None = None) -> list[str]:
    """``path`` is an ``eager_on_graph`` callable (a graph break), wrapping ``body`` if given."""
    try:
        obj, marker = _get(path), _get(f"{BCG_MODULE}._EagerOnGraphCallable")
    except (LookupError, AttributeError) as e:
        return [f"{path}: cannot be read ({type(e).__name__}: {e})"]
    if not isinstance(obj, marker):
        return [f"{path} is a {type(obj).__name__}, no longer an eager_on_graph break"]
    if body is not None and getattr(obj, "__wrapped__", None) is not _get(body):
        return [f"{path} no longer wraps {body}"]
    return []


def _dsa_split_op() -> list[str]:
    split = f"{SPLIT_OP_MODULE}.bcg_dsa_indexer_prefill_split"
    return (
        _eager_break_of(split, f"{SPLIT_OP_MODULE}.pcg_dsa_indexer_prefill_split")
        + _uses(
            f"{INDEXER}.forward_cuda",
            "is_graph_dsa_split_op_surface",
            "is_in_breakable_cuda_graph",
            "bcg_dsa_indexer_prefill_split",
            "dsa_enable_prefill_cp",
        )
        + _uses(SURFACE, "is_in_breakable_cuda_graph", "is_extend_without_speculative")
    )


def _k_only_eager() -> list[str]:
    return _uses(
        f"{SPLIT_OP_MODULE}.pcg_dsa_indexer_prefill_split",
        "_should_skip_logits_computation",
        "_forward_cuda_k_only",
    ) + _takes(f"{INDEXER}._forward_cuda_k_only", "num_tokens", "topk_result")


def _fusion_aware_store() -> list[str]:
    return (
        _uses(
            f"{SPLIT_OP_MODULE}.pcg_dsa_indexer_prefill_split",
            "_fused_q_prepare_and_store",
            "_store_index_k_cache",
            "extend_num_tokens",
        )
        + _takes(f"{INDEXER}._fused_q_prepare_and_store", "num_tokens", "enable_dual_stream")
        + _uses(f"{INDEXER}._fused_q_prepare_and_store", "_fused_k_prepare_and_store")
        + _takes(f"{INDEXER}._fused_k_prepare_and_store", "out_cache_loc")
        + _takes(f"{INDEXER}._store_index_k_cache", "out_cache_loc")
    )


def _bmm_attention_composite() -> list[str]:
    composite = f"{MLA}._eager_bmm_attention"
    problems = _eager_break_of(composite)
    if not problems:
        problems += _uses(composite, "bmm", "run_eager", "_eager_attention")
    return (
        problems
        + _uses(f"{MLA}.forward_absorb_core", "_eager_bmm_attention")
        + _uses(
            f"{MLA}.forward_absorb_prepare",
            "_can_fuse_bmm_into_attention",
            "_make_mla_bmm_fusion_plan",
        )
        + _uses(f"{MLA}._can_fuse_bmm_into_attention", "is_graph_dsa_split_op_surface")
    )


def _prefill_max_bs_default() -> list[str]:
    problems = _uses(MEMORY_SETTINGS, "use_mla_backend", "chunked_prefill_size", "min")
    if not problems and MLA_PREFILL_CAP not in _code(_get(MEMORY_SETTINGS)).co_consts:
        problems.append(
            f"{MEMORY_SETTINGS} no longer caps MLA prefill capture at {MLA_PREFILL_CAP}"
        )
    return problems


def _static_batch_keeps_live_counts() -> list[str]:
    """``load_batch`` builds the replay's static ForwardBatch with the live batch's per-rank
    logprob counts (not the bucket's)."""
    path = f"{PREFILL_RUNNER}.load_batch"
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(_get(path))))
    except (LookupError, AttributeError, TypeError, OSError, SyntaxError) as e:
        return [f"{path}: cannot be read ({type(e).__name__}: {e})"]
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "ForwardBatch"
    ]
    if len(calls) != 1:
        return [f"{path} builds {len(calls)} ForwardBatch objects, not one static batch"]
    keywords = {k.arg: ast.unparse(k.value) for k in calls[0].keywords}
    return [
        f"{path} sets the static batch's {field} to {keywords.get(field)!r}, not the live "
        f"batch's (forward_batch.{field})"
        for field in LOGPROB_FIELDS
        if keywords.get(field) != f"forward_batch.{field}"
    ]


class _Recorder:
    """The model of a replay stand-in: records the batch the eager tail runs on."""

    def __init__(self):
        self.tail_batches = []

    def forward(self, input_ids, positions, forward_batch, **kwargs):
        self.tail_batches.append(forward_batch)
        return "logits"


def _tail_runs_on_the_static_batch() -> list[str]:
    """Upstream's ``_execute_body_capture``, run on a breakable-graph runner stand-in (the
    captured body's replay returns at once): the eager logits tail gets the static batch."""
    path = f"{PREFILL_RUNNER}._execute_body_capture"
    try:
        body = _get(path)
    except (LookupError, AttributeError) as e:
        return [f"{path}: cannot be read ({type(e).__name__}: {e})"]
    model = _Recorder()
    runner = SimpleNamespace(
        _is_full_backend=False,
        is_dsv41_model=False,
        _use_draft_input_embeds=False,
        layer_model=SimpleNamespace(forward=None),
        backend=SimpleNamespace(replay=lambda shape_key, batch, **kw: "hidden"),
        buffer_registry=SimpleNamespace(has_slot=lambda name: False),
        model_runner=SimpleNamespace(pp_group=SimpleNamespace(is_first_rank=True), model=model),
        _restore_qwen_bcg_hc_output=lambda hs: hs,
        _prefill_forward_context=lambda *a, **kw: contextlib.nullcontext(),
    )
    live = SimpleNamespace(mm_input_embeds=None, input_ids="live ids", positions="live pos")
    static = SimpleNamespace(mm_input_embeds=None, input_ids="static ids", positions="static pos")
    try:
        body(runner, live, static, 64, 13, SimpleNamespace(size=64))
    except Exception as e:  # upstream changed what the body needs: report, never raise
        return [f"{path} no longer runs on a breakable-graph runner ({type(e).__name__}: {e})"]
    tail = model.tail_batches
    if len(tail) != 1 or tail[0] is not static:
        # A copy of the live batch reads as the live batch (same fields).
        got = "the live batch" if tail and vars(tail[0]) == vars(live) else "another batch"
        return [f"{path} no longer runs the logits tail on the static batch (it gets {got})"]
    return []


def _gather_is_the_live_rows() -> list[str]:
    """``LogitsMetadata`` of such a static batch (a 2816-token bucket on 8 DP ranks, 257 live
    sampling rows per rank but one idle) gathers the live rows only."""
    import torch

    path = f"{LOGITS}.LogitsMetadata"
    live = [257] * 7 + [0]
    bucket_rows = 2816 * 8
    try:
        lp = importlib.import_module(LOGITS)
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

        batch = ForwardBatch(
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
        dp = {
            "get_dp_hidden_size": lambda: 16,
            "get_dp_dtype": lambda: torch.float32,
            "get_dp_device": lambda: "cpu",
            "get_parallel": lambda: SimpleNamespace(attn_dp_rank=2),
        }
        saved = {name: getattr(lp, name) for name in dp}
        try:
            for name, stand_in in dp.items():
                setattr(lp, name, stand_in)
            meta = lp.LogitsMetadata.from_forward_batch(batch)
            meta.compute_dp_attention_metadata()
        finally:
            for name, value in saved.items():
                setattr(lp, name, value)
        rows = int(meta.gathered_buffer.shape[0])
    except Exception as e:  # upstream changed the metadata: report, never raise
        return [f"{path}: cannot be run on a DP batch stand-in ({type(e).__name__}: {e})"]
    if rows != sum(live):
        return [f"{path} gathers {rows} rows for {sum(live)} live ones ({bucket_rows} padded)"]
    return []


def _replay_logits_live_counts() -> list[str]:
    return (
        _static_batch_keeps_live_counts()
        + _uses(f"{PREFILL_RUNNER}.execute", "load_batch", "_execute_body_capture")
        + _tail_runs_on_the_static_batch()
        + _gather_is_the_live_rows()
    )


def _dsv4_attention_tail() -> list[str]:
    """``wo_a_in_break`` defers DeepSeek-V4's attention break to wo_a: nothing else may run on
    the attention output in between."""
    from sglang_mixgraph.patches import wo_a_in_break as wb

    try:
        forward = inspect.unwrap(_get(f"{wb.DSV4}.MQALayer.forward"))
    except LookupError as e:
        return [f"{wb.DSV4}.MQALayer.forward: cannot be read ({e})"]
    beyond = wb.tail_calls_beyond_known(forward)
    if not beyond:
        return []
    return [
        f"{wb.DSV4}.MQALayer.forward, between its attention break and wo_b: {', '.join(beyond)}"
    ]


GUARDS = (
    Guard(
        "dsa_indexer_split_op",
        "the DSA indexer's non-CP prefill runs as one eager split op under breakable graphs",
        _dsa_split_op,
    ),
    Guard(
        "dsa_k_only_decided_eagerly",
        "the indexer's k-only decision (no logits/top-k for short sequences) is taken inside "
        "that eager split op",
        _k_only_eager,
    ),
    Guard(
        "dsa_fusion_aware_store",
        "the split op's Q/K store helpers take the live token count and cache locations",
        _fusion_aware_store,
    ),
    Guard(
        "mla_bmm_attention_composite",
        "the MLA absorb bmm and attention run as one eager break (_eager_bmm_attention)",
        _bmm_attention_composite,
    ),
    Guard(
        "mla_prefill_capture_default",
        f"--cuda-graph-max-bs-prefill defaults to min({MLA_PREFILL_CAP}, chunked prefill size) "
        "for MLA models",
        _prefill_max_bs_default,
    ),
    Guard(
        "replay_logits_live_counts",
        "a replayed prefill or mixed step gathers its DP logits for the live rows: load_batch's "
        "static batch keeps the live counts, _execute_body_capture runs the logits tail on it, "
        "LogitsMetadata gathers their sum",
        _replay_logits_live_counts,
    ),
    Guard(
        "dsv4_attention_tail",
        "DeepSeek-V4's MQALayer.forward runs only the inverse RoPE and wo_a on the attention "
        "break's output before wo_b (wo_a_in_break moves them into the break)",
        _dsv4_attention_tail,
    ),
)


def guard_report() -> list[dict[str, Any]]:
    """Every guard: name, what, ok, problems."""
    out = []
    for guard in GUARDS:
        problems = guard.check()
        out.append(
            {"name": guard.name, "what": guard.what, "ok": not problems, "problems": problems}
        )
    return out
