"""F1/F1b/F1c: split a DSV4 MIXED step at the prefill/decode boundary (eager path).

Upstream 0.5.23 sends every row of a MIXED batch through the sparse-prefill path, which
dequantizes each request's SWA window and whole compressed history into a bf16 workspace
(``sglang/srt/layers/attention/deepseek_v4_backend.py`` ``_forward_prefill_sparse`` 4406-4505).
The decode rows (one query each) pay for that workspace although the fp8 decode kernel
(``flash_mla_with_kvcache``, the pure-decode path at 4362-4401) reads the paged cache directly.
With ``SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN=1``:

* the boundary is taken from the batch the scheduler built: decode requests are appended after
  the prefill requests (``schedule_batch.py`` ``mix_with_running`` 3267-3365, ``decoding_reqs``
  set at ``scheduler.py`` 4396, or ``convert_decode_to_extend`` 3367-3401 for a DP-attention
  decode batch relabelled to a 1-token EXTEND), recorded by an AFTER hook on
  ``ForwardBatch.init_new``; a DECODE batch relabelled to EXTEND inside
  ``ForwardBatch.prepare_mlp_sync_batch`` (``forward_batch_info.py`` 1872-1932) is recognised by
  its ``_original_forward_mode``; a MIXED batch that ``EagerRunner.execute`` runs as EXTEND
  is recognised because ``init_new`` saw it MIXED (an AFTER hook on ``EagerRunner.load_batch``
  carries that record onto the copy of the batch the eager forward runs);
* an AFTER hook on ``DeepseekV4AttnBackend.init_forward_metadata`` (2861-2876) decides the split
  for the step (fallbacks, policy; ``adaptive`` decides per compress ratio), stores a
  :class:`SplitPlan` on the fresh metadata (every build resets it), and installs a sparse-prefill
  chunk cache built over the prefill requests only before the first layer runs; when some
  present ratio stays unsplit it also builds, first and through upstream's builder unchanged,
  the all-requests chunk cache upstream itself would have built, which layers of that ratio see;
* an AROUND hook on ``_build_sparse_prefill_chunk_cache`` (2959-3030) makes every builder call
  of a split step (our pre-build, the eager WAR snapshot 2935-2957, the lazy build 4429-4434)
  produce that prefill-only cache;
* AROUND hooks on ``_forward_prefill_sparse`` and the SM90 ``_forward_prefill_sparse_q8kv8``
  (4564-4681), for a layer whose ratio splits, run upstream's body on rows ``[0, b0)`` and the
  fp8 decode kernel on rows ``[b0, b0 + D)`` with exactly those rows of the step's metadata, and
  return one output in the original row order (padding rows zero, as the sparse kernel leaves
  rows no request owns); for a layer whose ratio does not split they run upstream's body on all
  rows with the all-requests chunk cache swapped in for the call.

Anything this code does not handle falls back to the upstream path for the whole step, logged
once per reason (see :data:`FALLBACK_REASONS` and docs/mixed-split.md).
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Optional

from sglang.srt.plugins.hook_registry import HookType

from sglang_mixgraph import counters
from sglang_mixgraph.core.decode_tail import DecodeTail
from sglang_mixgraph.core.mixed_boundary import (
    MixedBoundary,
    assemble_rows,
    compute_mixed_boundary,
    copy_in_join,
    slice_decode_tail,
)
from sglang_mixgraph.fallback import fallback_once
from sglang_mixgraph.flags import bool_flag, choice_flag
from sglang_mixgraph.registry import Hook, Patch

logger = logging.getLogger(__name__)

PATCH_ID = "mixed_split"
BACKEND = "sglang.srt.layers.attention.deepseek_v4_backend.DeepseekV4AttnBackend"
FORWARD_BATCH = "sglang.srt.model_executor.forward_batch_info.ForwardBatch"
EAGER_RUNNER = "sglang.srt.model_executor.runner.eager_runner.EagerRunner"

SPLIT_FLAG = bool_flag(
    "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN",
    False,
    "DSV4: split mixed prefill/decode steps at the boundary; decode rows use the fp8 decode "
    "kernel, the sparse-prefill workspace covers only the prefill requests.",
)
# Default from the H200 sweep (docs/results/mixed_split_h200.md, "Conclusions and default
# policy"): `always` loses up to 17 % per step at short contexts, `adaptive` stays within ~1 %.
POLICY_FLAG = choice_flag(
    "SGLANG_MIXGRAPH_SPLIT_POLICY",
    "adaptive",
    ("always", "adaptive"),
    "With the mixed split on: `always` splits every step with decode rows; `adaptive` splits "
    "only where the per-GPU cost model predicts a gain.",
    off_value="always",
)

# The compress ratios of a DSV4 (not V4.1) model: SWA-only, CSA, HCA.
ALL_RATIOS = (0, 4, 128)

# Attribute names we add to upstream objects (prefixed so they never collide).
NUM_DECODE_ATTR = "_mixgraph_num_decode"  # on ForwardBatch, from init_new
BUILT_MIXED_ATTR = "_mixgraph_built_mixed"  # on ForwardBatch: init_new saw a MIXED batch
PLAN_ATTR = "mixgraph_split"  # on DSV4Metadata, one per metadata build

FALLBACK_REASONS = {
    "trtllm": "trtllm attention backend (no sparse-prefill path to split)",
    "mega": "mega attention backend (fused RoPE prefill/decode kernels)",
    "cp": "context parallelism",
    "hisparse": "hisparse",
    "sm120": "SM120",
    "dsv41": "DSV4.1 (interleaved KV layouts, low-ratio c1/c2 layers)",
    "low_ratio": "DSV4.1 low-ratio (c1/c2) layers",
    "late_tail": "decoder SWA bounded replay (late-layer tail)",
    "spec": "speculative decoding",
    "dspark": "DSpark draft backend",
    "request_window": "request-window SWA layout",
    "encoder_replay": "encoder SWA replay rows",
    "xpu": "XPU",
    "heads": "query head count outside the decode kernel's {64, 128}",
    "rows": "metadata rows do not cover the decode tail",
    "boundary": "decode requests are not the 1-token tail of the batch",
    "shape": "attention rows differ from the planned step",
}


def _fallback(reason_key: str) -> None:
    fallback_once(PATCH_ID, FALLBACK_REASONS[reason_key], key=reason_key)


def _count(event: str, n: int = 1) -> None:
    counters.count(PATCH_ID, event, n)


# --------------------------------------------------------------------------------------------
# per-step state
# --------------------------------------------------------------------------------------------


@dataclass
class SplitPlan:
    """The split of one step, stored on the step's ``DSV4Metadata`` (attribute ``mixgraph_split``)."""

    boundary: MixedBoundary
    forward_batch_ref: Any  # weakref to the ForwardBatch the plan was made for
    tail: DecodeTail
    # Compress ratios whose layers take the split path this step (``always``: every ratio).
    split_ratios: FrozenSet[int] = frozenset(ALL_RATIOS)
    # The all-requests chunk cache upstream would have built for this step, for the layers of
    # ratios outside ``split_ratios``; None when every present ratio splits.
    full_cache: Any = None
    # Diagnostics for tests and logs.
    policy: str = "always"
    decode_calls: Dict[int, int] = field(default_factory=dict)
    unsplit_calls: Dict[int, int] = field(default_factory=dict)

    def splits(self, compress_ratio: int) -> bool:
        return compress_ratio in self.split_ratios

    def matches(self, forward_batch) -> bool:
        ref = self.forward_batch_ref
        target = ref() if isinstance(ref, weakref.ref) else ref
        return target is forward_batch


