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

The ``pressure`` workload instead runs against a KV pool of ``PRESSURE_POOL_TOKENS``
(``engine_overrides``), far less than it needs, and with SGLang's admission clip small
(``engine_env``), so that the scheduler evicts cached prefixes and retracts decoding requests,
while the client aborts some requests mid-generation:

* ``warm``: four prompts that finish at once and leave their KV in the radix cache;
* ``pressure``: twelve streamed requests (three reuse the first 512 tokens of a warm prompt),
  three of them aborted by the client once they have streamed ``ABORT_AFTER`` tokens; once every
  one of them has produced a token, two long prompts arrive, whose chunks run as MIXED steps.

The ``dp`` workload is for attention data parallelism over ``dp`` ranks (``--dp N``): the
``batch`` and ``staggered`` segments (SGLang spreads them round robin) and two segments that pin
requests to ranks (``routed_dp_rank``):

* ``dp_idle``: one prompt of three chunks on rank 0, so every other rank runs IDLE steps;
* ``dp_mixed``: one request decoding on every rank, then a long prompt on rank 0 alone: rank 0
  runs MIXED steps while the others have only decode rows, which SGLang relabels to EXTEND under
  the breakable prefill graph (``convert_decode_to_extend``) to run one prefill graph on all ranks.

Under speculative decoding (``spec``) the full, short and boundary workloads end with the
``logprob`` segment: one streamed request with ``return_logprob``; once it decodes, a prompt of
three chunks arrives. SGLang mixes no prefill into a batch that returns logprobs
(``Scheduler.get_new_batch_prefill``: not with ``new_batch.return_logprob or
running_batch.return_logprob``), so those chunks run as EXTEND steps, none MIXED.

The ``boundary`` workload (``BOUNDARY``) puts decode rows of MIXED steps at the context lengths
where the decode tail's inputs change shape: the SWA window (127/128/129), the KV page
(255/256/257) and the c4 indexer's top-k threshold (2047/2048/2049, where the compressed keys
outgrow the top-k); multiples of 4 and 128 fall on the way. For each boundary two requests end
their prompt ``BOUNDARY_OFFSETS`` tokens below it and decode; once each has produced a token, a
late prompt of ``BOUNDARY_CHUNKS`` chunks arrives, whose chunks run as MIXED steps with those
rows, each step one token further. The offsets leave room for the tokens a row decodes before
the late prompt's first chunk. Under speculative decoding (``spec``) the boundary workload is
e2e_spec_boundary.py's instead: every request sent at once, three rows per boundary.

Pure Python, no sglang: the CPU tests check the properties above.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

VOCAB = 4096
LONG_PROMPT = 16384
LONG_REQUESTS = 16
LATE_PROMPT = 1024
# Decode tokens the longest-running request still has after the last long prefill: the late
# prompt must arrive (streamed first token -> new request) within these steps.
LATE_MARGIN_STEPS = 96


# The pressure workload: a pool of 32 pages of 256 tokens, against about twice that in demand.
PRESSURE_POOL_TOKENS = 8192
PRESSURE_MAX_NEW = 512
# The sliding-window pool as a share of the full one. At DeepSeek-V4's default share the window
# pool held one request: on the H200 every request ran alone (no MIXED step) and SGLang aborted
# it for OOM (`retract_decode`: "aborted last request") instead of retracting. With the whole
# share the full pool is what runs out, and several requests decode when it does.
PRESSURE_SWA_RATIO = 1.0
ABORT_AFTER = 24  # tokens an aborted request streams before the client aborts it
# SGLang admits a request only with room for its prompt and up to this many of its new tokens,
# and counts each running request's remaining ones up to it too (schedule_policy's
# CLIP_MAX_NEW_TOKENS, from this variable, 4096 by default). Every phase ignores EOS, which makes
# that reservation exact: with the default the H200 run never ran out mid-decode (25 evictions,
# 0 retractions). At 32 the scheduler admits on prompt room, and decoding requests outgrow the
# pool, so SGLang must retract some.
PRESSURE_ENV = {"SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION": "32"}


