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


@pytest.fixture
def doctor_here(monkeypatch, capsys):
    """`sglang-mixgraph doctor ARGS` in this process (`cli.main`, as the console script calls
    it), without SGLANG_* variables but `env`; returns (exit code, captured output). Doctor
    reads the flags and the plugin allowlist when it runs, so it needs no process of its own
    (a fresh one costs seconds of imports)."""
    from sglang_mixgraph.cli import main

    def run(*args: str, env: dict[str, str] | None = None):
        for key in [k for k in os.environ if k.startswith("SGLANG_")]:
            monkeypatch.delenv(key)
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        capsys.readouterr()
        code = main(["doctor", *args])
        return code, capsys.readouterr()

    return run