def get_plan(backend) -> Optional[SplitPlan]:
    metadata = getattr(backend, "forward_metadata", None)
    return getattr(metadata, PLAN_ATTR, None)


def _weak(obj):
    try:
        return weakref.ref(obj)
    except TypeError:
        return obj


# --------------------------------------------------------------------------------------------
# boundary detection
# --------------------------------------------------------------------------------------------


def after_forward_batch_init_new(result, cls, batch, model_runner, **kwargs):
    """AFTER ``ForwardBatch.init_new``: remember how many decode requests end the batch.

    ``init_new`` reads ``batch.decoding_reqs`` only for ``contains_last_prefill_chunk``
    (forward_batch_info.py:1023-1029) and keeps no count; we keep ``len(decoding_reqs)`` when
    those requests are exactly the tail of ``batch.reqs`` (mix_with_running appends them,
    schedule_batch.py:3977; convert_decode_to_extend makes every request one, 3400).
    """
    num_decode = None
    mode = getattr(batch, "forward_mode", None)
    decoding = getattr(batch, "decoding_reqs", None)
    if mode is not None and decoding and (mode.is_mixed() or mode.is_extend_without_speculative()):
        reqs = list(getattr(batch, "reqs", ()) or ())
        d = len(decoding)
        tail = reqs[len(reqs) - d :] if d <= len(reqs) else []
        if len(tail) == d and all(a is b for a, b in zip(tail, decoding)):
            num_decode = d
    setattr(result, NUM_DECODE_ATTR, num_decode)
    # The label can change before the forward (EagerRunner.execute runs MIXED as EXTEND);
    # what the scheduler built cannot.
    setattr(result, BUILT_MIXED_ATTR, num_decode is not None and mode.is_mixed())
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
        for attr in (NUM_DECODE_ATTR, BUILT_MIXED_ATTR):
            if hasattr(forward_batch, attr):
                setattr(result, attr, getattr(forward_batch, attr))
    return None


