"""SGLANG_MIXGRAPH_BCG_WO_A_IN_BREAK=1: in DeepSeek-V4's breakable prefill/MIXED graphs the
attention break also runs the inverse RoPE and ``wo_a`` on the live rows, so the attention output
is never copied into a bridge buffer.

Upstream's break (``deepseek_v4_attention_with_output``, sglang.srt.models.deepseek_v4) copies
the backend's output, ``[rows, heads, 512]`` bf16, into the static buffer the next captured
segment reads, and that segment runs the inverse RoPE and ``wo_a`` over the bucket's rows: at 2816
rows of DeepSeek-V4-Pro a 366 MB copy per layer, about 14 ms of a replayed MIXED step on an
H100. Here, while ``MQALayer.forward`` is captured, the break is deferred: the inverse RoPE
(``fused_rope_inplace``) and the bf16 ``wo_a`` (``_apply_wo_a_bf16_matmul``) that follow it are
recorded instead of captured, and one eager break runs attention, inverse RoPE and ``wo_a`` with
upstream's own functions on the live rows, writing ``wo_a``'s output (4x smaller) where the next
segment reads it. Layers whose ``wo_a`` runs in FP8 or fused kernels keep upstream's break (said
once).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import inspect
import textwrap
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from sglang.srt.plugins.hook_registry import HookType

from sglang_mixgraph import counters
from sglang_mixgraph.core.attention_rows import batch_attention_rows
from sglang_mixgraph.core.row_views import RowView, rebase, row_view_of, shares_storage
from sglang_mixgraph.fallback import fallback_once
from sglang_mixgraph.flags import bool_flag
from sglang_mixgraph.registry import EAGER_BREAK, Hook, Patch

PATCH_ID = "wo_a_in_break"
DSV4 = "sglang.srt.models.deepseek_v4"
ATTENTION_BREAK = f"{DSV4}.bcg_deepseek_v4_attention_with_output"
INVERSE_ROPE = f"{DSV4}.fused_rope_inplace"
WO_A = f"{DSV4}._apply_wo_a_bf16_matmul"
LAYER_FORWARD = f"{DSV4}.MQALayer.forward"
BCG_MODULE = (
    "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph"
)
BCG_CONTEXT = "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context"
TC_CONTEXT = "sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph"

FLAG = bool_flag(
    "SGLANG_MIXGRAPH_BCG_WO_A_IN_BREAK",
    False,
    "DeepSeek-V4 breakable prefill graphs: the attention break also runs the inverse RoPE and "
    "the bf16 wo_a on the live rows and writes wo_a's output for the next segment (no copy of "
    "the attention output into a bridge buffer).",
)

FALLBACKS = {
    "outside_layer": "the attention break was called outside DeepSeek-V4's MQALayer.forward",
    "platform": "ROCm or Ascend: the inverse RoPE may run inside the attention kernel there",
    "wo_a_fp8": "wo_a runs in FP8 (DeepGEMM's fp8_einsum or aiter): the break carries the bf16 "
    "wo_a only",
    "fused_wo_a": "DeepSeek-V4.1's fused inverse-RoPE + wo_a kernel runs in this layer",
    "mxfp8_wo_b": "wo_b takes wo_a's output quantized to MXFP8 (flashinfer)",
    "gguf": "wo_a is a GGUF weight",
    "layout": "the attention output is not one contiguous row-major buffer",
    "call_site": "the layer consumed the attention output otherwise than through the inverse "
    "RoPE then wo_a: upstream's break runs where the first consumer is",
    "tail_changed": "MQALayer.forward calls something between the attention break and wo_b that "
    "SGLang 0.5.23 does not: the patch cannot tell that it leaves the attention output alone",
}

# Every call MQALayer.forward makes, in SGLang 0.5.23, between the attention break and wo_b
# (all branches): deferring the break is safe only while nothing else can read its output there.
TAIL_CALLS = frozenset(
    {
        "Dsv4NpuRoPE.apply_rotary_mul_inplace",
        "F.linear",
        "Mxfp8SwizzledInput",
        "_apply_gguf_grouped_wo_a",
        "_apply_wo_a_bf16_matmul",
        "_fp8_wo_a_einsum",
        "_freqs_cis_to_cos_sin",
        "_hip.wo_a_emits_fp8_grid",
        "_hip.wo_b_emits_mxfp8",
        "_wo_a_fp8_mxscale",
        "_wo_a_fp8_mxscale_fused_invrope",
        "_wo_a_fp8_mxscale_prequant",
        "attn_backend.forward",
        "forward_batch.forward_mode.is_decode",
        "forward_batch.forward_mode.is_extend_without_speculative",
        "forward_batch.forward_mode.is_target_verify",
        "fused_rope_inplace",
        "fused_rope_wo_a_bf16",
        "get_forward",
        "getattr",
        "o.reshape",
        "o.reshape(T * G, D).contiguous",
        "o.view",
        "o_fp8.view",
        "o_s.view",
        "o_scale.view",
        "self._get_npu_rope_position_cache",
        "self._project_wo_b",
        "self.wo_a.weight.view",
        "self.wo_a.weight_scale_inv.view",
        "sglang_per_token_group_quant_fp8",
        "sglang_per_token_group_quant_fp8_dsv4_wo_a",
        "torch.view_as_real",
        "torch.view_as_real(self.freqs_cis).flatten",
        "torch_npu.npu_dynamic_mx_quant",
        "torch_npu.npu_transpose_quant_batchmatmul",
        "wo_a_weight.is_contiguous",
        "wo_a_weight.view",
    }
)
BREAK_NAME = ATTENTION_BREAK.rsplit(".", 1)[1]


@functools.cache
def _module(name: str):
    return importlib.import_module(name)


@dataclass
class _Deferred:
    """An attention break not yet run, and the inverse RoPE recorded after it."""

    run_break: Callable[..., Any]  # upstream's break
    args: tuple  # (query, key_value, output, layer_id, compress_ratio, attn_sink, save_kv_cache)
    rope_fn: Callable[..., Any] | None = None
    rope_call: tuple | None = None  # the recorded call: (q, k, freqs_cis, positions, inverse)
    rope_view: RowView | None = None

    @property
    def output(self):
        return self.args[2]


_LAYER: ContextVar[Any] = ContextVar("wo_a_in_break_layer", default=None)
_DEFERRED: ContextVar[_Deferred | None] = ContextVar("wo_a_in_break_deferred", default=None)


@contextlib.contextmanager
def layer_scope(layer) -> Iterator[None]:
    """The DeepSeek-V4 attention layer whose forward is running; a break deferred inside it must
    be consumed by its end (else what was captured read an uncomputed buffer)."""
    token = _LAYER.set(layer)
    try:
        yield
    finally:
        _LAYER.reset(token)
        left = _DEFERRED.get()
        _DEFERRED.set(None)
    if left is not None:
        raise RuntimeError(
            f"sglang-mixgraph {PATCH_ID}: layer {left.args[3]}'s attention break was deferred "
            f"but its output never reached wo_a; set {FLAG.name}=0 and report the model"
        )


def tail_calls_beyond_known(forward: Callable[..., Any]) -> list[str]:
    """The calls ``forward`` (``MQALayer.forward``) makes between the attention break and its
    last ``self._project_wo_b`` that SGLang 0.5.23's does not; a problem line where the source
    cannot be read or holds no such break."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(forward)))
    except (OSError, TypeError, SyntaxError) as e:
        return [f"the source of MQALayer.forward cannot be read ({type(e).__name__})"]
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    starts = [n.lineno for n in calls if ast.unparse(n.func) == BREAK_NAME]
    ends = [n.lineno for n in calls if ast.unparse(n.func) == "self._project_wo_b"]
    if not starts or not ends or max(ends) < min(starts):
        return [f"MQALayer.forward no longer calls {BREAK_NAME} before self._project_wo_b"]
    region = {ast.unparse(n.func) for n in calls if min(starts) < n.lineno <= max(ends)}
    return sorted(region - TAIL_CALLS)