@dataclass(frozen=True)
class Request:
    rid: str
    prompt: tuple[int, ...]
    max_new: int
    abort_after: int | None = None  # the client aborts after this many streamed tokens
    dp_rank: int | None = None  # the attention-DP rank SGLang must run it on (routed_dp_rank)
    logprob: bool = False  # return_logprob: SGLang forms no MIXED step while it runs


@dataclass(frozen=True)
class Segment:
    """``first`` are sent together (streamed when ``then`` is not empty); ``then`` are sent once
    every request of ``first`` has produced its first token."""

    name: str
    first: tuple[Request, ...]
    then: tuple[Request, ...] = ()


def _prompt(rng: random.Random, n: int) -> tuple[int, ...]:
    # Token ids away from the special ids at both ends of the vocabulary.
    return tuple(rng.randrange(10, VOCAB - 10) for _ in range(n))


PRESSURE = "pressure"
DP = "dp"
BOUNDARY = "boundary"
# short: without the long segment (a quick run)
WORKLOADS = ("full", "short", PRESSURE, DP, BOUNDARY)

# The tiny model's boundaries (tiny_dsv4_config.json: window 128, index top-k 512 over c4 keys,
# so 2048 tokens; DeepSeek-V4's page of 256): the decode rows' context lengths each must cross.
BOUNDARY_CROSSINGS = {
    "swa": (127, 128, 129),
    "page": (255, 256, 257),
    "c4_topk": (2047, 2048, 2049),
}
BOUNDARY_OFFSETS = (4, 20)  # a row's prompt ends this far below its boundary
BOUNDARY_CHUNKS = 32  # the late prompt's chunks: MIXED steps that carry the rows
BOUNDARY_MARGIN = 48  # tokens each row still decodes after the late prompt's chunks


LOGPROB = "logprob"
LOGPROB_WORKLOADS = ("full", "short", BOUNDARY)  # those that end with it under speculation
LOGPROB_NEW = 96  # its tokens: it still decodes well after the late prompt's three chunks


def _logprob_segment(rng: random.Random, chunk: int) -> Segment:
    lp = Request("lp_req", _prompt(rng, 200), LOGPROB_NEW, logprob=True)
    return Segment(LOGPROB, (lp,), (Request("lp_late", _prompt(rng, 3 * chunk - 100), 8),))


def logprob_rids(workload: str, spec: bool) -> tuple[str, ...]:
    """The requests of a workload that ask for logprobs."""
    if not spec or workload not in LOGPROB_WORKLOADS:
        return ()
    return tuple(r.rid for r in all_requests(build(workload=workload, spec=True)) if r.logprob)


def boundary_lens() -> tuple[int, ...]:
    """Every context length a decode row of a MIXED step must have had in the boundary workload."""
    return tuple(sorted(n for lens in BOUNDARY_CROSSINGS.values() for n in lens))


def engine_overrides(workload: str, spec: bool = False) -> dict[str, object]:
    """Engine arguments a workload needs (the pressure workload's small pools, the speculative
    boundary workload's window pool)."""
    if workload == BOUNDARY and spec:
        import e2e_spec_boundary

        return dict(e2e_spec_boundary.ENGINE_OVERRIDES)
    if workload != PRESSURE:
        return {}
    return {
        "max_total_tokens": PRESSURE_POOL_TOKENS,
        "swa_full_tokens_ratio": PRESSURE_SWA_RATIO,
    }


def engine_env(workload: str) -> dict[str, str]:
    """Environment a workload's phases need (the pressure workload's admission clip)."""
    return dict(PRESSURE_ENV) if workload == PRESSURE else {}


