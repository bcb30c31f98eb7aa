"""The boundary workload under speculative decoding: a decode row of a MIXED step at every length.

Under EAGLE a MIXED step gives a decode row one token, but a verify step between two MIXED steps
moves it by 1 to 3 unseen (from c to c + 2 .. c + 4), so the streamed boundary workload stepped
over 128, 129, 256 and 257 on the H100. Here every request is sent at once, rows first, the late
prompt last: SGLang admits in arrival order (``fcfs``), runs a waiting prefill before any decode
(``Scheduler.get_next_batch_to_run``) and mixes the decode rows into it, one chunk token each
(``get_new_batch_prefill``), so every step from a row's first token to the late prompt's last
chunk is MIXED (``mixed_schedule`` models it) whatever the acceptance. ``ROWS_PER_BOUNDARY`` rows
``ROW_SPACING`` apart around each boundary reach its lengths if the real schedule moves a row by a
margin or one verify step falls among the MIXED steps (a token apart they would not). The window
pool at the full pool's size (``ENGINE_OVERRIDES``): at DeepSeek-V4's 0.1 the H100 run's chunks
stalled for 84 verify steps until rows finished. Pure Python: the CPU tests check all this.
"""

from __future__ import annotations

import random

import e2e_workload as W

ROWS_PER_BOUNDARY = 3
ROW_SPACING = 2  # tokens between a boundary's rows: they span 5 lengths
ROW_MARGIN = 48  # tokens each row still decodes after the late prompt's last chunk
# Engine arguments of this workload: the window pool as large as the full one.
ENGINE_OVERRIDES = {"swa_full_tokens_ratio": 1.0}
# Rows first (the longest first, so that every row decodes through the late prompt's chunks), then
# the late prompt of BOUNDARY_CHUNKS chunks.
ORDER = ("c4_topk", "page", "swa")


def mixed_schedule(prompts: list[int], chunk: int) -> list[dict[int, int]]:
    """Per step of upstream's schedule of these prompts, all waiting at the start in this order:
    ``{request index: context}`` of its decode rows (empty for a prefill alone). A step's chunk
    is ``chunk`` less one token per decode row; a request in prefill continues first, then the
    next ones are admitted while tokens remain (the last one cut, to continue next step); a
    request whose prompt completes decodes from the next step at context prompt + 1."""
    remaining = list(prompts)
    waiting = list(range(len(prompts)))
    decoding: dict[int, int] = {}
    steps = []
    while waiting:
        budget = chunk - len(decoding)
        if budget <= 0:
            raise ValueError(f"{len(decoding)} decode rows leave no chunk of {chunk}")
        done = []
        while waiting and budget > 0:
            i = waiting[0]
            take = min(remaining[i], budget)
            remaining[i] -= take
            budget -= take
            if remaining[i]:
                break
            done.append(waiting.pop(0))
        steps.append(dict(decoding))
        decoding = {i: n + 1 for i, n in decoding.items()}
        decoding.update({i: prompts[i] + 1 for i in done})
    return steps


def _first_step(steps: list[dict[int, int]], i: int) -> int:
    return next(t for t, rows in enumerate(steps) if i in rows)


def _row_prompts(chunk: int, late: int) -> list[int]:
    """Row prompts such that, in the modelled schedule, the rows of each boundary b are at
    b + 2, b, b - 2 (``ROW_SPACING``) at the middle step of the MIXED steps all of them decode in.
    A prompt moves the schedule only where it moves a chunk's end: a few rounds settle it."""
    n = ROWS_PER_BOUNDARY
    bounds = [W.BOUNDARY_CROSSINGS[name][1] for name in ORDER for _ in range(n)]
    at_mid = [b + ROW_SPACING * ((n - 1) // 2 - j % n) for j, b in enumerate(bounds)]
    prompts = [c - 1 for c in at_mid]
    for _ in range(8):
        steps = mixed_schedule([*prompts, late], chunk)
        starts = [_first_step(steps, i) for i in range(len(prompts))]
        new = []
        for g in range(len(ORDER)):
            group = range(g * n, (g + 1) * n)
            mid = (max(starts[i] for i in group) + len(steps) - 1) // 2
            new += [at_mid[i] - 1 - (mid - starts[i]) for i in group]
        if new == prompts:
            return prompts
        prompts = new
    raise ValueError(f"row prompts did not settle at chunk {chunk}: {prompts}")


def segments(rng: random.Random, chunk: int) -> list[W.Segment]:
    """One segment, every request in ``first`` (sent together): the rows, then the late prompt."""
    late_len = W.BOUNDARY_CHUNKS * chunk - chunk // 2
    prompts = _row_prompts(chunk, late_len)
    steps = mixed_schedule([*prompts, late_len], chunk)
    rows = []
    for i, n in enumerate(prompts):
        name = ORDER[i // ROWS_PER_BOUNDARY]
        decoding = len(steps) - _first_step(steps, i)
        rid = f"bnd_{name}_{i % ROWS_PER_BOUNDARY}"
        rows.append(W.Request(rid, W._prompt(rng, n), decoding + ROW_MARGIN))
    late = W.Request("bnd_late", W._prompt(rng, late_len), 8)
    return [W.Segment(W.BOUNDARY, (*rows, late))]