@functools.cache
def _tail_beyond_known() -> tuple[str, ...]:
    """The installed layer's new tail calls, read once per process."""
    return tuple(tail_calls_beyond_known(inspect.unwrap(_module(DSV4).MQALayer.forward)))


def _reason(key: str) -> str:
    if key == "tail_changed":
        return f"{FALLBACKS[key]} ({', '.join(_tail_beyond_known())})"
    return FALLBACKS[key]


def unhandled(layer, output) -> str | None:
    """Why the attention break of ``layer`` stays upstream's (a FALLBACKS key), or None."""
    if layer is None:
        return "outside_layer"
    if _tail_beyond_known():
        return "tail_changed"
    dsv4 = _module(DSV4)
    if dsv4._is_hip or dsv4._is_npu or getattr(layer, "use_npu_arch35_mxfp8_wo_a", False):
        return "platform"
    if layer.wo_a_fp8:
        return "wo_a_fp8"
    if layer.use_fused_wo_a:
        return "fused_wo_a"
    if getattr(layer, "use_flashinfer_mxfp8_wo_b", False):
        return "mxfp8_wo_b"
    if getattr(layer.wo_a, "weight", None) is None:
        return "gguf"
    if output.dim() < 2 or not output.is_contiguous():
        return "layout"
    return None


