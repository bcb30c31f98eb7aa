"""`ab run --dry-run`: every launched arm resolved as `plan` resolves it, before anything starts.

Each arm's launch (`--model-path`, `[server] args`, the arm's args, with `[server] env` and the
arm's env set) goes through `plan`'s own pipeline for the GPU `plan` would choose here
(resolution/local_gpu.py: this machine's GPU, else the default): its input checks
(`plan_inputs.prepare_argv`, `invalid_environment`), SGLang's resolution (`resolution.resolve`) and
the planner. What SGLang refuses (`--tp 8 --attn-dp-size 3`, `--speculative-algorithm EAGEL`, a
model directory without `config.json`) is refused here in one line naming the arm; `[server]
gpus` (or the arm's) must be the GPUs the arm's server takes, tp x pp x dp. A model directory
that is not on this machine (the weights are on the cluster) is a warning: the arm is shown
unresolved. Callers must have selected the described GPU before `sglang.srt` was imported.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_mixgraph.ab.config import Config
from sglang_mixgraph.ab.network import local_path
from sglang_mixgraph.ab.tool_parsers import runs_launch_server

# The lines of `plan`'s decision text an arm's preview shows (resolution/plan_format.decision_lines).
GRAPH_LINES = ("Prefill graph:", "Prefill buckets", "Decode graph:", "weights:", "WARNING:")


@dataclass
class ArmPlans:
    lines: dict[str, list[str]] = field(default_factory=dict)  # arm name -> its preview
    problems: list[str] = field(default_factory=list)  # refusals, one line each
    warnings: list[str] = field(default_factory=list)


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _quiet_resolution() -> Iterator[None]:
    """SGLang's and the plugin's resolution logs kept from the terminal: `plan` shows a
    resolution, here only its lines and refusals are said. `resolution.resolve` still collects them
    on these loggers."""
    loggers = [logging.getLogger("sglang"), logging.getLogger("sglang_mixgraph")]
    saved = [lg.propagate for lg in loggers]
    for lg in loggers:
        lg.propagate = False
    try:
        yield
    finally:
        for lg, propagate in zip(loggers, saved, strict=True):
            lg.propagate = propagate


def _unreadable_model(model: str | None) -> str | None:
    """Why the model's config.json cannot be read here (a hub id, a path not on this machine)."""
    if not model or Path(model).expanduser().exists():
        return None
    return "not on this machine" if local_path(model) else "a Hugging Face id, not read here"


def gpus_of(resolved: dict[str, Any]) -> int:
    """The GPUs one server takes: tp x pp x dp replicas (attention DP lives inside tp)."""
    return int(resolved["tp_size"]) * int(resolved["pp_size"]) * int(resolved.get("dp_size") or 1)


def _resolve_arm(config: Config, arm: Any, gpu: str) -> tuple[Any, Any]:
    """(the resolution, the planner's report) of one arm; raises PlanInputError or SGLang's
    own resolution errors."""
    from sglang_mixgraph.resolution.plan_inputs import (
        PlanInputError,
        invalid_environment,
        prepare_argv,
    )
    from sglang_mixgraph.resolution.resolve import graph_plan_of, model_class_problem, resolve

    argv = ["--model-path", str(config.server.model_path), *config.server.args, *arm.args]
    with _environment({**config.server.env, **arm.env}), _quiet_resolution():
        prepared = prepare_argv(argv)
        problems = invalid_environment()
        if problems:
            raise PlanInputError(problems[0])
        resolution = resolve(prepared.argv, gpu=gpu)
        error, _ = model_class_problem(resolution)
        if error is not None:
            raise PlanInputError(error)
        return resolution, graph_plan_of(resolution)


def plan_arms(config: Config, target: Any) -> ArmPlans:
    """Each launched arm's graph lines, or why it cannot launch; `target`: plan's choice of
    GPU (`local_gpu.TargetChoice`)."""
    from sglang_mixgraph.resolution.errors import explain_failure
    from sglang_mixgraph.resolution.plan_format import decision_lines
    from sglang_mixgraph.resolution.plan_inputs import PlanInputError

    out = ArmPlans()
    refused: dict[str, list[str]] = {}  # a refusal -> the arms it holds for
    launched = [a for a in config.arms if a.url is None]
    if not launched or not runs_launch_server(config.server) or config.server.command:
        return out
    model = config.server.model_path
    unreadable = _unreadable_model(model)
    if unreadable is not None:
        out.warnings.append(
            f"[server] model_path {model!r}: {unreadable}, so the arms' server arguments are "
            "parsed but not resolved (no graph preview, no GPU count check)"
        )
        return out
    for arm in launched:
        try:
            resolution, graph = _resolve_arm(config, arm, target.name)
        except PlanInputError as e:
            refused.setdefault(str(e), []).append(arm.name)
            continue
        except SystemExit as e:  # a patch that cannot apply stops SGLang's startup
            refused.setdefault(str(e.code), []).append(arm.name)
            continue
        except Exception as e:  # SGLang's own resolution errors (ValueError, AssertionError)
            refused.setdefault(explain_failure(e), []).append(arm.name)
            continue
        gpus = arm.gpus if arm.gpus is not None else config.server.gpus
        takes = gpus_of(resolution.resolved)
        if gpus is not None and gpus != takes:
            r = resolution.resolved
            refused.setdefault(
                f"gpus = {gpus}, but its server takes tp {r['tp_size']} x pp {r['pp_size']} x "
                f"dp {r.get('dp_size') or 1} = {takes} GPUs; output tok/s per GPU would be "
                f"divided by {gpus}",
                [],
            ).append(arm.name)
        out.lines[arm.name] = [f"  resolved on {graph.gpu} ({target.why}):"] + [
            "    " + line.strip()
            for line in decision_lines(graph)
            if line.strip().startswith(GRAPH_LINES)
        ]
    for problem, names in refused.items():
        arms = ", ".join(repr(n) for n in names)
        out.problems.append(f"arm{'s' if len(names) > 1 else ''} {arms}: {problem}")
    return out
