"""Pool log of an end-to-end phase: the scheduler's retractions and radix-cache evictions.

Imported at start-up of every process of a phase (``MIXGRAPH_E2E_STARTUP``, beside the step
log); only the scheduler retracts and evicts. One JSON line per event that freed something, in
``$MIXGRAPH_E2E_STEP_LOG/pool_<pid>.jsonl``:

* ``{"event": "retract", "reqs": n, "aborted": m, "rids": [...]}`` after
  ``ScheduleBatch.retract_decode``
  (what ``Scheduler.update_running_batch`` calls when the next decode step does not fit);
* ``{"event": "evict", "tokens": n, "swa_tokens": m}`` after an eviction of the radix cache:
  ``UnifiedRadixCache._evict`` (behind its ``evict`` and ``evict_for_alloc``) and
  ``RadixCache.evict`` (behind ``PureSWARadixCache.evict``), read from their ``EvictResult``.

The pressure workload's check (e2e_checks.py) needs both to have happened.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping

FILE_PREFIX = "pool_"
EVICTORS = (
    ("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache", "_evict"),
    ("sglang.srt.mem_cache.radix_cache", "RadixCache", "evict"),
)
RETRACTOR = ("sglang.srt.managers.schedule_batch", "ScheduleBatch", "retract_decode")


def _record(event: dict) -> None:
    path = os.path.join(os.environ["MIXGRAPH_E2E_STEP_LOG"], f"{FILE_PREFIX}{os.getpid()}.jsonl")
    try:
        with open(path, "a") as f:
            f.write(json.dumps(event) + "\n")
    except Exception as e:  # a log line must never break a step
        sys.stderr.write(f"[e2e pool log] {e!r}\n")


def _wrap_retract(cls, name: str) -> None:
    retract = getattr(cls, name)

    def recorded(self, *args, **kwargs):
        out = retract(self, *args, **kwargs)
        retracted, _ratio, aborted = out
        if retracted or aborted:
            rids = [str(getattr(r, "rid", "?")) for r in retracted]
            _record(
                {"event": "retract", "reqs": len(retracted), "aborted": len(aborted), "rids": rids}
            )
        return out

    setattr(cls, name, recorded)


def _wrap_evict(cls, name: str) -> None:
    evict = getattr(cls, name)

    def recorded(self, *args, **kwargs):
        result = evict(self, *args, **kwargs)
        full = int(getattr(result, "num_tokens_evicted", 0) or 0)
        swa = int(getattr(result, "swa_num_tokens_evicted", 0) or 0)
        if full or swa:
            _record({"event": "evict", "tokens": full, "swa_tokens": swa})
        return result

    setattr(cls, name, recorded)


def summarize(events: Iterable[Mapping]) -> dict:
    """Totals of a phase's pool events (every process)."""
    out = {"retractions": 0, "retracted_reqs": 0, "evictions": 0, "evicted_tokens": 0}
    out["evicted_swa_tokens"] = 0
    rids = set()
    for e in events:
        if e.get("event") == "retract":
            out["retractions"] += 1
            out["retracted_reqs"] += int(e.get("reqs", 0))
            rids.update(e.get("rids", ()))
        elif e.get("event") == "evict":
            out["evictions"] += 1
            out["evicted_tokens"] += int(e.get("tokens", 0))
            out["evicted_swa_tokens"] += int(e.get("swa_tokens", 0))
    out["retracted_rids"] = sorted(rids)
    return out


def install() -> None:
    if not os.environ.get("MIXGRAPH_E2E_STEP_LOG"):
        return
    from engine_standins import AfterImport  # tools/gpu-upstream/engine, first on PYTHONPATH

    targets = ((RETRACTOR, _wrap_retract),) + tuple((t, _wrap_evict) for t in EVICTORS)
    for (module, cls, name), wrap in targets:
        sys.meta_path.insert(
            0,
            AfterImport(
                module, lambda m, cls=cls, name=name, wrap=wrap: wrap(getattr(m, cls), name)
            ),
        )
