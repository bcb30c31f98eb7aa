"""GLM-5 probe of an end-to-end phase: the DSA split op, breakable segments and guards, at runtime.

Imported at start-up of every process of a GLM-5 phase (``MIXGRAPH_E2E_STARTUP``, after the step
log); only the scheduler captures graphs and runs forwards. It counts:

* every run of the indexer's split op (``pcg_dsa_indexer_prefill_split``, which the breakable
  graph's eager break wraps): the op's body asks ``get_tc_piecewise_forward_context`` of its own
  module once per run, so that name is wrapped there; a run while the current stream is capturing
  would mean the indexer went into a graph. Per forward the step log records the runs
  (``dsa_split_ops``) and those while capturing (``dsa_split_ops_capturing``);
* per breakable capture (``BreakableCUDAGraphCapture``): its segments, how many held no graph
  node when they ended (``cudaGraphGetNodes`` on the graph under capture, through cuda-python as
  upstream's module uses it) and the split-op breaks recorded in it, one line per capture in
  ``glm5_captures_<pid>.jsonl``;
* after the first forward: doctor's upstream guards (``upstream_guards.guard_report``) run in
  this process, and checks of the live model (the split op the indexer resolves, each attention
  layer's bmm+attention composite and what gates it), in ``glm5_guards_<pid>.json``.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys

CAPTURES_PREFIX = "glm5_captures_"
GUARDS_PREFIX = "glm5_guards_"
SPLIT_MODULE = "sglang.srt.layers.attention.dsa.dsa_prefill_cuda_graph"
INDEXER_MODULE = "sglang.srt.layers.attention.dsa.dsa_indexer"
BCG_MODULE = (
    "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph"
)

_counts = {"split_ops": 0, "capturing": 0}
_captures: dict[int, dict] = {}  # id(capture) -> its counts, while it runs
_guards_written = False


def _path(prefix: str, ext: str) -> str:
    return os.path.join(os.environ["MIXGRAPH_E2E_STEP_LOG"], f"{prefix}{os.getpid()}.{ext}")


def _current_capture():
    bcg = sys.modules.get(BCG_MODULE)
    return None if bcg is None else bcg._current_capture_var.get()


def _count_split_ops(module) -> None:
    original = module.get_tc_piecewise_forward_context

    @functools.wraps(original)
    def counted(*args, **kwargs):
        import torch

        _counts["split_ops"] += 1
        if torch.cuda.is_current_stream_capturing():
            _counts["capturing"] += 1
        capture = _current_capture()
        if capture is not None:
            _captures.setdefault(id(capture), _new_capture())["indexer_breaks"] += 1
        return original(*args, **kwargs)

    module.get_tc_piecewise_forward_context = counted


def _new_capture() -> dict:
    return {"segments": 0, "with_nodes": 0, "empty": 0, "unknown": 0, "indexer_breaks": 0}


def segment_nodes(stream_handle: int) -> int | None:
    """Nodes of the graph the stream is capturing into, or None when it is not capturing."""
    from cuda.bindings import runtime as rt

    err, status, _id, graph, *_ = rt.cudaStreamGetCaptureInfo(stream_handle)
    active = rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusActive
    if err != rt.cudaError_t.cudaSuccess or status != active:
        return None
    err, _nodes, count = rt.cudaGraphGetNodes(graph, 0)
    return int(count) if err == rt.cudaError_t.cudaSuccess else None


def _count_segments(module) -> None:
    cls = module.BreakableCUDAGraphCapture
    end, exit_ = cls._end_current_segment, cls.__exit__

    # functools.wraps: the plugin's registry checks these targets' signatures through __wrapped__
    # (drop_empty_segments hooks both), so they must still read as upstream's.
    @functools.wraps(end)
    def counted_end(self, *args, **kwargs):
        facts = _captures.setdefault(id(self), _new_capture())
        try:
            nodes = segment_nodes(module.get_current_stream().cuda_stream)
        except Exception:  # the count is information: never break a capture for it
            nodes = None
        facts["segments"] += 1
        key = "unknown" if nodes is None else "empty" if nodes == 0 else "with_nodes"
        facts[key] += 1
        return end(self, *args, **kwargs)

    @functools.wraps(exit_)
    def counted_exit(self, *args, **kwargs):
        try:
            return exit_(self, *args, **kwargs)
        finally:
            facts = _captures.pop(id(self), None)
            if facts is not None:
                _append(_path(CAPTURES_PREFIX, "jsonl"), facts)

    cls._end_current_segment = counted_end
    cls.__exit__ = counted_exit


def _append(path: str, record: dict) -> None:
    try:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
    except Exception as e:  # a log line must never break a capture
        sys.stderr.write(f"[e2e glm5 probe] {e!r}\n")


def _item(name: str, ok: bool, detail: str) -> dict:
    return {"name": name, "ok": bool(ok), "detail": detail}


def live_checks(model) -> list[dict]:
    """What the guards read of upstream's source, checked on the objects this server runs."""
    from sglang.srt.models.deepseek_common.utils import FORWARD_ABSORB_CORE_ATTENTION_BACKENDS

    bcg, indexer_mod = sys.modules[BCG_MODULE], sys.modules[INDEXER_MODULE]
    split_mod = sys.modules[SPLIT_MODULE]
    marker = bcg._EagerOnGraphCallable
    live = indexer_mod.bcg_dsa_indexer_prefill_split
    out = [
        _item(
            "live_split_op",
            live is split_mod.bcg_dsa_indexer_prefill_split and isinstance(live, marker),
            f"the indexer resolves {type(live).__name__} "
            f"({'upstream' if live is split_mod.bcg_dsa_indexer_prefill_split else 'another'}'s)",
        )
    ]
    layers = [m for m in model.modules() if getattr(m, "indexer", None) is not None]
    foreign = [
        type(m.indexer).__name__
        for m in layers
        if type(m.indexer).forward_cuda is not indexer_mod.Indexer.forward_cuda
    ]
    out.append(
        _item(
            "live_indexers",
            bool(layers) and not foreign,
            f"{len(layers)} attention layers with an indexer; other forward_cuda: {foreign or 'none'}",
        )
    )
    bad = []
    for i, m in enumerate(layers):
        composite = inspect.getattr_static(type(m), "_eager_bmm_attention", None)
        why = [
            w
            for w, holds in (
                ("not an eager_on_graph break", isinstance(composite, marker)),
                ("DeepGEMM bmm", not getattr(m, "use_deep_gemm_bmm", False)),
                ("fp8 w_kc", "float8" not in str(getattr(getattr(m, "w_kc", None), "dtype", ""))),
                (
                    f"backend {getattr(m, 'current_attention_backend', None)!r}",
                    getattr(m, "current_attention_backend", None)
                    in FORWARD_ABSORB_CORE_ATTENTION_BACKENDS,
                ),
            )
            if not holds
        ]
        if why:
            bad.append(f"layer {i}: {', '.join(why)}")
    out.append(
        _item(
            "live_bmm_attention_composite",
            bool(layers) and not bad,
            "; ".join(bad)
            or f"{len(layers)} layers fuse the absorb bmm into their attention break",
        )
    )
    return out


