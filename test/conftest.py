"""Test-suite setup shared by every CPU test.

SGLang resolves its platform once per process, when `sglang.srt.utils` is first imported;
select the described-GPU platform before any test imports sglang so that server-argument
resolution can be run for a target GPU (see sglang_mixgraph.target_gpu). Outside
`described_gpu(...)` blocks the platform object answers for the default target, and the device
probes tell the truth.

The folders in REAL_GPU_DIRS run upstream code on a real GPU and must see the real platform: a
pytest run given only those folders leaves the platform alone; a run that mixes them with the
CPU tests describes the GPU and those folders skip (run them in their own pytest process).

SGLang loads plugins once per process, and the registry installs a patch only if its flag is on
at that moment; `graph_config` reads its flags again whenever its hooks run. So the plugin is
loaded here, once, with `graph_config` switched on: every in-process resolution sees the same
hooks, whichever test happens to resolve first.

Two tiers (docs/testing.md, "CI tiers"): by default the tests marked `slow` are skipped and
property tests run a quarter of their examples; `--slow` runs everything at full depth.
`.ci/run` picks the slow files to run from the paths a change touched (`.ci/slow_tier.py`).
"""

import importlib.util
import os

import pytest

from sglang_mixgraph.kits.fake_nvidia_smi import fake_nvidia_smi
from sglang_mixgraph.resolution.presets import MEGA_MOE_CAP_ENV
from sglang_mixgraph.resolution.resolve import load_plugins, select_described_platform

REAL_GPU_DIRS = ("gpu_upstream",)
SLOW_OPTION = "--slow"
FAST_TIER_DEPTH = 4  # property tests in the fast tier run 1/4 of their examples, at least 2
GRAPH_CONFIG_SWITCH = "SGLANG_MIXGRAPH_PREFILL_BUCKETS"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _inside_real_gpu_dirs(arg: str) -> bool:
    path = os.path.abspath(arg.split("::", 1)[0])
    return any(
        path == os.path.join(_HERE, d) or path.startswith(os.path.join(_HERE, d) + os.sep)
        for d in REAL_GPU_DIRS
    )


def _load_the_plugin_with_graph_config_on() -> None:
    saved = os.environ.get(GRAPH_CONFIG_SWITCH)
    os.environ[GRAPH_CONFIG_SWITCH] = "auto"
    try:
        load_plugins()
    finally:
        if saved is None:
            os.environ.pop(GRAPH_CONFIG_SWITCH)
        else:
            os.environ[GRAPH_CONFIG_SWITCH] = saved


def pytest_addoption(parser):
    parser.addoption(
        SLOW_OPTION,
        action="store_true",
        help="the full suite: also the tests marked slow, property tests at full depth",
    )


def pytest_configure(config):
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return  # pytest-xdist's controller collects nothing: its workers set SGLang up
    args = [a for a in config.args if not a.startswith("-")]
    if not args or not all(_inside_real_gpu_dirs(a) for a in args):
        select_described_platform()
        if importlib.util.find_spec("sglang") is not None:  # test/gpu runs without sglang
            _load_the_plugin_with_graph_config_on()


def _lighten_property_test(test, seen: set[int]) -> None:
    """Run a Hypothesis test with fewer examples; parametrized cases share one function."""
    test = getattr(test, "__func__", test)  # a test method: its settings live on the function
    current = getattr(test, "_hypothesis_internal_use_settings", None)
    if current is None or id(test) in seen:
        return
    seen.add(id(test))
    from hypothesis import settings

    lighter = max(2, current.max_examples // FAST_TIER_DEPTH)
    test._hypothesis_internal_use_settings = settings(current, max_examples=lighter)


def pytest_collection_modifyitems(config, items):
    if config.getoption(SLOW_OPTION):
        return
    skip = pytest.mark.skip(reason=f"slow tier: run with {SLOW_OPTION} (docs/testing.md)")
    seen: set[int] = set()
    for item in items:
        if item.get_closest_marker("slow"):
            item.add_marker(skip)
        else:
            _lighten_property_test(getattr(item, "obj", None), seen)


# The command tests that run `plan` and `doctor` in this process (test/cli/, test/resolution/).


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