def _pressure_segments(rng: random.Random) -> list[Segment]:
    warm = tuple(Request(f"warm{i}", _prompt(rng, 700), 8) for i in range(4))
    # Three requests reuse a warm prompt's first two pages (radix hits while they last).
    reused = [warm[i].prompt[:512] + _prompt(rng, n) for i, n in enumerate((200, 320, 260))]
    fresh = [_prompt(rng, n) for n in (300, 620, 900, 450, 780, 350, 560, 840, 400)]
    aborted = {1, 5, 9}  # positions in ``first``
    # Two digits: SGLang aborts every request whose rid starts with the one given
    # (`Scheduler.abort_request`), so aborting "press1" also aborted press10 and press11.
    first = tuple(
        Request(
            f"press{i:02d}",
            prompt,
            PRESSURE_MAX_NEW,
            abort_after=ABORT_AFTER if i in aborted else None,
        )
        for i, prompt in enumerate(reused + fresh)
    )
    then = tuple(Request(f"press_late{i}", _prompt(rng, 1100), 256) for i in range(2))
    return [Segment("warm", warm), Segment("pressure", first, then)]


def abort_targets(segments: list[Segment]) -> dict[str, int]:
    """The requests the client aborts, with the tokens each streams first."""
    return {r.rid: r.abort_after for r in all_requests(segments) if r.abort_after is not None}


def _dp_segments(rng: random.Random, chunk: int, dp: int) -> list[Segment]:
    idle = Segment("dp_idle", (Request("dp_idle0", _prompt(rng, 3 * chunk - 40), 24, dp_rank=0),))
    decoding = tuple(Request(f"dp_dec{r}", _prompt(rng, 150), 96, dp_rank=r) for r in range(dp))
    late = (Request("dp_late0", _prompt(rng, 3 * chunk - 60), 16, dp_rank=0),)
    return [idle, Segment("dp_mixed", decoding, late)]


def _boundary_segments(rng: random.Random, chunk: int) -> list[Segment]:
    late_new = BOUNDARY_CHUNKS + max(BOUNDARY_OFFSETS) + BOUNDARY_MARGIN
    rows = tuple(
        Request(f"bnd_{name}_{off}", _prompt(rng, lens[1] - off), late_new)
        for name, lens in BOUNDARY_CROSSINGS.items()
        for off in BOUNDARY_OFFSETS
    )
    # One chunk's worth short of the last chunk, so the late prompt runs BOUNDARY_CHUNKS chunks.
    late = (Request("bnd_late", _prompt(rng, BOUNDARY_CHUNKS * chunk - chunk // 2), 8),)
    return [Segment("boundary", rows, late)]


def build(
    seed: int = 0, chunk: int = 256, workload: str = "full", dp: int = 1, spec: bool = False
) -> list[Segment]:
    """``chunk`` is the chunked prefill per rank; ``dp`` the attention-DP ranks (``dp`` workload);
    ``spec``: for a speculative engine (the boundary workload differs)."""
    if workload not in WORKLOADS:
        raise ValueError(f"workload must be one of {WORKLOADS}, got {workload!r}")
    if dp < 1:
        raise ValueError(f"dp must be at least 1, got {dp}")
    rng = random.Random(seed)
    if workload == PRESSURE:
        return _pressure_segments(rng)
    if workload == BOUNDARY and spec:
        import e2e_spec_boundary  # it builds on this module

        return [*e2e_spec_boundary.segments(rng, chunk), _logprob_segment(rng, chunk)]
    if workload == BOUNDARY:
        return _boundary_segments(rng, chunk)

    def reqs(prefix: str, lens, max_new) -> tuple[Request, ...]:
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
    if workload == DP:
        return segments[:2] + _dp_segments(rng, chunk, dp)
    segments = segments if workload == "full" else segments[:2]
    return [*segments, _logprob_segment(rng, chunk)] if spec else segments


def all_requests(segments: list[Segment]) -> list[Request]:
    return [r for s in segments for r in s.first + s.then]


def concurrent_requests(workload: str, segments: list[Segment], spec: bool = False) -> int:
    """The running requests a workload needs at once to do what it is for (0: queueing is
    harmless): the speculative boundary workload's rows must all decode through the late chunks."""
    if workload == BOUNDARY and spec:
        return max(len(s.first) + len(s.then) for s in segments)
    return 0


def peak_tokens(segments: list[Segment]) -> int:
    """The most KV tokens one segment holds at once (segments run one after another)."""
    return max(sum(len(r.prompt) + r.max_new for r in s.first + s.then) for s in segments)
