"""GPU tests against SGLang's own code: upstream's DSV4 pool, backend (real ``__init__``), real
metadata builders (Triton/JIT), real FlashMLA and real breakable CUDA graphs, with the plugin's
hooks on top. See docs/testing.md.

Every test here is skipped, with the reason printed, when there is no CUDA GPU, when sglang
cannot be imported (use a full ``pip install sglang==0.5.23`` or the kit in tools/gpu-upstream),
or when the pytest run also holds the CPU tests (they describe a GPU to SGLang process-wide:
run this folder on its own, ``python -m pytest test/gpu_upstream``).
"""

import importlib.util
import os

import pytest
import torch


def _skip_reason():
    if not torch.cuda.is_available():
        return "no CUDA GPU (torch.cuda.is_available() is False)"
    if importlib.util.find_spec("sglang") is None:
        return "sglang is not importable (install sglang==0.5.23 or use tools/gpu-upstream)"
    if os.environ.get("SGLANG_PLATFORM") == "mixgraph_target":
        return "this run describes a GPU for the CPU tests: run test/gpu_upstream in its own pytest process"
    return None


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu_upstream: runs upstream sglang code on a CUDA GPU")


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep  # the folder, not a name prefix
    ours = [it for it in items if str(it.fspath).startswith(here)]
    reason = _skip_reason()
    for it in ours:
        it.add_marker(pytest.mark.gpu_upstream)
        if reason:
            it.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def sglang_cuda():
    """Upstream's server-args and parallel context for a one-GPU DSV4 deployment."""
    from sglang_mixgraph.kits import dsv4_cpu as K

    K.import_upstream()
    with K.sglang_context(device="cuda"):
        yield
