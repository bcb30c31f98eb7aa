"""Say once per process and reason that a patch handed a step back to upstream."""

from __future__ import annotations

import logging

logger = logging.getLogger("sglang_mixgraph")

_said: set[tuple[str, str]] = set()


def fallback_once(patch_id: str, reason: str) -> bool:
    """Log that `patch_id` falls back to the upstream path because of `reason`, the first time only.

    Returns True when this call logged.
    """
    key = (patch_id, reason)
    if key in _said:
        return False
    _said.add(key)
    logger.info("sglang-mixgraph: %s falls back to upstream: %s", patch_id, reason)
    return True
