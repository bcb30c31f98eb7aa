"""Host time spent in named functions of the code the server runs, for benchmarks.

A benchmark that times a whole phase (a replay's prepare, say) learns how long it took, not
which part: ``call_timers`` wraps the functions it is given (module globals or instance
attributes, looked up by name where they are called) for the length of a ``with`` block and
adds each one's host wall time per call into a dict of milliseconds. It adds no device
synchronization, so GPU work a part only launches is not in its figure, and a part that calls
another includes it. Everything is put back on exit, also when the block raises.
"""

from __future__ import annotations

import contextlib
import functools
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