def decode_tail_of(forward_batch) -> Optional[tuple]:
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
    d = getattr(forward_batch, NUM_DECODE_ATTR, None)
    if mode == ForwardMode.MIXED:
        return (d, "mixed") if d else None
    if mode == ForwardMode.EXTEND:
        original = getattr(forward_batch, "_original_forward_mode", None)
        if original is not None and original.is_decode():
            lens = forward_batch.extend_seq_lens_cpu or []
            return (len(lens), "dp_decode_relabel") if lens else None
        if not d or original is not None:
            return None
        if getattr(forward_batch, BUILT_MIXED_ATTR, False):
            return d, "mixed_run_as_extend"
        if d == forward_batch.batch_size:
            return d, "converted_decode"
    return None


def num_decode_requests(forward_batch) -> Optional[int]:
    """Decode requests at the end of this step's batch, or None when unknown / not a candidate."""
    tail = decode_tail_of(forward_batch)
    return tail[0] if tail else None


# --------------------------------------------------------------------------------------------
# the per-step decision (AFTER init_forward_metadata)
# --------------------------------------------------------------------------------------------


def _unsupported_reason(backend, forward_batch, metadata) -> Optional[str]:
    from sglang.srt.layers.cp.utils import is_cp_active
    from sglang.srt.runtime_context import get_platform

    from sglang.srt.layers.attention import deepseek_v4_backend as dsv4

    if getattr(backend, "trtllm_attn", False):
        return "trtllm"
    try:
        from sglang.srt.layers.attention.deepseek_v4_mega_backend import DeepseekV4MegaAttnBackend

        if isinstance(backend, DeepseekV4MegaAttnBackend):
            return "mega"
    except ImportError:  # pragma: no cover - module exists in 0.5.23
        pass
    if getattr(dsv4, "_is_xpu", False):
        return "xpu"
    if get_platform().is_sm120:
        return "sm120"
    if is_cp_active(forward_batch):
        return "cp"
    if getattr(backend, "hisparse_coordinator", None) is not None:
        return "hisparse"
    if getattr(backend, "is_dsv41", False):
        return "dsv41"
    if getattr(backend, "low_ratios", ()):
        return "low_ratio"
    if getattr(backend, "is_dspark_draft", False):
        return "dspark"
    spec_algo = getattr(forward_batch, "spec_algorithm", None)
    if (
        getattr(backend, "mtp_enabled", False)
        or getattr(forward_batch, "spec_info", None) is not None
        or (spec_algo is not None and not spec_algo.is_none())
    ):
        return "spec"
    if metadata.late_layer_tail is not None or getattr(backend, "tail_forward_metadata", None) is not None:
        return "late_tail"
    core = metadata.core_attn_metadata
    if getattr(core, "request_window_layout", None) is not None or (
        getattr(backend.token_to_kv_pool, "request_window", None) is not None
    ):
        return "request_window"
    # forward_batch_info.py:790-794 (bool flag + optional row tensors).
    if getattr(forward_batch, "encoder_swa_replay", False) or getattr(
        forward_batch, "encoder_swa_compress_rows", None
    ) is not None:
        return "encoder_replay"
    return None


_coeff_cache: Dict[str, Any] = {}


