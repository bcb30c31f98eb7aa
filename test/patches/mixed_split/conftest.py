"""Shared by the split's tests that read its counters. Imports nothing of sglang at load:
pytest loads this file before the root conftest has described the GPU to SGLang."""

from __future__ import annotations

import pytest


@pytest.fixture
def fresh_counters(monkeypatch):
    """Counters and once-only fallback lines from zero, no reporter thread logging them."""
    from sglang_mixgraph import counters, fallback

    monkeypatch.setenv("SGLANG_MIXGRAPH_COUNTERS_LOG_INTERVAL", "0")
    counters.stop_reporter()
    counters.reset()
    fallback._said.clear()
    yield
    counters.reset()
    fallback._said.clear()
