"""SGLang's own load generator and GSM8K eval, and the token check, invoked per cell; nothing
here measures anything.

Load: `python -m sglang.benchmark.serving` (the module `sglang.bench_serving` now forwards
to) with `--max-concurrency` (or `--request-rate`) per cell, `--goodput` when the
configuration has SLOs, the `--gsp-*` flags of the shared-prefix workload, and
`--output-file`: it appends one JSON line with its metrics (`benchmark`, the `result` dict,
goodput included) that is kept as the cell's raw output. Its progress bar stays on: the log
it writes is where progress.py reads the requests done during a long cell.

Accuracy: the GSM8K eval SGLang's CI runs for DeepSeek-V4 and GLM-5 (`sglang.test.run_eval`
with `eval_name="gsm8k"`, `api="completion"`, `max_tokens=512`, few-shot): its `__main__`
block has no file output of its own, so `gsm8k_eval` calls `run_eval` with the arguments the
CI tests pass and writes the metrics dict it returns.

Tokens: `greedy_tokens` sends the `[tokens]` prompts greedily to the native `/generate` and
writes their output ids, the same prompts for every arm and visit.

All run as child processes of this interpreter (`Invoker`); the runner can be given another
invoker (the tests run the same modules in-process to keep CPU runs short).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from sglang_mixgraph.ab.config import CONCURRENCY, Config, Point

GSM8K_MODULE = "sglang_mixgraph.ab.gsm8k_eval"
TOKENS_MODULE = "sglang_mixgraph.ab.greedy_tokens"
WATCH_S = 0.5
TIMED_OUT = -9999


class Invoker(Protocol):
    def __call__(
        self,
        module: str,
        argv: list[str],
        log_path: Path,
        timeout_s: float,
        watch: Callable[[], None],
    ) -> int:
        """Run `python -m module *argv`, output to log_path; `watch` raises to abort it.

        Returns the exit status, or TIMED_OUT.
        """


def subprocess_invoker(
    module: str,
    argv: list[str],
    log_path: Path,
    timeout_s: float,
    watch: Callable[[], None],
) -> int:
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    return proc.wait(timeout=WATCH_S)
                except subprocess.TimeoutExpired:
                    pass
                watch()  # a dead server makes the client wait on retries; stop it now
                if time.monotonic() > deadline:
                    return TIMED_OUT
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def bench_argv(config: Config, url: str, point: Point, output_file: Path) -> list[str]:
    sw = config.sweep
    shape = sw.shape(point.shape)
    argv = [
        "--backend",
        sw.backend,
        "--base-url",
        url,
        "--dataset-name",
        sw.dataset,
    ]
    if sw.shared_prefix is not None:
        argv += sw.shared_prefix.flags()
    else:
        argv += [
            "--random-input-len",
            str(shape.input_len),
            "--random-output-len",
            str(shape.output_len),
            "--random-range-ratio",
            str(shape.range_ratio),
        ]
    argv += ["--num-prompts", str(sw.prompts(point))]
    if point.kind == CONCURRENCY:
        argv += ["--max-concurrency", str(int(point.value))]
    else:  # Poisson arrivals at this rate, no cap on how many are in flight
        argv += ["--request-rate", f"{point.value:g}"]
    argv += [
        "--warmup-requests",
        str(sw.warmup(point)),
        "--seed",
        str(sw.seed),
        "--output-file",
        str(output_file),
    ]
    if sw.flush_cache:
        argv.append("--flush-cache")
    if sw.dataset_path:
        argv += ["--dataset-path", sw.dataset_path]
    if config.slo.limits:
        # bench_serving computes goodput itself (sglang.benchmark.goodput.calculate_goodput)
        # and writes request_goodput and slo_attainment into its result line.
        argv += ["--goodput", *config.slo.goodput_args()]
    return argv + list(sw.extra_args)


def gsm8k_argv(config: Config, url: str, output_file: Path) -> list[str]:
    g = config.gsm8k
    argv = [
        "--base-url",
        url,
        "--num-examples",
        str(g.num_examples),
        "--num-shots",
        str(g.num_shots),
        "--num-threads",
        str(g.parallel),
        "--max-tokens",
        str(g.max_tokens),
        "--out",
        str(output_file),
    ]
    if g.data_path:
        argv += ["--data-path", g.data_path]
    return argv


def tokens_argv(config: Config, url: str, output_file: Path) -> list[str]:
    t = config.tokens
    return [
        "--base-url",
        url,
        "--prompts",
        str(t.prompts),
        "--input-len",
        str(t.input_len),
        "--output-len",
        str(t.output_len),
        "--seed",
        str(t.seed),
        "--timeout-s",
        f"{t.timeout_s:g}",
        "--out",
        str(output_file),
    ]