def _write_guards(model_runner) -> None:
    import torch

    from sglang_mixgraph.resolution.upstream_guards import guard_report

    try:
        # The guards build their stand-in batches on the CPU, as doctor does, whatever default
        # device the scheduler has set.
        with torch.device("cpu"):
            guards = guard_report()
        report = {"guards": guards, "live": live_checks(model_runner.model)}
    except Exception as e:  # reported as a failed guard, never raised into the step
        report = {"guards": [], "live": [_item("probe", False, f"{type(e).__name__}: {e}")]}
    with open(_path(GUARDS_PREFIX, "json"), "w") as f:
        json.dump(report, f)


class StepProbe:
    """What e2e_step_log asks around each forward (its ``PROBES``)."""

    def begin(self, model_runner) -> None:
        self._at = dict(_counts)

    def end(self, model_runner) -> dict:
        global _guards_written
        if not _guards_written:
            _guards_written = True
            _write_guards(model_runner)
        return {
            "dsa_split_ops": _counts["split_ops"] - self._at["split_ops"],
            "dsa_split_ops_capturing": _counts["capturing"] - self._at["capturing"],
        }


def install() -> None:
    if not os.environ.get("MIXGRAPH_E2E_STEP_LOG"):
        return
    import e2e_step_log
    from engine_standins import AfterImport  # tools/gpu-upstream/engine, first on PYTHONPATH

    e2e_step_log.PROBES.append(StepProbe())
    sys.meta_path.insert(0, AfterImport(SPLIT_MODULE, _count_split_ops))
    sys.meta_path.insert(0, AfterImport(BCG_MODULE, _count_segments))
