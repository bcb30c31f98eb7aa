"""Step log of an end-to-end phase: one JSON line per ``ModelRunner.forward`` call.

Imported at start-up of every process of a phase (``MIXGRAPH_E2E_STARTUP``, see
tools/gpu-upstream/engine/sitecustomize.py); only the scheduler process runs forwards. Each
line records the forward mode *at entry* (``EagerRunner.execute`` relabels a MIXED batch to
EXTEND inside the forward, so the mode read afterwards would hide it), the batch size, the
rows, whether a CUDA graph ran (``ModelRunnerOutput.can_run_graph``) and the CUDA-synchronized
wall time. Lines go to ``$MIXGRAPH_E2E_STEP_LOG/steps_<pid>.jsonl``. Under speculative decoding
the draft model's runner forwards in the same process (EAGLE's draft extend over a MIXED batch
enters labelled MIXED too): its lines carry ``"draft": true`` (``ModelRunner.is_draft_worker``), so
the checks count each target step once. A forward run while a CUDA graph is being captured (the
draft's decode graphs call ``ModelRunner.forward`` inside the capture) passes through unlogged.

A MIXED step's line also carries the shape the adaptive split decides on (plan.py
``_adaptive_splits``), so the checks can run the cost model on it: ``seq_lens`` and
``extend_seq_lens`` per request (the host copies the ForwardBatch already holds, no device sync)
and ``num_decode``, the decode requests at the end of the batch. ``ForwardBatch`` keeps no such
count; the mixed split records its own in ``ForwardBatch.init_new`` (boundary.py), so
``num_decode`` is that record, and null in phases without the split.

Under attention data parallelism a line also names the rank (``dp_rank``, upstream's
``get_parallel().attn_dp_rank``) and every rank's tokens of the step as the scheduler synced them
(``global_tokens``, ``ForwardBatch.global_num_tokens_cpu``). A probe in ``PROBES`` adds its own
fields to each line (the GLM-5 phases' split-op counts).
"""

from __future__ import annotations

import json
import os
import sys
import time

from sglang_mixgraph.kits import gpu_machine

# Objects asked around every forward: ``begin(model_runner)`` before it, ``end(model_runner)``
# after it returns fields for the step's line (the GLM-5 probe, e2e_glm5_probe.py, adds one).
PROBES: list = []


def mixed_shape(forward_batch) -> dict:
    """The split's inputs of a MIXED step, read at entry to the forward (the eager runner relabels
    and copies the batch inside it)."""
    from sglang_mixgraph.upstream_attrs import FORWARD_BATCH_NUM_DECODE

    seq_lens = forward_batch.seq_lens_cpu
    return {
        "seq_lens": [] if seq_lens is None else [int(x) for x in seq_lens.tolist()],
        "extend_seq_lens": [int(x) for x in forward_batch.extend_seq_lens_cpu or ()],
        "num_decode": getattr(forward_batch, FORWARD_BATCH_NUM_DECODE, None),
    }


def _wrap_forward(model_runner_module) -> None:
    import torch

    cls = model_runner_module.ModelRunner
    forward = cls.forward
    path = os.path.join(os.environ["MIXGRAPH_E2E_STEP_LOG"], f"steps_{os.getpid()}.jsonl")

    def logged_forward(self, forward_batch, *args, **kwargs):
        # A forward inside a CUDA graph capture (EAGLE's draft decode graph runs ModelRunner.forward
        # while capturing) is no step, and a synchronize there would invalidate the capture.
        if torch.cuda.is_current_stream_capturing():
            return forward(self, forward_batch, *args, **kwargs)
        mode = forward_batch.forward_mode
        rows = forward_batch.input_ids.shape[0] if forward_batch.input_ids is not None else 0
        bs = int(forward_batch.batch_size)
        try:
            shape = mixed_shape(forward_batch) if getattr(mode, "name", "") == "MIXED" else {}
            shape.update(gpu_machine.dp_step_fields(forward_batch))
        except Exception as e:  # a log line must never break a step; the checks see no shape
            shape = {"shape_error": repr(e)}
        for probe in PROBES:
            probe.begin(self)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = forward(self, forward_batch, *args, **kwargs)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        for probe in PROBES:
            shape.update(probe.end(self))
        try:
            rec = {
                "mode": getattr(mode, "name", str(mode)),
                "bs": bs,
                "rows": int(rows),
                "graph": bool(getattr(out, "can_run_graph", False)),
                "ms": round(ms, 3),
                **({"draft": True} if getattr(self, "is_draft_worker", False) else {}),
                # a batch with a return_logprob request (SGLang mixes no prefill into it)
                **({"logprob": True} if getattr(forward_batch, "return_logprob", False) else {}),
                **shape,
            }
            with open(path, "a") as f:
                f.write(json.dumps(rec) + "\n")
        except Exception as e:  # a log line must never break a step
            sys.stderr.write(f"[e2e step log] {e!r}\n")
        return out

    cls.forward = logged_forward


def install() -> None:
    if not os.environ.get("MIXGRAPH_E2E_STEP_LOG"):
        return
    from engine_standins import AfterImport  # tools/gpu-upstream/engine, first on PYTHONPATH

    sys.meta_path.insert(0, AfterImport("sglang.srt.model_executor.model_runner", _wrap_forward))