def _flush(deferred: _Deferred, key: str) -> None:
    """Run what was deferred, in upstream's order, where the layer's next consumer is."""
    _DEFERRED.set(None)
    fallback_once(PATCH_ID, FALLBACKS[key], key=key)
    deferred.run_break(*deferred.args)
    if deferred.rope_call is not None:
        deferred.rope_fn(*deferred.rope_call)


def _attend(query, key_value, forward_batch, layer, compress_ratio, attn_sink, save_kv_cache):
    """The backend's attention over the live rows, as upstream's break calls it (its cache
    locations cut to the same rows while it runs); the backend's own output tensor."""
    full_loc = forward_batch.out_cache_loc
    forward_batch.out_cache_loc = full_loc[: query.shape[0]]
    try:
        return (
            _module(DSV4)
            .get_attn_backend()
            .forward(
                q=query,
                k=key_value,
                v=key_value,
                layer=layer,
                forward_batch=forward_batch,
                compress_ratio=compress_ratio,
                attn_sink=attn_sink,
                save_kv_cache=save_kv_cache,
            )
        )
    finally:
        forward_batch.out_cache_loc = full_loc


def _attention_through_wo_a(
    query,
    key_value,
    out,
    layer_id,
    compress_ratio,
    attn_sink,
    save_kv_cache,
    positions,
    freqs_cis,
    wo_a,
    *,
    rope_view: RowView,
    wo_a_view: RowView,
    row_tail: tuple[int, ...],
    is_decode: bool,
    wo_a_kwargs: tuple,
    rope_fn: Callable[..., Any],
    wo_a_fn: Callable[..., Any],
) -> None:
    """The eager break: attention, inverse RoPE and wo_a on the live rows (upstream's functions,
    the arguments the capture recorded), wo_a's output into ``out``; reads the step's row count
    from the forward context at run time, by the rule upstream's break slices with
    (``core.attention_rows``)."""
    context = _module(TC_CONTEXT).get_tc_piecewise_forward_context()
    forward_batch = context.forward_batch
    # the rows upstream's break slices to (all of them where the count is unset)
    rows = batch_attention_rows(forward_batch)
    if rows == 0:
        out.zero_()
        return
    o = _attend(
        query[:rows],
        key_value[:rows],
        forward_batch,
        context.attention_layers[layer_id],
        compress_ratio,
        attn_sink,
        save_kv_cache,
    )
    o = o.reshape(rows, *row_tail)  # a view of the backend's output unless it is strided
    rope_fn(rebase(rope_view, o), None, freqs_cis, positions[:rows], True)
    out[:rows].copy_(wo_a_fn(rebase(wo_a_view, o), wo_a, is_decode, **dict(wo_a_kwargs)))
    out[rows:].zero_()
    counters.count(PATCH_ID, "breaks_run")


