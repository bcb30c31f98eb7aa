"""Resolve SGLang server arguments as `python -m sglang.launch_server` would, without starting anything.

Same parser and resolution pipeline: `prepare_server_args` then
`ServerArgs.resolve_once()` (sglang/launch_server.py, sglang/srt/server_args.py:244),
with the plugin's hooks loaded by `load_plugins()` first, and the target GPU
described to SGLang by `target_gpu.described_gpu`. The caller's process must have
selected the described-GPU platform before importing `sglang.srt`
(`select_described_platform()`), which `plan` and the tests' conftest do.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from sglang_mixgraph.target_gpu import (
    DEFAULT_GPU,
    DESCRIBED_GPU_ENV,
    PLATFORM_PLUGIN_NAME,
    GpuSpec,
)


def select_described_platform(gpu: str = DEFAULT_GPU) -> None:
    """Call before anything imports `sglang.srt`: SGLang picks its platform once per process."""
    os.environ["SGLANG_PLATFORM"] = PLATFORM_PLUGIN_NAME
    os.environ.setdefault(DESCRIBED_GPU_ENV, gpu)


@dataclass
class Resolution:
    gpu: GpuSpec
    server_args: Any  # sglang.srt.server_args.ServerArgs, resolved
    resolved: dict[str, Any]
    logs: list[logging.LogRecord] = field(default_factory=list)

    def messages(self, logger_prefix: str = "") -> list[str]:
        return [r.getMessage() for r in self.logs if r.name.startswith(logger_prefix)]


class _Collector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def resolve(argv: list[str], gpu: str = DEFAULT_GPU) -> Resolution:
    """Parse and resolve `argv` (launch_server arguments) for a deployment on `gpu`.

    Errors are SGLang's own (argparse's SystemExit, ValueError, AssertionError, ...).
    """
    from sglang.srt.plugins import load_plugins

    from sglang_mixgraph.target_gpu import described_gpu

    load_plugins()
    collector = _Collector()
    # On SGLang's package logger and ours, not the root: resolution may reconfigure root
    # handlers. Our patches log to "sglang_mixgraph" while SGLang resolves.
    loggers = [logging.getLogger("sglang"), logging.getLogger("sglang_mixgraph")]
    previous_levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(collector)
        lg.setLevel(logging.INFO)
    try:
        with described_gpu(gpu) as spec:
            from sglang.srt.server_args import prepare_server_args

            server_args = prepare_server_args(list(argv))
            server_args.resolve_once()
            resolved = server_args.resolved_dict()
    finally:
        for lg, level in zip(loggers, previous_levels):
            lg.removeHandler(collector)
            lg.setLevel(level)
    return Resolution(gpu=spec, server_args=server_args, resolved=resolved, logs=collector.records)
