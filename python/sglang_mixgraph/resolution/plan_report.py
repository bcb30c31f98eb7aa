"""What `plan` does behind its front (cli/plan.py): resolve, plan, report.

`run` selects the described target GPU before anything imports `sglang.srt`, prepares the
server arguments (on the embedded reference deployment without --model-path, presets.py),
runs SGLang's own resolution (resolve.py) and the planner, and prints `plan_report` as JSON or
as text (`print_plan`): the inputs, what SGLang will do, the capture estimate and the advice
(plan_format.py), then each patch read through its `Patch` record: an active one's note
(`explain`), and for one that is off what each of its switches would do here
(`if_switched_on`). sglang is imported inside the functions only.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

from sglang_mixgraph.resolution.local_gpu import TargetChoice, choose_target
from sglang_mixgraph.resolution.plan_format import (
    NOT_LOADED,
    SCHEMA_VERSION,
    advice_lines,
    decision_lines,
    estimate_lines,
    graph_plan_json,
)
from sglang_mixgraph.resolution.presets import DEFAULT_PRESET, PRESETS


def _on_value(flag) -> str:
    """The first accepted value of a switch that is not its off value."""
    off = flag.field.parse(flag.off_value)
    return next(v for v in flag.accepted if flag.field.parse(v) != off)


def if_switched_on(patch, graph) -> dict[str, str]:
    """For a patch that is off: what each of its switches would do in this deployment, by
    "FLAG=value" (its `explain_if_on`, else its `explain`, else its summary)."""
    if patch.explain_if_on is not None:
        return patch.explain_if_on(graph)
    what = patch.explain(graph) if patch.explain is not None else patch.summary
    return {f"{flag.name}={_on_value(flag)}": what for flag in patch.switches}


def plan_report(
    resolution: Any,
    graph: Any,
    target: TargetChoice,
    argv: list[str],
    default_deployment: bool,
    user_argv: list[str] | None = None,
    model_note: str | None = None,
    preset: str = DEFAULT_PRESET,
) -> dict[str, Any]:
    """`plan --json`: what was planned and how, the patches' notes, and the planner's result
    ("graph"), which alone holds the deployment facts and the graph configuration."""
    from sglang_mixgraph.patches import all_patches
    from sglang_mixgraph.registry import evaluate
    from sglang_mixgraph.resolution.dsa_surface import dsa_surface

    r = resolution.resolved
    loaded = resolution.plugin.loaded
    patches = []
    for patch in all_patches():
        status = evaluate(patch)
        entry = {
            "id": patch.id,
            "status": status.state if loaded else NOT_LOADED,
            "status_if_loaded": status.state,
            "reason": status.reason,
        }
        if loaded and status.enabled and status.error is None and patch.explain is not None:
            entry["note"] = patch.explain(graph)
        if loaded and status.state == "off":
            entry["if_on"] = if_switched_on(patch, graph)
        patches.append(entry)
    return {
        "schema_version": SCHEMA_VERSION,
        # the GPU in words is graph.gpu
        "assumed_gpu": {
            "name": resolution.gpu.name,
            "sm": resolution.gpu.sm,
            "memory_bytes": resolution.gpu.memory_bytes,
            # "given" (--target-gpu), "local" (this machine's) or "default", and that in words
            "source": target.source,
            "why": target.why,
        },
        "server_args": argv,
        "default_deployment": default_deployment,
        "preset": PRESETS[preset].description if default_deployment else None,
        "arguments_on_top": list(user_argv or []) if default_deployment else [],
        "plugin": {"loaded": loaded, "reason": resolution.plugin.reason},
        "model_path": r["model_path"],
        "model_class_note": model_note,
        "attention_backend": r["attention_backend"],
        "moe_runner_backend": r["moe_runner_backend"],
        "patches": patches,
        "graph": graph_plan_json(graph),
        "dsa_surface": dsa_surface(resolution),
    }


def print_plan(p: dict[str, Any], graph: Any, verbose: bool = False) -> None:
    print(f"target GPU: {graph.gpu} ({p['assumed_gpu']['why']})")
    if p["default_deployment"]:
        line = f"deployment: the embedded reference ({p['preset']})"
        if p["arguments_on_top"]:
            line += " with your arguments on top: " + " ".join(p["arguments_on_top"])
        print(line)
    print("server args: " + " ".join(p["server_args"]))
    if p["plugin"]["loaded"]:
        print(f"plugin: loaded ({p['plugin']['reason']})")
    else:
        print(
            f"plugin: NOT LOADED: {p['plugin']['reason']}; this is SGLang's own resolution, "
            "without sglang-mixgraph's hooks"
        )
    if p.get("model_class_note"):
        print(f"model: {p['model_class_note']}")
    print(f"attention backend: {p['attention_backend']}; MoE runner: {p['moe_runner_backend']}")
    # What SGLang will do, then the estimate of what it captures, then the advice.
    for line in decision_lines(graph) + p["dsa_surface"] + estimate_lines(graph, verbose):
        print(line)
    for line in advice_lines(graph):
        print(line)
    print("Patches:")
    if not p["patches"]:
        print("  (none)")
    for patch in p["patches"]:
        line = f"  {patch['id']}: {patch['status']}"
        if patch["status"] == NOT_LOADED:
            line += f" (if loaded: {patch['status_if_loaded']})"
        if patch.get("note"):
            line += f" - {patch['note']}"
        print(line)
        for setting, what in patch.get("if_on", {}).items():
            print(f"    with {setting}: {what}")
        if patch["reason"] and patch["status"] != NOT_LOADED:
            for reason_line in patch["reason"].splitlines():
                print(f"      {reason_line}")


def _plan_error(message: str) -> None:
    print(f"sglang-mixgraph plan: {message}", file=sys.stderr)


def run(args, server_argv: list[str]) -> int:
    """The command on its parsed arguments and the SGLang server arguments: the report on
    stdout, or one line on stderr; the exit status."""
    if args.json:
        # Keep stdout pure JSON; SGLang logs to stderr through the root logger.
        logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    from sglang_mixgraph.resolution.errors import explain_failure
    from sglang_mixgraph.resolution.plan_inputs import (
        PlanInputError,
        invalid_environment,
        prepare_argv,
    )
    from sglang_mixgraph.resolution.resolve import (
        graph_plan_of,
        model_class_problem,
        resolve,
        select_described_platform,
    )

    target = choose_target(args.target_gpu)
    select_described_platform(target.name)
    preset = PRESETS[args.preset or DEFAULT_PRESET]
    try:
        prepared = prepare_argv(server_argv, reference_argv=preset.argv)
        if args.preset and not prepared.on_reference:
            raise PlanInputError("--preset plans an embedded deployment; drop it or --model-path")
        if prepared.on_reference:
            for key, value in preset.env.items():
                os.environ.setdefault(key, value)
        problems = invalid_environment()
        if problems:
            for problem in problems:
                _plan_error(problem)
            return 1
        resolution = resolve(prepared.argv, gpu=target.name)
        model_error, model_note = model_class_problem(resolution)
        if model_error is not None:
            raise PlanInputError(model_error)
    except PlanInputError as e:
        _plan_error(str(e))
        return e.exit_code
    except SystemExit as e:  # a patch that cannot apply stops SGLang's startup (plugin.register)
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            return 1
        raise
    except Exception as e:  # SGLang's own resolution errors (ValueError, AssertionError, ...)
        _plan_error(explain_failure(e))
        return 1
    graph = graph_plan_of(resolution)
    report = plan_report(
        resolution,
        graph,
        target,
        prepared.argv,
        prepared.on_reference,
        prepared.user_argv,
        model_note,
        args.preset or DEFAULT_PRESET,
    )
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print_plan(report, graph, args.verbose)
    return 0