@functools.cache
def _break():
    return _module(BCG_MODULE).eager_on_graph(_attention_through_wo_a)


def around_layer_forward(original, self, *args, **kwargs):
    """Names the layer for the attention break while a breakable graph is built."""
    # Every eager forward passes here: the module-level graph state first, the environment after.
    if not _module(BCG_CONTEXT).is_in_breakable_cuda_graph() or not FLAG.get():
        return original(self, *args, **kwargs)
    with layer_scope(self):
        return original(self, *args, **kwargs)


def around_attention_break(
    original, query, key_value, output, layer_id, compress_ratio, attn_sink, save_kv_cache
):
    """Defers upstream's break until the layer's wo_a, where the layer is one the patch handles."""
    args = (query, key_value, output, layer_id, compress_ratio, attn_sink, save_kv_cache)
    if not FLAG.get():
        return original(*args)
    why = unhandled(_LAYER.get(), output)
    if why is not None or _DEFERRED.get() is not None:
        fallback_once(PATCH_ID, _reason(why or "call_site"), key=why or "call_site")
        return original(*args)
    _DEFERRED.set(_Deferred(original, args))
    counters.count(PATCH_ID, "breaks_deferred")
    return None


def around_inverse_rope(original, q, k, freqs_cis, positions, inverse=False):
    """Recorded, not captured, when it rotates the deferred attention output."""
    deferred = _DEFERRED.get()
    call = (q, k, freqs_cis, positions, inverse)
    if deferred is None or not shares_storage(q, deferred.output):
        return original(*call)
    view = row_view_of(q, deferred.output)
    if k is not None or not inverse or deferred.rope_call is not None or view is None:
        _flush(deferred, "call_site")
        return original(*call)
    deferred.rope_fn, deferred.rope_call, deferred.rope_view = original, call, view
    return None


def around_wo_a(original, o, wo_a, is_decode, **kwargs):
    """Where the deferred output meets wo_a: one eager break runs all three on the live rows and
    writes wo_a's output, which the captured segment after it reads."""
    deferred = _DEFERRED.get()
    if deferred is None or not shares_storage(o, deferred.output):
        return original(o, wo_a, is_decode, **kwargs)
    view = row_view_of(o, deferred.output)
    quantized = any(kwargs.get(k) for k in ("fuse_mxfp8_quant", "fp8_grid", "emit_fp8"))
    if deferred.rope_call is None or view is None or is_decode or quantized:
        _flush(deferred, "call_site")
        return original(o, wo_a, is_decode, **kwargs)
    _DEFERRED.set(None)
    query, key_value, output, layer_id, compress_ratio, attn_sink, save_kv_cache = deferred.args
    _q, _k, freqs_cis, positions, _inverse = deferred.rope_call
    out = o.new_empty((o.shape[0], wo_a.shape[0], wo_a.shape[1]))
    _break()(
        query,
        key_value,
        out,
        layer_id,
        compress_ratio,
        attn_sink,
        save_kv_cache,
        positions,
        freqs_cis,
        wo_a,
        rope_view=deferred.rope_view,
        wo_a_view=view,
        row_tail=tuple(output.shape[1:]),
        is_decode=is_decode,
        wo_a_kwargs=tuple(sorted(kwargs.items())),
        rope_fn=deferred.rope_fn,
        wo_a_fn=original,
    )
    counters.count(PATCH_ID, "layers_through_wo_a")
    return out