def _cost_coefficients():
    from sglang.srt.runtime_context import get_platform

    from sglang_mixgraph.core import split_cost_model as scm

    sm = getattr(get_platform(), "device_sm", None)
    arch = f"sm{sm}" if sm else None
    key = arch or "unknown"
    if key not in _coeff_cache:
        _coeff_cache[key] = scm.load_coefficients(arch)
    return _coeff_cache[key]


def _adaptive_split_ratios(backend, boundary: MixedBoundary, seqs, exts) -> FrozenSet[int]:
    """The compress ratios the cost model says to split this step (``should_split`` per layer
    kind). Every ratio is decided, present or not, so a layer never meets an undecided ratio."""
    from sglang_mixgraph.core import split_cost_model as scm

    topk = getattr(backend, "index_topk", scm.C4_TOPK)
    n = boundary.num_prefill_reqs + boundary.num_decode_reqs
    coeffs = _cost_coefficients()
    return frozenset(
        r
        for r in ALL_RATIOS
        if scm.should_split(
            scm.StepShape.from_lists(r, seqs[:n], exts[:n], boundary.num_decode_reqs, topk=topk),
            coeffs,
        )
    )


def _present_ratios(backend) -> FrozenSet[int]:
    """Ratios some layer of this model has: SWA-only always, c4/c128 as the backend lists."""
    present = {0}
    present.update(int(r) for r in getattr(backend, "present_ratios", ()) or ())
    return frozenset(present)


def plan_split(backend, forward_batch) -> Optional[SplitPlan]:
    """Decide the split of an eager step; store it (or None) on ``backend.forward_metadata``."""
    from sglang.srt.layers.attention.deepseek_v4_backend import DSV4Metadata

    metadata = getattr(backend, "forward_metadata", None)
    if not isinstance(metadata, DSV4Metadata):
        return None
    setattr(metadata, PLAN_ATTR, None)  # reset on every build
    num_rows = int(forward_batch.input_ids.shape[0]) if forward_batch.input_ids is not None else 0
    return _plan(backend, metadata, forward_batch, forward_batch, num_rows, replay=False)


def _plan(backend, metadata, live, target, num_rows: int, *, replay: bool) -> Optional[SplitPlan]:
    """The split of one step whose scheduler batch is ``live``; the attention will see
    ``target`` (the same batch in eager steps, the replay's static batch under a breakable
    graph) and ``num_rows`` query rows. Stores the plan on ``metadata`` and installs the
    prefill-only chunk cache there. Replays are counted apart (``replays_*``) from eager steps
    (``steps_*``)."""
    decode_tail = decode_tail_of(live)
    if not decode_tail or num_rows <= 0:
        return None
    num_decode, recognised_as = decode_tail
    _count("replays_seen" if replay else f"steps_seen.{recognised_as}")
    reason = _unsupported_reason(backend, live, metadata)
    if reason is not None:
        _fallback(reason)
        return None
    if not backend._use_sparse_prefill(target, num_qo_tokens=num_rows):
        # Dense extend (``DeepseekV4AttnBackend._use_sparse_prefill`` says no): upstream already
        # runs every row through the decode kernel; nothing to split.
        _count("steps_upstream_dense")
        return None
    exts = list(live.extend_seq_lens_cpu or [])
    seqs = [int(x) for x in live.seq_lens_cpu.tolist()]
    try:
        boundary = compute_mixed_boundary(exts, num_decode, num_rows=num_rows)
    except (ValueError, TypeError):
        _fallback("boundary")
        return None
    core = metadata.core_attn_metadata
    if core.swa_page_indices.shape[0] < boundary.decode_end:
        _fallback("rows")
        return None
    policy = str(POLICY_FLAG.get())
    split_ratios = frozenset(ALL_RATIOS)
    if policy == "adaptive":
        split_ratios = _adaptive_split_ratios(backend, boundary, seqs, exts)
        if not split_ratios & _present_ratios(backend):
            logger.debug("mixed split: adaptive policy keeps step unsplit (%s)", boundary)
            _count("replays_unsplit_adaptive" if replay else "steps_unsplit_adaptive")
            return None
        logger.debug("mixed split: adaptive splits ratios %s (%s)", sorted(split_ratios), boundary)
    full_cache = None
    if not _present_ratios(backend) <= split_ratios:
        # Some layers stay unsplit: they get exactly the chunk cache upstream would build for
        # this step (all requests, all rows). Built now, before the plan is stored, so the
        # builder hook passes the call through to upstream unchanged; and before the first
        # layer, so it reads req_to_token/full_to_swa before the eager WAR snapshot publishes
        # read-done (``EagerRunner``), as upstream's own snapshot build does.
        full_cache = backend._build_sparse_prefill_chunk_cache(target, core, num_qo_tokens=num_rows)
    plan = SplitPlan(
        boundary=boundary,
        forward_batch_ref=_weak(target),
        tail=DecodeTail(
            kernel=backend._flash_mla_with_kvcache,
            meta_factory=_sched_meta_factory,
            use_legacy=not getattr(backend, "_swa_interleaved", False),
        ),
        split_ratios=split_ratios,
        full_cache=full_cache,
        policy=policy,
    )
    setattr(metadata, PLAN_ATTR, plan)
    # The prefill-only chunk cache, over every row (decode and padding rows empty: the copy-in
    # join), installed before the first layer through the hooked builder.
    metadata.sparse_prefill_cache = backend._build_sparse_prefill_chunk_cache(
        target, core, num_qo_tokens=num_rows
    )
    _count("replays_split" if replay else "steps_split")
    _count("decode_rows_split", boundary.num_decode_reqs)
    return plan


