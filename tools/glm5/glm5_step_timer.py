"""Step timer of the GLM-5 step timing's Engine processes (tools/glm5/glm5_step.py).

Imported at start-up of every process of an arm's Engine (``MIXGRAPH_E2E_STARTUP``, read by
tools/gpu-upstream/engine/sitecustomize.py, with this folder on ``PYTHONPATH``); only the
scheduler runs forwards. Each ``ModelRunner.forward`` call appends one JSON line
``{"mode", "rows", "graph", "ms", "host_ms"}`` to ``$GLM5_STEP_LOG/steps_<pid>.jsonl``: the
forward mode at entry, the batch's tokens, whether a CUDA graph ran (``can_run_graph``), the wall
time between two ``torch.cuda.synchronize`` calls around it (the step's GPU and host work
together) and the host's part, the time until the call returned (what a slower process shows).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time

LOG_ENV = "GLM5_STEP_LOG"
MODULE = "sglang.srt.model_executor.model_runner"


def _wrap_forward(model_runner_module) -> None:
    import torch

    cls = model_runner_module.ModelRunner
    forward = cls.forward
    path = os.path.join(os.environ[LOG_ENV], f"steps_{os.getpid()}.jsonl")

    @functools.wraps(forward)
    def timed_forward(self, forward_batch, *args, **kwargs):
        mode = getattr(forward_batch.forward_mode, "name", str(forward_batch.forward_mode))
        rows = 0 if forward_batch.input_ids is None else int(forward_batch.input_ids.shape[0])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = forward(self, forward_batch, *args, **kwargs)
        host_ms = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        graph = bool(getattr(out, "can_run_graph", False))
        try:
            with open(path, "a") as f:
                f.write(
                    json.dumps(
                        {"mode": mode, "rows": rows, "graph": graph, "ms": ms, "host_ms": host_ms}
                    )
                    + "\n"
                )
        except OSError as e:  # a timing line must never break a step
            sys.stderr.write(f"[glm5 step timer] {e!r}\n")
        return out

    cls.forward = timed_forward


def install() -> None:
    if not os.environ.get(LOG_ENV):
        return
    from engine_standins import AfterImport  # tools/gpu-upstream/engine, first on PYTHONPATH

    sys.meta_path.insert(0, AfterImport(MODULE, _wrap_forward))
