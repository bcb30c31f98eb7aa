"""SGLANG_MIXGRAPH_BCG_HOLD_BREAK_INPUTS=1: a breakable graph's break inputs that live outside
its memory pool are held for the graph's life.

SGLang 0.5.23's ``eager_on_graph`` (sglang.srt.model_executor.runner_backend_utils.
breakable_cuda_graph) keeps every tensor an eager break received at capture only as a weak
view (``_weak_ref_if_tensor``) and replays the break on those views. For a tensor a captured
segment wrote into the graph pool that is sound: each replay writes it again before the break
reads it. For a tensor from anywhere else (a per-bucket buffer made outside the capture, a
break's side output) the view outlives its owner: the allocator hands the block to whatever
asks next and the replay reads it (upstream issue 37606; PR 37448 holds every input, which
also pins every layer's pool intermediates). Here, during a capture, an input whose bytes are
not in the capture's pool (torch's allocator snapshot of that pool) is kept as the tensor
itself; pool inputs stay weak views, as upstream makes them, so capture memory does not grow.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import logging
import textwrap
import weakref
from contextvars import ContextVar

from sglang.srt.plugins.hook_registry import HookType

from sglang_mixgraph import counters
from sglang_mixgraph.core.address_ranges import AddressRanges
from sglang_mixgraph.fallback import fallback_once
from sglang_mixgraph.flags import bool_flag
from sglang_mixgraph.registry import DoctorLine, Hook, Patch

logger = logging.getLogger("sglang_mixgraph")

PATCH_ID = "hold_break_inputs"
BCG_MODULE = (
    "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph"
)
WEAK_REF = f"{BCG_MODULE}._weak_ref_if_tensor"

HOLD_FLAG = bool_flag(
    "SGLANG_MIXGRAPH_BCG_HOLD_BREAK_INPUTS",
    False,
    "Breakable CUDA graphs: keep each eager break's inputs that are not in the graph memory "
    "pool alive for the graph's life (SGLang keeps only weak views of them).",
)


@functools.cache
def _bcg():
    return importlib.import_module(BCG_MODULE)


def upstream_keeps_weak_views() -> bool | None:
    """Does the installed ``eager_on_graph`` store its captured args through
    ``_weak_ref_if_tensor``? None when its source cannot be read."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(_bcg().eager_on_graph)))
    except (OSError, TypeError, SyntaxError, ImportError, AttributeError):
        return None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        names = {t.id for t in node.targets if isinstance(t, ast.Name)}
        if names & {"captured_args", "captured_kwargs"}:
            calls = {
                n.func.id
                for n in ast.walk(node.value)
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            }
            if "_weak_ref_if_tensor" in calls:
                return True
    return False


def exposure() -> str:
    """One line for ``doctor``: how the installed SGLang holds break inputs."""
    weak = upstream_keeps_weak_views()
    if weak is None:
        return "unknown: eager_on_graph's source cannot be read"
    if not weak:
        return "held by SGLang itself (eager_on_graph stores them without weak views)"
    return (
        "weak views (upstream issue 37606): a break input from outside the graph pool can be "
        f"reused by the allocator; {HOLD_FLAG.name}=1 holds those"
    )


# The pool ranges of the capture in progress: (pool id, ranges), refreshed when an input
# falls outside them (the pool grows during a capture).
_ranges: ContextVar[tuple[object, AddressRanges] | None] = ContextVar(
    "hold_break_inputs_pool_ranges", default=None
)


def pool_segments(pool) -> list[tuple[int, int]]:
    """``(address, size)`` of every allocator segment of graph memory pool ``pool``."""
    import torch

    try:
        segments = torch.cuda.memory_snapshot(mempool_id=pool, include_traces=False)
    except TypeError:  # an older torch: the whole snapshot, filtered here
        segments = [
            s for s in torch.cuda.memory_snapshot() if tuple(s["segment_pool_id"]) == tuple(pool)
        ]
    return [(int(s["address"]), int(s["total_size"])) for s in segments]


def in_pool(pool, address: int, nbytes: int) -> bool:
    """Whether ``[address, address + nbytes)`` is memory of ``pool``; reads the allocator again
    before answering no, so a segment the capture added since the last read counts."""
    cached = _ranges.get()
    if cached is not None and cached[0] == pool and cached[1].holds(address, nbytes):
        return True
    ranges = AddressRanges(pool_segments(pool))
    _ranges.set((pool, ranges))
    return ranges.holds(address, nbytes)


# Storages a snapshot found outside a pool, by (pool, address, bytes), each mapped weakly to
# the tensor that owns it (an entry goes when that tensor does): while it lives its block
# cannot become pool memory, so the answer stands without another snapshot (a static buffer
# such as the runner's positions reaches the break of every layer in every bucket).
_outside: ContextVar[weakref.WeakValueDictionary | None] = ContextVar(
    "hold_break_inputs_outside", default=None
)


def _owner(x):
    return x if x._base is None else x._base


def known_outside(pool, address: int, nbytes: int) -> bool:
    """Whether a storage at ``address`` of ``nbytes`` was found outside ``pool`` and the tensor
    then checked is still alive."""
    seen = _outside.get()
    return seen is not None and (pool, address, nbytes) in seen