def _sched_meta_factory():
    # A fresh FlashMLASchedMeta as upstream creates them (deepseek_v4_backend.py:210-215),
    # looked up at call time.
    from sglang.srt.layers.attention import deepseek_v4_backend as dsv4

    return dsv4._create_flashmla_metadata()


def after_init_forward_metadata(result, backend, forward_batch):
    """AFTER ``DeepseekV4AttnBackend.init_forward_metadata(self, forward_batch)``."""
    plan_split(backend, forward_batch)
    return None


def after_prepare_bcg_replay(result, backend, capture_metadata, forward_batch, *, static_forward_batch=None,
                             **kwargs):
    """AFTER ``prepare_forward_metadata_for_breakable_cuda_graph_replay``: plan the replay.

    The runner refreshes the captured metadata in place for the live batch, which is still
    labelled MIXED, while the replayed attention break sees the static EXTEND batch and the
    live rows only (``deepseek_v4_attention_with_output`` slices to
    ``global_num_token_non_padded_cpu``). The plan is made from the live batch, bound to the
    static one, and stored on the persistent captured metadata; every replay first clears
    the previous replay's plan, so a stale boundary never reaches a step that has none.
    """
    setattr(capture_metadata, PLAN_ATTR, None)
    metadata = getattr(backend, "forward_metadata", None)
    if metadata is not None and metadata is not capture_metadata:
        setattr(metadata, PLAN_ATTR, None)
    target = static_forward_batch if static_forward_batch is not None else forward_batch
    rows = getattr(target, "global_num_token_non_padded_cpu", None)
    if rows is None:
        rows = int(forward_batch.input_ids.shape[0]) if forward_batch.input_ids is not None else 0
    _plan(backend, capture_metadata, forward_batch, target, int(rows), replay=True)
    return None


# --------------------------------------------------------------------------------------------
# prefill-only chunk cache (AROUND _build_sparse_prefill_chunk_cache)
# --------------------------------------------------------------------------------------------


class _PrefillRequestsView:
    """The first P requests of a ForwardBatch, as the chunk-cache builder reads them.

    ``_build_sparse_prefill_chunk_cache`` (deepseek_v4_backend.py:2959-3030) reads
    ``seq_lens(_cpu)``, ``extend_seq_lens(_cpu)``, ``req_pool_indices`` and asks
    ``is_cp_active`` (``forward_mode``/``input_ids``); everything else is delegated.
    Tensor fields are views, host lists are new lists.
    """

    def __init__(self, forward_batch, plan: SplitPlan):
        p = plan.boundary.num_prefill_reqs
        self._fb = forward_batch
        self.seq_lens = forward_batch.seq_lens[:p]
        self.seq_lens_cpu = forward_batch.seq_lens_cpu[:p]
        self.extend_seq_lens = forward_batch.extend_seq_lens[:p]
        self.extend_seq_lens_cpu = list(forward_batch.extend_seq_lens_cpu[:p])
        self.req_pool_indices = forward_batch.req_pool_indices[:p]
        self.batch_size = p

    def __getattr__(self, name):
        return getattr(self._fb, name)


