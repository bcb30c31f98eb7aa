"""A stand-in `nvidia-smi` on PATH: what `plan` reads as this machine's GPU, made up.

``fake_nvidia_smi(directory, answer)`` writes an executable ``nvidia-smi`` into ``directory``
that prints ``answer`` (the lines ``--query-gpu=name,memory.total --format=csv,noheader,nounits``
would, e.g. "NVIDIA H100 80GB HBM3, 81559", or bytes that need not be UTF-8) and exits 0, or,
with ``answer=None``, prints the driver failure nvidia-smi prints on a machine without a
working GPU and exits 9. It
returns the environment's PATH with ``directory`` first, so that tests of the local-GPU
default (resolution/local_gpu.py) do not depend on the machine they run on.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)


def fake_nvidia_smi(directory: Path, answer: str | bytes | None) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    text, code = (NO_DRIVER, 9) if answer is None else (answer, 0)
    printed = directory / "nvidia-smi.out"
    printed.write_bytes(text if isinstance(text, bytes) else text.encode() + b"\n")
    script = directory / "nvidia-smi"
    script.write_text(f"#!/bin/sh\ncat {shlex.quote(str(printed))}\nexit {code}\n")
    script.chmod(0o755)
    return os.pathsep.join([str(directory), os.environ.get("PATH", "")])
