"""Test-suite setup shared by every CPU test.

SGLang resolves its platform once per process, when `sglang.srt.utils` is first imported;
select the described-GPU platform before any test imports sglang so that server-argument
resolution can be run for a target GPU (see sglang_mixgraph.target_gpu). Outside
`described_gpu(...)` blocks the platform object answers for the default target, and the device
probes tell the truth.

The folders in REAL_GPU_DIRS run upstream code on a real GPU and must see the real platform: a
pytest run given only those folders leaves the platform alone; a run that mixes them with the
CPU tests describes the GPU and those folders skip (run them in their own pytest process).
"""

import os

from sglang_mixgraph.resolve import select_described_platform

REAL_GPU_DIRS = ("gpu_upstream",)
_HERE = os.path.dirname(os.path.abspath(__file__))


def _inside_real_gpu_dirs(arg: str) -> bool:
    path = os.path.abspath(arg.split("::", 1)[0])
    return any(
        path == os.path.join(_HERE, d) or path.startswith(os.path.join(_HERE, d) + os.sep)
        for d in REAL_GPU_DIRS
    )


def pytest_configure(config):
    args = [a for a in config.args if not a.startswith("-")]
    if not args or not all(_inside_real_gpu_dirs(a) for a in args):
        select_described_platform()
