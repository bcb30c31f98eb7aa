"""Fixtures of the command tests that run `plan` and `doctor` in this process."""

import os

import pytest

from sglang_mixgraph.cli.presets import MEGA_MOE_CAP_ENV


@pytest.fixture
def plan_env(monkeypatch):
    """A clean environment for in-process plans; anything `plan` sets is restored afterwards."""
    for name in list(os.environ):
        if name.startswith("SGLANG_") and name != "SGLANG_PLATFORM":
            monkeypatch.delenv(name)
    monkeypatch.delenv(MEGA_MOE_CAP_ENV, raising=False)
    return monkeypatch
