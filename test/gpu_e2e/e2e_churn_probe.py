"""Allocator churn of an end-to-end phase (``run_e2e.py --churn``): after every forward.

Imported at start-up of every process of a phase (``MIXGRAPH_E2E_STARTUP``, after the step log);
only the scheduler runs forwards. After each forward it frees what it kept from the last one,
then allocates a seeded spread of blocks (64 KiB to 64 MiB, 512 MiB a step) from the ordinary
allocator, fills every byte with 0xFF (NaN in bf16 and fp32, -1 as an index) and keeps half of
them until the next step; the other half goes straight back to the allocator's cache still
filled. A breakable graph whose replay reads a block it does not own (a break input kept only
as a weak view: docs/break-inputs.md) then reads NaN or a -1 index, and the phase's tokens
differ from the eager baseline's or it faults. Each step's line records ``churn_mib``.
"""

from __future__ import annotations

import os
import random

STEP_BYTES = 512 << 20
SIZES = (64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)


class Churn:
    """What e2e_step_log asks around each forward (its ``PROBES``)."""

    def __init__(self, seed: int = 0, device: str = "cuda", step_bytes: int = STEP_BYTES):
        self._rng = random.Random(seed)
        self._device, self._step_bytes = device, step_bytes
        self._kept: list = []

    def begin(self, model_runner) -> None:
        pass

    def end(self, model_runner) -> dict:
        import torch

        self._kept = []  # last step's blocks: free for the next forward to take
        total, blocks = 0, []
        while total < self._step_bytes:
            n = self._rng.choice(SIZES)
            block = torch.empty(n, dtype=torch.uint8, device=self._device)
            block.fill_(0xFF)
            blocks.append(block)
            total += n
        self._kept = blocks[::2]
        return {"churn_mib": round(total / 2**20, 1)}


def install() -> None:
    if not (os.environ.get("MIXGRAPH_E2E_STEP_LOG") and os.environ.get("MIXGRAPH_E2E_CHURN")):
        return
    import e2e_step_log

    e2e_step_log.PROBES.append(Churn(seed=int(os.environ["MIXGRAPH_E2E_CHURN"])))
