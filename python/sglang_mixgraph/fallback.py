"""A patch hands work back to upstream: count it every time, say it once per process and reason."""

from __future__ import annotations

import logging

from sglang_mixgraph import counters

logger = logging.getLogger("sglang_mixgraph")

_said: set[tuple[str, str]] = set()


def fallback_once(patch_id: str, reason: str, *, key: str | None = None) -> bool:
    """Count a fallback of `patch_id` to the upstream path because of `reason` (under the short
    `key` when given, else the reason text) and log it the first time only.

    Returns True when this call logged.
    """
    counters.count_fallback(patch_id, key or reason)
    said = (patch_id, reason)
    if said in _said:
        return False
    _said.add(said)
    logger.info("sglang-mixgraph: %s falls back to upstream: %s", patch_id, reason)
    return True
