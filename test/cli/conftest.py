"""Fixtures of the command tests that run `plan` and `doctor` in this process."""

import os

import pytest

from sglang_mixgraph.cli.presets import MEGA_MOE_CAP_ENV
from sglang_mixgraph.kits.fake_nvidia_smi import fake_nvidia_smi


@pytest.fixture
def plan_env(monkeypatch, tmp_path):
    """A clean environment for in-process plans; anything `plan` sets is restored afterwards.
    The machine has no GPU (a failing nvidia-smi), so plan's default target is the default."""
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path / "no-gpu", None))
    for name in list(os.environ):
        if name.startswith("SGLANG_") and name != "SGLANG_PLATFORM":
            monkeypatch.delenv(name)
    monkeypatch.delenv(MEGA_MOE_CAP_ENV, raising=False)
    return monkeypatch