def around_build_chunk_cache(original, backend, forward_batch, core_attn_metadata, *, num_qo_tokens):
    plan = get_plan(backend)
    if plan is None or not plan.matches(forward_batch):
        return original(backend, forward_batch, core_attn_metadata, num_qo_tokens=num_qo_tokens)
    if plan.boundary.b0 == 0:
        # No prefill rows: nothing reads a chunk cache this step (the sparse AROUND never
        # calls upstream's body), so none is built.
        return None
    view = _PrefillRequestsView(forward_batch, plan)
    # Every row of the step: the decode and padding rows are rows no request of the view
    # owns, so the sparse prefill writes them as zeros (the copy-in join fills the decode rows).
    return original(backend, view, core_attn_metadata, num_qo_tokens=plan.boundary.num_rows)


# --------------------------------------------------------------------------------------------
# the split attention (AROUND _forward_prefill_sparse / _forward_prefill_sparse_q8kv8)
# --------------------------------------------------------------------------------------------


def _kernel_cache_view(buf, page_size: int, bytes_per_token: int):
    # The (pages, page_size, 1, bytes) view upstream hands FlashMLA (deepseek_v4_backend.py
    # 4181-4207); the kernel detects the cache format from the last dim.
    assert buf.ndim == 2
    return buf[:, : page_size * bytes_per_token].view(buf.shape[0], page_size, 1, bytes_per_token)


def _decode_tail(backend, plan: SplitPlan, q, layer_id, compress_ratio, pool, core, attn_sink):
    swa_cache = _kernel_cache_view(
        pool.get_swa_key_buffer_radix(layer_id),
        pool.get_swa_key_page_size(),
        pool.get_swa_key_bytes_per_token(),
    )
    extra_cache = extra_idx = extra_len = None
    if compress_ratio != 0:
        extra_cache = _kernel_cache_view(
            pool.get_extra_key_buffer(layer_id),
            pool.get_extra_key_page_size(layer_id),
            pool.get_extra_key_bytes_per_token(layer_id),
        )
        extra_idx = core.sparse_page_indices(compress_ratio)
        extra_len = core.sparse_topk_lengths(compress_ratio)
    tail = slice_decode_tail(
        plan.boundary, q, core.swa_page_indices, core.swa_topk_lengths, extra_idx, extra_len
    )
    q_tail = tail.q.squeeze(1) if tail.q.dim() == 4 else tail.q
    plan.decode_calls[compress_ratio] = plan.decode_calls.get(compress_ratio, 0) + 1
    return plan.tail.forward(
        compress_ratio,
        q_tail,
        swa_cache,
        tail.swa_indices,
        tail.swa_lengths,
        attn_sink,
        extra_k_cache=extra_cache,
        extra_indices=tail.extra_indices,
        extra_lengths=tail.extra_lengths,
        softmax_scale=backend.softmax_scale,
    )


def _abandon_plan(backend, reason_key: str) -> None:
    """A planned step meets something only visible at the first layer: upstream for the rest
    of the step. The prefill-only cache is replaced by the all-requests one when the plan
    built it, else dropped so upstream's lazy build (deepseek_v4_backend.py:4429-4434) covers
    every row again. Not expected in practice: the plan-time checks cover the configurations
    that lead here (see docs/mixed-split.md)."""
    _fallback(reason_key)
    metadata = backend.forward_metadata
    plan = getattr(metadata, PLAN_ATTR, None)
    setattr(metadata, PLAN_ATTR, None)
    metadata.sparse_prefill_cache = plan.full_cache if plan is not None else None


def _unsplit_forward(original, backend, plan: SplitPlan, forward_batch, compress_ratio, call):
    """A layer whose ratio the plan does not split: upstream's body on every row, seeing the
    all-requests chunk cache it would have built itself (swapped in for the call only; the
    prefill-only cache stays the metadata's for the split ratios)."""
    metadata = backend.forward_metadata
    split_cache = metadata.sparse_prefill_cache
    if plan.full_cache is None:
        # Defensive: every present ratio was expected to split. Build it as upstream's lazy
        # path would, through the builder with the plan detached (so the hook passes it on).
        setattr(metadata, PLAN_ATTR, None)
        try:
            plan.full_cache = backend._build_sparse_prefill_chunk_cache(
                forward_batch, call["core_attn_metadata"], num_qo_tokens=plan.boundary.num_rows
            )
        finally:
            setattr(metadata, PLAN_ATTR, plan)
    metadata.sparse_prefill_cache = plan.full_cache
    try:
        out = original(backend, **call)
    finally:
        metadata.sparse_prefill_cache = split_cache
    plan.unsplit_calls[compress_ratio] = plan.unsplit_calls.get(compress_ratio, 0) + 1
    _count(f"layers_unsplit_adaptive.c{compress_ratio}")
    return out


