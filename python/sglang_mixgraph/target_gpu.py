"""Describe a target GPU to SGLang on a machine that has none, for `sglang-mixgraph plan`.

SGLang asks about the accelerator while it resolves server arguments (memory
size, SM version). `plan` must resolve arguments exactly as `launch_server`
would on the deployment's GPU, so the chip is described at SGLang's platform
layer, in three places that together are everything resolution asks:
- the platform object: this module is a platform plugin (entry point group
  `sglang.srt.platforms`, selected with `SGLANG_PLATFORM=mixgraph_target`, see
  sglang/srt/platforms/__init__.py `_resolve_platform`) whose class is SGLang's
  CUDA platform answering device queries for the described chip;
- the platform facts: `sglang.srt.runtime_context.override_platform(...)`,
  upstream's scoped way to state SM version and vendor for every reader;
- the device probes in `sglang.srt.utils.common` that those facts are computed
  from (`is_cuda`, `get_device_sm`, `is_sm100_supported`, ...) and that some
  resolution hooks still call directly; inside `described_gpu()` they answer
  from the same description and are restored on exit.

The described GPU lives in this process only: `select(name)` (called by
`resolve.select_described_platform`, which `plan` and the tests' conftest call)
records it in a module variable, and nothing is read from the environment. A
process that did not select a GPU gets no described GPU: under auto-discovery
`activate()` returns None, and a process that inherited
`SGLANG_PLATFORM=mixgraph_target` gets the platform SGLang would pick without it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass

PLATFORM_PLUGIN_NAME = "mixgraph_target"


@dataclass(frozen=True)
class GpuSpec:
    name: str
    device_name: str
    sm_major: int
    sm_minor: int
    memory_mib: int  # what `nvidia-smi --query-gpu=memory.total` reports

    @property
    def sm(self) -> int:
        return self.sm_major * 10 + self.sm_minor

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib << 20

    def describe(self) -> str:
        return f"{self.name} (SM{self.sm}), {self.memory_mib} MiB"


# H200 as nvidia-smi reported it on a real H200 (143771 MiB); the others are the
# usual driver readings for those parts, not measured here.
GPUS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        GpuSpec("B300", "NVIDIA B300 SXM6 AC", 10, 3, 275040),
        GpuSpec("B200", "NVIDIA B200", 10, 0, 183359),
        GpuSpec("H200", "NVIDIA H200", 9, 0, 143771),
        GpuSpec("H100", "NVIDIA H100 80GB HBM3", 9, 0, 81559),
    )
}
DEFAULT_GPU = "B300"


def lookup(name: str) -> GpuSpec:
    try:
        return GPUS[name.upper()]
    except KeyError:
        raise ValueError(f"unknown target GPU {name!r}; choose one of {', '.join(GPUS)}") from None


# The GPU this process describes to SGLang: chosen by select() (the process default, for the
# platform object) and, inside described_gpu(), the one being resolved for. Process-local on
# purpose: no environment variable carries it, so no other process can inherit it.
_selected: GpuSpec | None = None
_active: GpuSpec | None = None


def select(name: str) -> GpuSpec:
    """Make this process describe `name` to SGLang (its platform object's default answer)."""
    global _selected
    _selected = lookup(name)
    return _selected


def current() -> GpuSpec | None:
    """The GPU described right now in this process, or None when none was selected."""
    return _active or _selected


def activate() -> str | None:
    """Platform-plugin entry point (`sglang.srt.platforms` group).

    Only a process that selected a GPU (`select`) gets the described platform. Under
    auto-discovery SGLang calls every installed platform plugin's `activate()`
    (sglang.srt.platforms `_resolve_platform`): None here, so a real server never picks this
    platform. A process that merely inherited SGLANG_PLATFORM=mixgraph_target (a server or
    a subprocess started from `plan` or the tests) gets the platform SGLang would pick without
    that variable: its real machine.
    """
    if _selected is not None:
        return f"{__name__}.DescribedGpuPlatform"
    if os.environ.get("SGLANG_PLATFORM") == PLATFORM_PLUGIN_NAME:
        return _platform_without_us()
    return None


def _platform_without_us() -> str:
    """The platform class SGLang's own discovery picks when SGLANG_PLATFORM is unset."""
    from sglang.srt import platforms

    saved = os.environ.pop("SGLANG_PLATFORM")
    try:
        chosen = type(platforms._resolve_platform())  # calls activate() again: None now
    finally:
        os.environ["SGLANG_PLATFORM"] = saved
    return f"{chosen.__module__}.{chosen.__qualname__}"


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


def _probe_answers(spec: GpuSpec) -> dict:
    """`sglang.srt.utils.common` device probes, answered for the described chip."""
    facts = platform_facts(spec)
    answers = {
        "is_cuda": facts["is_cuda"],
        "is_cuda_alike": True,
        "is_hip": False,
        "get_device_sm": spec.sm,
        "get_device_capability": (spec.sm_major, spec.sm_minor),
        "get_nvgpu_memory_capacity": spec.memory_mib,
        "is_sm80_supported": False,
        "is_sm90_supported": facts["is_sm90"],
        "is_sm100_supported": facts["is_sm100"],
        "is_sm100_or_sm110_supported": facts["is_sm100_or_sm110"],
        "is_sm110_supported": facts["is_sm110"],
        "is_sm120_supported": facts["is_sm120"],
        "is_blackwell_supported": facts["is_blackwell"],
        "is_blackwell": facts["is_blackwell"],
        "is_hopper_with_cuda_12_3": facts["is_hopper_with_cuda_12_3"],
        "is_ampere_with_cuda_12_3": False,
    }
    return {name: (lambda value=value, *a, **k: value) for name, value in answers.items()}


def import_resolution_modules() -> None:
    """Import the argument-resolution modules while the probes still tell the truth.

    Model and kernel modules choose their imports by probing at import time
    (`if is_cuda(): from sgl_kernel import ...`); on a CPU machine they must see
    the CPU, and only resolution, which runs inside `described_gpu`, sees the target.
    """
    import importlib
    import pkgutil

    import sglang.srt.arg_groups as arg_groups

    importlib.import_module("sglang.srt.server_args")
    for info in pkgutil.walk_packages(arg_groups.__path__, arg_groups.__name__ + "."):
        importlib.import_module(info.name)


def _rebind(
    answers: dict[int, tuple[object, object]],
) -> list[tuple[types.ModuleType, str, object]]:
    """Point every module-level name bound to an original at its answer: `answers` maps
    id(original) to (original, answer). Returns (module, name, original) for each name rebound.

    Resolution hooks import probes with `from sglang.srt.utils.common import ...`. One pass over
    sys.modules for all probes: a pass costs a fifth of a second with SGLang loaded.
    """
    rebound = []
    for mod in list(sys.modules.values()):
        if not isinstance(mod, types.ModuleType):
            continue
        try:
            items = list(vars(mod).items())
        except TypeError:
            continue
        for name, value in items:
            entry = answers.get(id(value))
            if entry is not None and entry[0] is value:
                setattr(mod, name, entry[1])
                rebound.append((mod, name, value))
    return rebound


@contextlib.contextmanager
def described_gpu(name: str) -> Iterator[GpuSpec]:
    """Within this block, SGLang sees `name` (B300, B200, H200, H100) as the local GPU.

    The platform plugin must already be selected when SGLang first resolves its
    platform (`SGLANG_PLATFORM=mixgraph_target` before `sglang.srt.utils` is
    imported); `plan` and the test suite's conftest arrange that.
    """
    from sglang.srt.platforms import current_platform
    from sglang.srt.runtime_context import override_platform
    from sglang.srt.utils import common

    spec = lookup(name)
    import_resolution_modules()
    if not isinstance(current_platform, platform_class()):
        raise RuntimeError(
            "SGLang's platform was resolved before the described GPU was selected; "
            f"set SGLANG_PLATFORM={PLATFORM_PLUGIN_NAME} before importing sglang.srt"
        )
    global _active
    previous = _active
    _active = spec
    swapped: list[tuple[types.ModuleType, str, object]] = []
    try:
        # Keyed by the original: upstream binds some probes under two names (is_blackwell is
        # is_blackwell_supported), and each original is restored from what it was.
        answers: dict[int, tuple[object, object]] = {}
        for probe, answer in _probe_answers(spec).items():
            original = getattr(common, probe)
            answers.setdefault(id(original), (original, answer))
        swapped += _rebind(answers)
        # Some resolution hooks ask torch directly (DSA models in
        # `sglang.srt.arg_groups.model_hook.handle_model_specific_adjustments`,
        # `torch.cuda.get_device_capability()`); answer that from the description too.
        import torch

        swapped.append((torch.cuda, "get_device_capability", torch.cuda.get_device_capability))
        torch.cuda.get_device_capability = lambda *a, **k: (spec.sm_major, spec.sm_minor)
        with override_platform(**platform_facts(spec)), _registries_as_described():
            yield spec
    finally:
        for mod, attr, original in swapped:
            setattr(mod, attr, original)
        _active = previous


# Registries SGLang fills at import time by probing the device: on this machine they hold what
# its CPU registered. `sglang.srt.layers.quantization` adds `mxfp4` only when `is_cuda()` (or
# the CPU, HIP gfx95, XPU) answers at import, and `gptq` per device.
IMPORT_TIME_REGISTRIES = {
    "sglang.srt.layers.quantization": (
        "BASE_QUANTIZATION_METHODS",
        "QUANTIZATION_METHODS",
        "CPU_QUANTIZATION_METHODS",
    ),
}


@contextlib.contextmanager
def _registries_as_described() -> Iterator[None]:
    """Each import-time registry filled as its module fills it on the described GPU.

    The module's own code runs again (under a private name, with the probes answering for the
    described GPU) and the live dictionaries take its result in place, since readers hold
    them by reference (`sglang.srt.configs.model_config` imports QUANTIZATION_METHODS); the
    originals are restored on exit.
    """
    import importlib
    import importlib.util

    saved: list[tuple[dict, dict]] = []
    try:
        for module_name, names in IMPORT_TIME_REGISTRIES.items():
            live = importlib.import_module(module_name)
            private = "_described_" + module_name.replace(".", "_")
            spec = importlib.util.spec_from_file_location(private, live.__file__)
            described = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(described)
            for name in names:
                table = getattr(live, name)
                saved.append((table, dict(table)))
                table.clear()
                table.update(getattr(described, name))
        yield
    finally:
        for table, original in saved:
            table.clear()
            table.update(original)


_platform_class: type | None = None


def platform_class() -> type:
    """The platform class, built on first use: importing this module must not import sglang."""
    global _platform_class
    if _platform_class is None:
        _platform_class = _make_platform_class()
    return _platform_class


def _make_platform_class():
    from sglang.srt.platforms.cuda import CudaSRTPlatform
    from sglang.srt.platforms.device_mixin import DeviceCapability

    class DescribedGpuPlatform(CudaSRTPlatform):
        """SGLang's CUDA platform, answering device queries for the described GPU."""

        def _spec(self) -> GpuSpec:
            spec = current()
            if spec is None:
                raise RuntimeError(
                    "no GPU is described in this process (target_gpu.select was not called)"
                )
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
            return total, total  # (free, total) of an idle GPU

        def get_device_capability(self, device_id: int = 0):
            spec = self._spec()
            return DeviceCapability(spec.sm_major, spec.sm_minor)

    DescribedGpuPlatform.__module__ = __name__
    return DescribedGpuPlatform


def __getattr__(name: str):
    # `_resolve_platform` loads the class by qualified name (pkgutil.resolve_name).
    if name == "DescribedGpuPlatform":
        return platform_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