def remember_outside(pool, address: int, nbytes: int, x) -> None:
    seen = _outside.get()
    if seen is None:
        seen = weakref.WeakValueDictionary()
        _outside.set(seen)
    seen[(pool, address, nbytes)] = _owner(x)


def _device_tensor(x) -> bool:
    import torch

    return torch.is_tensor(x) and x.numel() > 0 and x.device.type != "cpu"


def around_weak_ref_if_tensor(original, x):
    """During a capture, a device tensor outside the capture's pool is returned itself (held by
    the break's replay closure); everything else gets upstream's weak view."""
    if not HOLD_FLAG.get() or not _device_tensor(x):
        return original(x)
    capture = _bcg()._current_capture_var.get()
    if capture is None:
        return original(x)
    pool = getattr(capture, "_pool", None)
    if not isinstance(pool, tuple) or tuple(pool) == (0, 0):
        fallback_once(PATCH_ID, "capture without a shared memory pool handle", key="no pool")
        return original(x)
    try:  # a tensor without a plain storage (sparse, nested) raises here
        storage = x.untyped_storage()
        address, nbytes = storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError) as e:
        fallback_once(PATCH_ID, f"a break input has no readable storage ({e})", key="no storage")
        return original(x)
    if not known_outside(pool, address, nbytes):
        try:
            inside = in_pool(pool, address, nbytes)
        except (RuntimeError, KeyError, TypeError) as e:
            fallback_once(PATCH_ID, f"graph pool segments unreadable ({e})", key="no snapshot")
            return original(x)
        if inside:
            counters.count(PATCH_ID, "inputs_weak_in_pool")
            return original(x)
        remember_outside(pool, address, nbytes, x)
    counters.count(PATCH_ID, "inputs_held")
    return x


def _enabled() -> bool:
    # Retired where SGLang holds the inputs itself (its code read, not its version).
    return bool(HOLD_FLAG.get()) and upstream_keeps_weak_views() is not False


# What the patch holds in the two models it is built for (docs/break-inputs.md): tensors that
# live anyway, so holding them adds no memory. Counts and GLM-5's capture memory measured end
# to end on one H100 (docs/results/bcg_break_inputs_h200.md); which tensors, read from the breaks.
HELD_DSV4 = (
    "each layer's attention sink (a model parameter) per captured bucket, alive anyway: no "
    "memory added (measured end to end on a tiny DeepSeek-V4: 120 inputs held, 360 pool inputs "
    "left weak, tokens equal to eager under allocator churn)"
)
HELD_GLM5 = (
    "the indexer break's two static inputs per layer and captured bucket (the runner's "
    "positions and the static top-k buffer), alive anyway: no memory added (measured end to "
    "end on a tiny GLM-5: 240 inputs held in 4 layers x 30 buckets, 1320 pool inputs left "
    "weak, tokens equal to eager under allocator churn; the 30 buckets' capture took 0.27 GB "
    "with and without the held inputs)"
)


def explain_for_deployment(plan) -> str:
    from sglang_mixgraph.planner.graph_plan import breakable_phases

    phases = breakable_phases(plan)
    if not phases:
        return "no breakable CUDA graph in this deployment: nothing to hold"
    if plan.facts.deepseek_v4:
        held = HELD_DSV4
    elif plan.facts.glm5:
        held = HELD_GLM5
    else:
        held = "whatever this model's breaks take from outside the pool, kept until the graphs go"
    return (
        f"{' and '.join(phases)} graphs are breakable: break inputs outside the graph pool are "
        f"held for the graph's life; here that is {held}. Pool inputs stay weak views, so the "
        "capture estimate is unchanged"
    )


PATCH = Patch(
    id=PATCH_ID,
    summary="breakable CUDA graphs hold break inputs from outside the graph pool",
    flags=(HOLD_FLAG,),
    hooks=(Hook(WEAK_REF, "function", "x", HookType.AROUND, around_weak_ref_if_tensor),),
    is_enabled=_enabled,
    explain=explain_for_deployment,
    doctor_line=DoctorLine("break_inputs", "Break inputs of breakable CUDA graphs", exposure),
    why=(
        "SGLang 0.5.23's eager_on_graph keeps every graph break's captured inputs as weak views; "
        "an input whose owner is gone can be handed to another allocation and a replay then "
        "reads that memory (upstream issue 37606)"
    ),
    how=(
        "during a capture, each break input is looked up in the allocator's segments of the "
        "capture's memory pool; one outside the pool is stored as the tensor itself, so the "
        "replay closure owns it, and its storage is remembered while its owner lives (one "
        "snapshot for a static buffer every layer's break takes); pool inputs, which the "
        "captured segments rewrite before every replay of the break, stay weak views and "
        "capture memory does not grow"
    ),
    upstream_pr=(
        "SGLang PR #37448 (open) stores every break input strongly, as before PR #22218 made "
        "them weak views"
    ),
    retired_by=(
        "eager_on_graph storing captured_args/captured_kwargs without _weak_ref_if_tensor; the "
        "patch reads that code at load and stays off where it does"
    ),
    docs_page="docs/break-inputs.md",
    reads=((f"{BCG_MODULE}._current_capture_var", ContextVar),),
)