def _split_forward(original, backend, q, layer_id, compress_ratio, forward_batch, pool, core, attn_sink, extra_kwargs):
    plan = get_plan(backend)
    if plan is None or not plan.matches(forward_batch):
        return None
    b = plan.boundary
    if q.shape[0] != b.num_rows:
        _abandon_plan(backend, "shape")
        return None
    if q.shape[-2] not in (64, 128):
        _abandon_plan(backend, "heads")
        return None
    if compress_ratio not in ALL_RATIOS:
        _abandon_plan(backend, "low_ratio")
        return None
    call = dict(
        layer_id=layer_id,
        compress_ratio=compress_ratio,
        forward_batch=forward_batch,
        token_to_kv_pool=pool,
        core_attn_metadata=core,
        attn_sink=attn_sink,
        **extra_kwargs,
    )
    if not plan.splits(compress_ratio):
        return _unsplit_forward(original, backend, plan, forward_batch, compress_ratio, dict(call, q=q))
    o_dec = _decode_tail(backend, plan, q, layer_id, compress_ratio, pool, core, attn_sink)
    _count(f"layers_split.c{compress_ratio}")
    if not b.b0:
        return assemble_rows(b, None, o_dec, like=o_dec)
    # The sparse prefill over every row with the prefill-only workspace, then the decode rows
    # copied in (``core.mixed_boundary.copy_in_join``).
    o_all = original(backend, q=q, **call)
    if o_dec.shape[1:] != o_all.shape[1:]:
        # the Q8KV8 path returns only the active heads (``_forward_prefill_sparse_q8kv8``)
        o_dec = o_dec[:, : o_all.shape[1]]
    return copy_in_join(b, o_all, o_dec)


def around_forward_prefill_sparse(
    original, backend, q, layer_id, compress_ratio, forward_batch, token_to_kv_pool,
    core_attn_metadata, attn_sink, cos_sin_cache=None,
):
    call = dict(
        q=q, layer_id=layer_id, compress_ratio=compress_ratio, forward_batch=forward_batch,
        token_to_kv_pool=token_to_kv_pool, core_attn_metadata=core_attn_metadata,
        attn_sink=attn_sink, cos_sin_cache=cos_sin_cache,
    )
    if cos_sin_cache is not None:
        plan = get_plan(backend)
        if plan is not None and plan.matches(forward_batch):
            _abandon_plan(backend, "mega")
        return original(backend, **call)
    out = _split_forward(
        original, backend, q, layer_id, compress_ratio, forward_batch, token_to_kv_pool,
        core_attn_metadata, attn_sink, {"cos_sin_cache": None},
    )
    return original(backend, **call) if out is None else out


def around_forward_prefill_sparse_q8kv8(
    original, backend, q, layer_id, compress_ratio, forward_batch, token_to_kv_pool,
    core_attn_metadata, attn_sink,
):
    out = _split_forward(
        original, backend, q, layer_id, compress_ratio, forward_batch, token_to_kv_pool,
        core_attn_metadata, attn_sink, {},
    )
    if out is None:
        return original(
            backend, q=q, layer_id=layer_id, compress_ratio=compress_ratio,
            forward_batch=forward_batch, token_to_kv_pool=token_to_kv_pool,
            core_attn_metadata=core_attn_metadata, attn_sink=attn_sink,
        )
    return out


# --------------------------------------------------------------------------------------------
# the patch
# --------------------------------------------------------------------------------------------

_SPARSE_SIG = "self, q, layer_id, compress_ratio, forward_batch, token_to_kv_pool, core_attn_metadata, attn_sink"

