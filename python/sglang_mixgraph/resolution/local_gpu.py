"""The GPU `plan` targets when --target-gpu is not given: this machine's, if plan describes it.

`plan` picks its target before anything imports `sglang.srt` (the described-GPU platform is
selected first, see target_gpu.py) and must work where CUDA does not, so the local GPU is read
from `nvidia-smi` (name and memory of the first GPU, with a short timeout), not from torch or
SGLang. The name maps to one of `target_gpu.GPUS` by the word naming the part ("NVIDIA H100
80GB HBM3" is the H100). No GPU, or one plan cannot describe, leaves the default
(`target_gpu.DEFAULT_GPU`) and says why. `TargetChoice` carries the chosen name, where it came
from ("given", "local", "default") and that in words, for plan's text and JSON.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from sglang_mixgraph.target_gpu import DEFAULT_GPU, GPUS

PROBE_TIMEOUT_S = 5
QUERY = ["--query-gpu=name,memory.total", "--format=csv,noheader,nounits"]


class NoLocalGpu(Exception):
    """There is no GPU to read here; the message says why (one line)."""


@dataclass(frozen=True)
class LocalGpu:
    name: str  # as nvidia-smi reports it, e.g. "NVIDIA H100 80GB HBM3"
    memory_mib: int | None


@dataclass(frozen=True)
class TargetChoice:
    name: str  # a key of target_gpu.GPUS
    source: str  # "given", "local" or "default"
    why: str  # where it came from, in words


def probe() -> LocalGpu:
    """The first GPU nvidia-smi lists; NoLocalGpu when there is none or nvidia-smi fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise NoLocalGpu("nvidia-smi not found")
    try:
        # Bytes, decoded leniently: a stray non-UTF-8 byte names no GPU plan knows, no more.
        out = subprocess.run(
            [smi, *QUERY], capture_output=True, timeout=PROBE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise NoLocalGpu(f"nvidia-smi did not answer within {PROBE_TIMEOUT_S} s") from None
    except OSError as e:
        raise NoLocalGpu(f"nvidia-smi could not run: {e}") from None
    stdout, stderr = (out.stdout.decode(errors="replace"), out.stderr.decode(errors="replace"))
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if out.returncode != 0:
        # nvidia-smi prints its own failures ("couldn't communicate with the driver") on stdout
        said = (lines or stderr.strip().splitlines() or ["no message"])[0]
        raise NoLocalGpu(f"nvidia-smi failed: {said}")
    if not lines:
        raise NoLocalGpu("nvidia-smi lists no GPU")
    name, _, memory = lines[0].rpartition(",")
    if not name:  # an answer without the memory column
        return LocalGpu(memory.strip(), None)
    return LocalGpu(name.strip(), int(memory) if memory.strip().isdecimal() else None)


def described_as(device_name: str) -> str | None:
    """The key of GPUS a local device name is, or None: the exact name, else a word of it."""
    for key, spec in GPUS.items():
        if spec.device_name == device_name:
            return key
    words = device_name.upper().replace("-", " ").split()
    return next((key for key in GPUS if key in words), None)


def choose_target(given: str | None, find=probe) -> TargetChoice:
    """The GPU to plan for: the one given, else this machine's, else the default."""
    if given is not None:
        return TargetChoice(given, "given", "given with --target-gpu")
    try:
        local = find()
    except NoLocalGpu as e:
        return TargetChoice(DEFAULT_GPU, "default", f"the default: no GPU here, {e}")
    key = described_as(local.name)
    if key is None:
        return TargetChoice(
            DEFAULT_GPU,
            "default",
            f"the default: this machine's {local.name} is not one plan describes "
            f"({', '.join(GPUS)}); choose one with --target-gpu",
        )
    spec = GPUS[key]
    why = "this machine's GPU"
    if local.memory_mib is not None and local.memory_mib != spec.memory_mib:
        # e.g. an H100 NVL (94 GB) planned as the 80 GB part: the memory figures are the latter's
        why += (
            f", {local.name} with {local.memory_mib} MiB, planned with the {key}'s "
            f"{spec.memory_mib} MiB"
        )
    elif local.name != spec.device_name:
        why += f", {local.name}"
    return TargetChoice(key, "local", why)
