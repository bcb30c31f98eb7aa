"""GPU tests: our torch reference against FlashMLA's legacy kernels on the V4 layout, our Triton
dequant against the torch one, split against unsplit with the real kernels.

Every test here carries the ``gpu`` marker and is skipped when ``torch.cuda.is_available()`` is
False (and when FlashMLA cannot be imported). FlashMLA may come from an installed
``sgl-flash-mla`` or from the wheel unpacked at ``.whl/site`` and put on ``PYTHONPATH``
(docs/mixed-split-kernels.md).
"""

import os

import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (and FlashMLA for the kernel tests)")
    config.addinivalue_line("markers", "needs_flash_mla: needs the sgl-flash-mla kernels")


def _flash_mla_error():
    try:
        import flash_mla  # noqa: F401

        if not flash_mla.has_legacy():
            return "FlashMLA has no legacy (SM90 / V4) kernels"
    except Exception as exc:  # pragma: no cover - depends on the machine
        return f"FlashMLA unavailable: {exc} (an unpacked wheel: PYTHONPATH=python:.whl/site)"
    return None


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep  # the folder, not a name prefix
    ours = [it for it in items if str(it.fspath).startswith(here)]
    for it in ours:
        it.add_marker(pytest.mark.gpu)
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="no CUDA GPU (torch.cuda.is_available() is False)")
        for it in ours:
            it.add_marker(skip)
        return
    err = _flash_mla_error()
    if err:
        skip = pytest.mark.skip(reason=err)
        for it in ours:
            if "needs_flash_mla" in it.keywords:
                it.add_marker(skip)


@pytest.fixture
def decode_reference():
    """The fp32 reference of a synthetic step's decode rows: ``reference(step) -> (out, lse)``."""
    from sglang_mixgraph.kits.synthetic_step import softmax_scale
    from sglang_mixgraph.reference.sparse_mla import sparse_decode_reference

    def reference(step):
        rows = step.boundary.decode_rows
        return sparse_decode_reference(
            step.q[rows],
            step.swa_view,
            step.swa_indices[rows],
            step.swa_lengths[rows],
            step.attn_sink,
            step.extra_view,
            step.extra_indices[rows],
            step.extra_lengths[rows],
            softmax_scale(),
        )

    return reference
