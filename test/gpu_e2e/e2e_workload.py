"""The fixed-seed workload of every phase: three segments that make the scheduler build MIXED steps.

* ``batch``: six prompts at once (20 to 900 tokens); short ones decode while the long ones'
  chunks are still being prefilled.
* ``staggered``: three requests stream; once each is decoding, three long prompts (longer than
  the chunk) arrive, so their chunks run as MIXED steps with those decode rows.
* ``long``: sixteen 16k-token prompts at once, each decoding from the end of its prefill while
  the later ones are prefilled (MIXED steps with 1..15 decode rows at contexts far beyond the
  SWA window, the c128 page and the indexer's top-k); their lengths of generation are staggered
  so all sixteen are still decoding when a late prompt arrives, whose chunks carry 16 decode rows
  at 16k: the shape where the H200 cost model has ``adaptive`` split the c4 layers (since its
  refit from in-server timings, 16 rows at 12k stay unsplit).

Pure Python, no sglang: the CPU tests check the properties above.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import List, Tuple

VOCAB = 4096
LONG_PROMPT = 16384
LONG_REQUESTS = 16
LATE_PROMPT = 1024
# Decode tokens the longest-running request still has after the last long prefill: the late
# prompt must arrive (streamed first token -> new request) within these steps.
LATE_MARGIN_STEPS = 96


@dataclass(frozen=True)
class Request:
    rid: str
    prompt: Tuple[int, ...]
    max_new: int


@dataclass(frozen=True)
class Segment:
    """``first`` are sent together (streamed when ``then`` is not empty); ``then`` are sent once
    every request of ``first`` has produced its first token."""

    name: str
    first: Tuple[Request, ...]
    then: Tuple[Request, ...] = ()


def _prompt(rng: random.Random, n: int) -> Tuple[int, ...]:
    # Token ids away from the special ids at both ends of the vocabulary.
    return tuple(rng.randrange(10, VOCAB - 10) for _ in range(n))


WORKLOADS = ("full", "short")  # short: without the long segment (a quick run)


def build(seed: int = 0, chunk: int = 256, workload: str = "full") -> List[Segment]:
    if workload not in WORKLOADS:
        raise ValueError(f"workload must be one of {WORKLOADS}, got {workload!r}")
    rng = random.Random(seed)

    def reqs(prefix: str, lens, max_new) -> Tuple[Request, ...]:
        news = max_new if isinstance(max_new, (list, tuple)) else [max_new] * len(lens)
        return tuple(
            Request(f"{prefix}{i}", _prompt(rng, n), m)
            for i, (n, m) in enumerate(zip(lens, news, strict=False))
        )

    chunks_per_long = -(-LONG_PROMPT // chunk)
    # Request i ends its prefill after (i + 1) long prefills; give it enough tokens to decode
    # through the remaining ones plus the margin.
    long_new = [
        chunks_per_long * (LONG_REQUESTS - i) + LATE_MARGIN_STEPS for i in range(LONG_REQUESTS)
    ]
    segments = [
        Segment("batch", reqs("batch", [600, 40, 300, 20, 900, 120], 24)),
        Segment(
            "staggered", reqs("stag", [150, 40, 300], 64), reqs("stag_late", [900, 520, 1100], 32)
        ),
        Segment(
            "long",
            reqs("long", [LONG_PROMPT] * LONG_REQUESTS, long_new),
            reqs("long_late", [LATE_PROMPT], 16),
        ),
    ]
    return segments if workload == "full" else segments[:2]


def all_requests(segments: List[Segment]) -> List[Request]:
    return [r for s in segments for r in s.first + s.then]


def peak_tokens(segments: List[Segment]) -> int:
    """The most KV tokens one segment holds at once (segments run one after another)."""
    return max(sum(len(r.prompt) + r.max_new for r in s.first + s.then) for s in segments)
