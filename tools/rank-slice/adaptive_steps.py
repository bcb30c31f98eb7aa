"""Which served steps `adaptive` would split on the rank slice: the step sequence of a burst,
priced by the split's own decision.

A burst of N prompts of L tokens arrives at once at one rank (chunk C = 2816 unless `--chunk`
says otherwise, KV page 256, at most R = 256 running, FCFS, no prefix hits) and each request decodes O tokens. The steps follow
SGLang 0.5.23's scheduler as `docs/results/rank_slice_serving_h200.md` ("The padding question")
reads it: the running decode rows come off the chunk budget first
(`schedule_policy.PrefillAdder.__init__`); a continuing chunk takes the rest of the budget
unfloored, or its whole remainder charged page-ceiled (`PrefillAdder.add_chunked_req`,
`_update_prefill_budget`); new requests are admitted whole when their page-ceiled length fits,
else their chunk is floored to a page (`_select_prefill_admission`), at most R - running of them
(`Scheduler.get_num_allocatable_reqs`). Each MIXED step is then priced by the split's decision,
`split_cost_model.decide_step` with the shipped H200 coefficients and DSV4-Pro's layer mix,
in the eager regime (`split-eager-adaptive`) and the replay regime (`bcg-split-rd-adaptive`).
A model of the scheduler, not the scheduler: the served run's counters are the measurement.

    python3 tools/rank-slice/adaptive_steps.py                 # the table for the usual shapes
    python3 tools/rank-slice/adaptive_steps.py 96x8192x64      # N x L x O [x shared prefix]
    python3 tools/rank-slice/adaptive_steps.py --chunk 1280 272x2048x200
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from slice_arms import CHUNK, PAGE, RUNNING

from sglang_mixgraph.core import split_cost_model as scm
from sglang_mixgraph.core.mixed_step_counts import StepCounts

CONFIG = Path(scm.__file__).resolve().parents[1] / "data" / "dsv4_pro" / "config.json"


def ceil_page(n: int) -> int:
    return -(-n // PAGE) * PAGE


@dataclass
class _Req:
    prompt: int
    done: int = 0  # prompt tokens prefilled
    out: int = 0  # tokens generated


@dataclass
class MixedStep:
    """One MIXED step: prefill requests first, as SGLang batches them."""

    seq_lens: list[int]  # every request's context after the step's tokens
    extend_lens: list[int]  # prefill chunks, then 1 per decode row
    num_decode: int = 0
    rows: int = field(init=False)

    def __post_init__(self) -> None:
        self.rows = sum(self.extend_lens)


def served_steps(
    requests: int, input_len: int, output_len: int, shared_prefix: int = 0, chunk: int = CHUNK
) -> list[MixedStep]:
    """The MIXED steps of the burst, in order (prefill-only and decode-only steps left out).
    `shared_prefix`: the prompts' first tokens are common; every request after the first finds
    them in the radix cache (the first one's chunks hold the budget until it has prefilled
    them), so it prefills only the rest, its context still the whole prompt. `chunk`: the
    chunked prefill per rank, decode rows included."""
    waiting = [_Req(input_len, done=shared_prefix if i else 0) for i in range(requests)]
    chunked: _Req | None = None
    running: list[_Req] = []
    steps = []
    while waiting or chunked or running:
        d = len(running)
        budget = chunk - d
        batch: list[tuple[_Req, int]] = []
        if chunked is not None:
            rest = chunked.prompt - chunked.done
            take = rest if rest <= budget else budget
            batch.append((chunked, take))
            budget -= ceil_page(take) if take == rest else take
            chunked = None if take == rest else chunked
        while waiting and chunked is None and budget >= PAGE and d + len(batch) < RUNNING:
            r = waiting[0]
            rest = r.prompt - r.done
            take = rest if ceil_page(rest) <= budget else budget // PAGE * PAGE
            batch.append((waiting.pop(0), take))
            budget -= ceil_page(take)
            if take < rest:
                chunked = r
        if batch and running:
            steps.append(
                MixedStep(
                    seq_lens=[r.done + t for r, t in batch] + [r.prompt + r.out for r in running],
                    extend_lens=[t for _, t in batch] + [1] * d,
                    num_decode=d,
                )
            )
        for r in running:
            r.out += 1
        for r, t in batch:
            r.done += t
            if r.done == r.prompt:
                r.out = 1  # the prefill step samples the first token
                running.append(r)
        running = [r for r in running if r.out < output_len]
    return steps


def layer_mix() -> dict[int, int]:
    cfg = json.loads(CONFIG.read_text())
    return dict(Counter(cfg["compress_ratios"][: cfg["num_hidden_layers"]]))


def split_share(steps: list[MixedStep], regime: str, coeffs=None) -> tuple[int, int]:
    """(steps `adaptive` splits, MIXED steps) in `regime` (split_cost_model.EAGER / REPLAY)."""
    coeffs = coeffs or scm.load_coefficients("sm90")
    mix = layer_mix()
    ratios = tuple(r for r in mix if r)
    split = sum(
        scm.decide_step(
            StepCounts.from_lists(s.seq_lens, s.extend_lens, s.num_decode, ratios=ratios),
            mix,
            coeffs,
            regime=regime,
        )
        for s in steps
    )
    return split, len(steps)


# N x L x O, or N x L x O x S with S shared prefix tokens
SHAPES = ("96x2048x256", "256x2048x256", "96x8192x256", "48x16384x256", "96x16384x64x15872")


def main(argv: list[str]) -> int:
    chunk = CHUNK
    if argv[:1] == ["--chunk"]:
        chunk, argv = int(argv[1]), argv[2:]
    shapes = argv or list(SHAPES)
    print(f"chunk {chunk}")
    print("shape (N x L x O [x S]) | MIXED steps | prefill tokens | eager splits | replay splits")
    for shape in shapes:
        n, length, out, *shared = (int(x) for x in shape.split("x"))
        steps = served_steps(n, length, out, *shared, chunk=chunk)
        eager = split_share(steps, scm.EAGER)
        replay = split_share(steps, scm.REPLAY)
        tokens = sum(sum(s.extend_lens) - s.num_decode for s in steps)
        print(f"{shape} | {len(steps)} | {tokens} | {eager[0]} | {replay[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
