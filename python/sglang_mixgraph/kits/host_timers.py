"""Host time spent in named functions of the code the server runs, for benchmarks.

A benchmark that times a whole phase (a replay's prepare, say) learns how long it took, not
which part: ``call_timers`` wraps the functions it is given (module globals or instance
attributes, looked up by name where they are called) for the length of a ``with`` block and
adds each one's host wall time per call into a dict of milliseconds. It adds no device
synchronization, so GPU work a part only launches is not in its figure, and a part that calls
another includes it. Everything is put back on exit, also when the block raises.
``split_plan_targets`` names the parts of the mixed split's step plan that way, and
``part_medians`` summarizes the per-step figures.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence


@contextlib.contextmanager
def call_timers(targets: Sequence[tuple[str, object, str]]) -> Iterator[dict[str, float]]:
    """``targets``: (name, owner, attribute) each; yields {name: host ms so far} (and
    ``<name>.calls``), live while the block runs."""
    acc: dict[str, float] = defaultdict(float)
    saved = []

    def timed(name, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[name] += (time.perf_counter() - t0) * 1e3
                acc[f"{name}.calls"] += 1

        return wrapper

    try:
        for name, owner, attr in targets:
            had_own = attr in vars(owner)
            saved.append((owner, attr, had_own, vars(owner).get(attr)))
            setattr(owner, attr, timed(name, getattr(owner, attr)))
        yield acc
    finally:
        for owner, attr, had_own, own in reversed(saved):
            if had_own:
                setattr(owner, attr, own)
            else:
                delattr(owner, attr)


# The parts of a step whose host time the steady-state benchmark reports: the mixed split's plan
# and what it calls, and the backend's chunk-cache builder (upstream calls it lazily in the
# replay's first break, the patch at prepare).
SPLIT_PLAN_PARTS = ("plan", "decision", "tail_inputs", "chunk_cache")


def split_plan_targets(backend) -> list[tuple[str, object, str]]:
    """``call_timers`` targets for ``SPLIT_PLAN_PARTS`` on ``backend`` (a DSV4 attention
    backend): the plan module's globals as ``mixed_split.plan._plan`` calls them."""
    from sglang_mixgraph.patches.mixed_split import plan

    return [
        ("plan", plan, "_plan"),
        ("decision", plan, "_adaptive_splits"),
        ("tail_inputs", plan, "step_tail_inputs"),
        ("chunk_cache", backend, "_build_sparse_prefill_chunk_cache"),
    ]


def part_medians(samples) -> dict:
    """{phase: {part: median host ms per step}} of ``SPLIT_PLAN_PARTS`` over per-step
    {phase: {part: ms}} records (a part a step did not call counts 0)."""
    phases = sorted({phase for s in samples for phase in s})
    return {
        phase: {
            part: round(statistics.median(s.get(phase, {}).get(part, 0.0) for s in samples), 3)
            for part in SPLIT_PLAN_PARTS
        }
        for phase in phases
    }
