"""A breakable CUDA graph captured as upstream's breakable prefill runner captures one.

``capture(run, registry)`` runs ``run`` once on a side stream (the warm-up upstream's runner does
before it captures), then captures it through upstream's own ``BreakableCUDAGraphCapture`` into
a ``BreakableCUDAGraph`` on that stream, with ``registry`` (upstream's CUDA-graph dedup registry,
or None) deciding how the segments are stored. ``run``'s eager breaks are whatever it calls
through upstream's ``eager_on_graph`` / ``break_graph``. Used by the GPU tests of
``drop_empty_segments`` and by ``benchmark/empty_segments.py``, so both time and check the same
captures. Needs a CUDA GPU and sglang importable.
"""

from __future__ import annotations


def capture(run, registry):
    """Warm up and capture ``run`` as upstream's breakable runner does; (graph, static output)."""
    import torch
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import (
        breakable_cuda_graph as bcg,
    )

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = bcg.BreakableCUDAGraph(registry)
    with bcg.BreakableCUDAGraphCapture(graph, pool=torch.cuda.graph_pool_handle(), stream=stream):
        out = run()
    torch.cuda.synchronize()
    return graph, out