HOOKS = (
    Hook(
        f"{FORWARD_BATCH}.init_new",
        "classmethod",
        "cls, batch, model_runner, *, capture_hidden_mode, return_hidden_states_before_norm, "
        "extend_position_info, spec_mrope_positions, kv_loc_plan, write_cols",
        HookType.AFTER,
        after_forward_batch_init_new,
    ),
    Hook(
        f"{EAGER_RUNNER}.load_batch",
        "method",
        "self, forward_batch, pp_proxy_tensors, **kwargs",
        HookType.AFTER,
        after_eager_load_batch,
    ),
    Hook(
        f"{BACKEND}.init_forward_metadata",
        "method",
        "self, forward_batch",
        HookType.AFTER,
        after_init_forward_metadata,
    ),
    Hook(
        f"{BACKEND}.prepare_forward_metadata_for_breakable_cuda_graph_replay",
        "method",
        "self, capture_metadata, forward_batch, *, static_forward_batch",
        HookType.AFTER,
        after_prepare_bcg_replay,
    ),
    Hook(
        f"{BACKEND}._build_sparse_prefill_chunk_cache",
        "method",
        "self, forward_batch, core_attn_metadata, *, num_qo_tokens",
        HookType.AROUND,
        around_build_chunk_cache,
    ),
    Hook(
        f"{BACKEND}._forward_prefill_sparse",
        "method",
        _SPARSE_SIG + ", cos_sin_cache",
        HookType.AROUND,
        around_forward_prefill_sparse,
    ),
    Hook(
        f"{BACKEND}._forward_prefill_sparse_q8kv8",
        "method",
        _SPARSE_SIG,
        HookType.AROUND,
        around_forward_prefill_sparse_q8kv8,
    ),
)


def explain_for_deployment(resolution) -> str:
    """For `plan`: what the split would do in a resolved deployment, from its server arguments.

    The runtime checks in `_unsupported_reason` still decide per step; this names the
    deployment-wide reasons they will hit, and the graph interaction.
    """
    from sglang.srt.arg_groups.overrides import model_config_of
    from sglang.srt.configs.model_config import is_deepseek_v4

    r = resolution.resolved
    hf = model_config_of(resolution.server_args).hf_config
    if not is_deepseek_v4(hf):
        return "not a DeepSeek-V4 model: nothing to split"
    if getattr(hf, "model_type", None) == "deepseek_v41":
        return f"falls back to upstream: {FALLBACK_REASONS['dsv41']}"
    backend = r.get("dsv4_attn_backend")
    if backend == "trtllm":
        return f"falls back to upstream: {FALLBACK_REASONS['trtllm']}"
    if backend == "flashmla_mega":
        return f"falls back to upstream: {FALLBACK_REASONS['mega']}"
    if resolution.gpu.sm_major == 12:
        return f"falls back to upstream: {FALLBACK_REASONS['sm120']}"
    if r.get("speculative_algorithm"):
        return f"falls back to upstream: {FALLBACK_REASONS['spec']}"
    if r.get("attn_cp_size", 1) > 1 or r.get("enable_prefill_cp"):
        return f"falls back to upstream: {FALLBACK_REASONS['cp']}"
    if r.get("enable_hisparse"):
        return f"falls back to upstream: {FALLBACK_REASONS['hisparse']}"
    dp_attention = r.get("attn_dp_size", 1) > 1
    if r.get("enable_mixed_chunk"):
        acts = "splits mixed steps at the prefill/decode boundary"
    elif dp_attention:
        acts = "no mixed steps (mixed chunk off); splits DP-attention decode batches relabelled to EXTEND"
    else:
        return "no mixed steps (mixed chunk off) and no DP attention: nothing to split"
    acts += f" (policy {POLICY_FLAG.get()})"
    prefill_graph = r["cuda_graph_config"]["prefill"]
    if prefill_graph["backend"] == "breakable" and prefill_graph["bs"]:
        acts += (
            f"; steps of up to {max(prefill_graph['bs'])} tokens replay breakable prefill graphs and "
            "split inside the replay's attention break, larger ones split in eager steps"
        )
    else:
        acts += "; in eager steps (no breakable prefill graph)"
    return acts


def _is_enabled() -> bool:
    POLICY_FLAG.get()  # a bad policy value stops startup even before the split flag is read
    return bool(SPLIT_FLAG.get())


PATCH = Patch(
    id=PATCH_ID,
    summary="DSV4 mixed prefill/decode split: decode rows via the fp8 decode kernel, "
    "prefill-only sparse workspace (F1, F1b, F1c)",
    flags=(SPLIT_FLAG, POLICY_FLAG),
    hooks=HOOKS,
    is_enabled=_is_enabled,
    explain=explain_for_deployment,
)
