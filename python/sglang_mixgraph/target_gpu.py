"""Describe a target GPU to SGLang on a machine that has none, for `sglang-mixgraph plan`.

SGLang asks its platform layer about the accelerator while it resolves server
arguments (memory size, SM version). `plan` must resolve arguments exactly as
`launch_server` would on the deployment's GPU, so it selects this platform
through SGLang's own platform-plugin mechanism (entry point group
`sglang.srt.platforms`, chosen with `SGLANG_PLATFORM`, see
sglang/srt/platforms/__init__.py `_resolve_platform`) and answers the platform
facts (`sglang.srt.runtime_context.override_platform`) for the described chip.

Nothing here activates unless `SGLANG_MIXGRAPH_DESCRIBED_GPU` names a GPU; only
`plan` (in its own process) and the tests set it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DESCRIBED_GPU_ENV = "SGLANG_MIXGRAPH_DESCRIBED_GPU"
PLATFORM_PLUGIN_NAME = "mixgraph_target"


@dataclass(frozen=True)
class GpuSpec:
    name: str
    device_name: str
    sm_major: int
    sm_minor: int
    memory_bytes: int

    @property
    def sm(self) -> int:
        return self.sm_major * 10 + self.sm_minor

    def describe(self) -> str:
        return f"{self.name} (SM{self.sm}), {self.memory_bytes / 1e9:.0f} GB"


# Memory as the driver reports it (nvidia-smi memory.total); vendor datasheets round.
GPUS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        GpuSpec("B300", "NVIDIA B300 SXM6 AC", 10, 3, 275 * 10**9),
        GpuSpec("B200", "NVIDIA B200", 10, 0, 183 * 10**9),
        GpuSpec("H200", "NVIDIA H200", 9, 0, 143 * 10**9),
        GpuSpec("H100", "NVIDIA H100 80GB HBM3", 9, 0, 85 * 10**9),
    )
}
DEFAULT_GPU = "B300"


def lookup(name: str) -> GpuSpec:
    try:
        return GPUS[name.upper()]
    except KeyError:
        raise ValueError(
            f"unknown target GPU {name!r}; choose one of {', '.join(GPUS)}"
        ) from None


def described_gpu() -> GpuSpec | None:
    name = os.environ.get(DESCRIBED_GPU_ENV)
    return lookup(name) if name else None


def activate() -> str | None:
    """Platform-plugin entry point: a platform only when a GPU is being described."""
    if described_gpu() is None:
        return None
    return f"{__name__}.DescribedGpuPlatform"


def platform_facts(spec: GpuSpec) -> dict:
    """The facts `sglang.srt.runtime_context.get_platform()` answers, for this chip."""
    major = spec.sm_major
    return dict(
        is_cuda=True,
        is_hip=False,
        is_npu=False,
        is_xpu=False,
        is_musa=False,
        is_mps=False,
        is_sm90=major == 9,
        is_sm100=major == 10,
        is_sm100_or_sm110=major in (10, 11),
        is_sm110=major == 11,
        is_sm120=major == 12,
        is_blackwell=major in (10, 11, 12),
        is_hopper_with_cuda_12_3=major == 9,
        device_sm=spec.sm,
        device_capability=(spec.sm_major, spec.sm_minor),
    )


def _make_platform_class():
    from sglang.srt.platforms.cuda import CudaSRTPlatform
    from sglang.srt.platforms.device_mixin import DeviceCapability

    class DescribedGpuPlatform(CudaSRTPlatform):
        """SGLang's CUDA platform, answering device queries for the described GPU."""

        def _spec(self) -> GpuSpec:
            spec = described_gpu()
            assert spec is not None, f"{DESCRIBED_GPU_ENV} is not set"
            return spec

        def get_device(self, device_id: int | None = 0) -> str:
            # sglang.srt.utils.common.get_device answers "cuda" / "cuda:N" on a real GPU.
            return "cuda" if device_id is None else f"cuda:{device_id}"

        def get_device_name(self, device_id: int = 0) -> str:
            return self._spec().device_name

        def get_device_total_memory(self, device_id: int = 0) -> int:
            return self._spec().memory_bytes

        def get_available_memory(self, device_id: int = 0) -> tuple[int, int]:
            total = self._spec().memory_bytes
            return total, total

        def get_device_capability(self, device_id: int = 0):
            spec = self._spec()
            return DeviceCapability(spec.sm_major, spec.sm_minor)

    DescribedGpuPlatform.__module__ = __name__
    return DescribedGpuPlatform


def __getattr__(name: str):
    # Built lazily: importing this module must not import sglang or torch.
    if name == "DescribedGpuPlatform":
        cls = _make_platform_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