def explain_for_deployment(plan) -> str:
    """For `plan`: whether this deployment's (a graph_plan.GraphPlan) attention breaks carry
    wo_a."""
    facts, prefill = plan.facts, plan.prefill
    if not facts.deepseek_v4:
        return "not a DeepSeek-V4 model: no DeepSeek-V4 attention break"
    if prefill.backend != "breakable" or not prefill.buckets:
        return "no breakable prefill graph: eager steps copy no attention output"
    acts = (
        "each layer's attention break also runs the inverse RoPE and wo_a on the live rows "
        "where wo_a is bf16 (layers with an FP8 or fused wo_a keep upstream's break)"
    )
    if not facts.fp8_block_checkpoint:
        return acts
    # SGLang decides at startup (arg_groups.serving_hook): the FP8 wo_a GEMM stays on where
    # DeepGEMM scales in UE8M0 (SM100, SM120) and on SM90 only when the user asks for it.
    from sglang.srt.environ import envs

    flag = envs.SGLANG_OPT_FP8_WO_A_GEMM.name
    if plan.gpu_sm_major >= 10:
        return (
            f"on this GPU SGLang runs this FP8 checkpoint's wo_a in FP8 (its default with "
            f"DeepGEMM), which the break does not carry: every layer keeps upstream's break "
            f"unless {flag}=0 (wo_a dequantized to bf16 at load)"
        )
    return f"{acts}; this FP8 checkpoint's wo_a is bf16 on this GPU unless {flag}=1 is set"


HOOKS = (
    Hook(
        LAYER_FORWARD,
        "method",
        "self",
        HookType.AROUND,
        around_layer_forward,
    ),
    Hook(
        ATTENTION_BREAK,
        EAGER_BREAK,
        "query, key_value, output, layer_id, compress_ratio, attn_sink, save_kv_cache",
        HookType.AROUND,
        around_attention_break,
    ),
    Hook(
        INVERSE_ROPE,
        "function",
        "q, k, freqs_cis, positions, inverse",
        HookType.AROUND,
        around_inverse_rope,
    ),
    Hook(WO_A, "function", "o, wo_a, is_decode", HookType.AROUND, around_wo_a),
)

PATCH = Patch(
    id=PATCH_ID,
    summary="DeepSeek-V4 breakable prefill graphs: inverse RoPE and wo_a inside the attention "
    "break",
    flags=(FLAG,),
    hooks=HOOKS,
    is_enabled=lambda: bool(FLAG.get()),
    explain=explain_for_deployment,
    why=(
        "DeepSeek-V4's breakable prefill graph copies each layer's attention output "
        "(rows x heads x 512 bf16, 366 MB at 2816 rows of V4-Pro) into the buffer the next "
        "captured segment reads, which then runs the inverse RoPE and wo_a over the bucket's "
        "rows: about 14 ms of a replayed MIXED step on an H100"
    ),
    how=(
        "while MQALayer.forward is captured, the attention break is deferred and the inverse "
        "RoPE and bf16 wo_a after it are recorded instead of captured; one eager break runs "
        "the three with upstream's functions on the live rows and writes wo_a's output "
        "(4x smaller) where the next segment reads it"
    ),
    upstream_pr=None,
    retired_by=(
        "upstream's DeepSeek-V4 break ending after wo_a, or FlashMLA's sparse prefill writing "
        "into a caller's output buffer"
    ),
    docs_page="docs/wo-a-in-break.md",
    reads=(
        (f"{BCG_MODULE}.eager_on_graph", Callable),
        (f"{BCG_CONTEXT}.is_in_breakable_cuda_graph", Callable),
        (f"{TC_CONTEXT}.get_tc_piecewise_forward_context", Callable),
        (f"{DSV4}.get_attn_backend", Callable),
        (f"{DSV4}._is_hip", bool),
        (f"{DSV4}._is_npu", bool),
    ),
)
