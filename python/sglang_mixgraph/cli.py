"""`sglang-mixgraph doctor | plan`: what is installed and active, and what a deployment resolves to.

`plan` runs SGLang's own argument parser and resolution (see resolve.py) for a
described target GPU, so it works on a machine without one. It selects the
described-GPU platform before anything imports `sglang.srt`: this module imports
sglang only inside the commands.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import textwrap
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from sglang_mixgraph.core.capture_memory import fmt_bytes
from sglang_mixgraph.presets import GLM5_ARGS, GLM5_DESCRIPTION
from sglang_mixgraph.target_gpu import DEFAULT_GPU, GPUS

EMBEDDED_MODEL_DIR = Path(__file__).parent / "data" / "dsv4_pro"
MEGA_MOE_CAP_ENV = "SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK"

# The reference deployment: DSV4-Pro on 8 GPUs, tp 8 with attention DP over 8 ranks,
# MegaMoE, mixed chunk, 256 running requests and 2816 prefill tokens per rank. SGLang takes
# both sizes globally and divides by the attention-DP size (sglang.srt.arg_groups.parallel_hook
# `handle_data_parallelism`; `max_running_requests // attn_dp_size` in
# sglang.srt.model_executor.pool_configurator). `plan` without --model-path plans it, with the
# user's server arguments applied on top.
REFERENCE_DP = 8
REFERENCE_ARGS = [
    "--model-path",
    str(EMBEDDED_MODEL_DIR),
    "--tp",
    "8",
    "--attn-dp-size",
    str(REFERENCE_DP),
    "--enable-mixed-chunk",
    "--moe-a2a-backend",
    "megamoe",
    "--chunked-prefill-size",
    str(2816 * REFERENCE_DP),
    "--max-running-requests",
    str(256 * REFERENCE_DP),
]
REFERENCE_ENV = {MEGA_MOE_CAP_ENV: "2816"}
# `plan --preset NAME`: the embedded reference deployments, (argv, env, description).
PRESETS = {
    "dsv4_pro": (REFERENCE_ARGS, REFERENCE_ENV, "a DeepSeek-V4-Pro-shaped config.json, no weights"),
    "glm5": (GLM5_ARGS, {}, GLM5_DESCRIPTION),
}


def _dist_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


# ---------------------------------------------------------------- doctor


def _gpu_info() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"available": False, "reason": "torch is not installed"}
    if not torch.cuda.is_available():
        return {"available": False, "reason": "torch.cuda.is_available() is False"}
    major, minor = torch.cuda.get_device_capability(0)
    return {
        "available": True,
        "count": torch.cuda.device_count(),
        "name": torch.cuda.get_device_name(0),
        "capability": f"{major}.{minor}",
    }


NOT_LOADED = "not loaded"
# A patch's catalogue entry as doctor prints it: (label, key in the report).
CATALOGUE = (
    ("why", "why"),
    ("how", "how"),
    ("upstream PR", "upstream_pr"),
    ("retired by", "retired_by"),
)


def doctor_report() -> dict[str, Any]:
    from sglang_mixgraph.flags import FLAGS, FlagValueError
    from sglang_mixgraph.patches import all_patches
    from sglang_mixgraph.registry import PINNED_SGLANG, evaluate, target_checks
    from sglang_mixgraph.resolve import plugin_load_status
    from sglang_mixgraph.upstream_guards import guard_report

    plugin = plugin_load_status()
    guards = guard_report()
    patches = []
    for patch in all_patches():
        status = evaluate(patch)
        # Read-only checks of every target, also for patches that are off.
        checks = status.checks or target_checks(patch)
        patches.append(
            {
                "id": patch.id,
                "summary": patch.summary,
                "why": patch.why,
                "how": patch.how,
                "upstream_pr": patch.upstream_pr,
                "retired_by": patch.retired_by,
                "flags": status.flag_values,
                # Whatever the flags say, nothing applies when SGLang does not load the plugin.
                "status": status.state if plugin.loaded else NOT_LOADED,
                "status_if_loaded": status.state,
                "reason": status.reason,
                # deferred to upstream although the user switched this plugin's patch on
                "requested_but_deferred": status.deferred is not None and status.requested,
                "targets": [
                    {"target": c.target, "expected": c.expected, "found": c.found, "ok": c.ok}
                    for c in checks
                ],
            }
        )
    flags = []
    for flag in FLAGS.values():
        entry: dict[str, Any] = {
            "name": flag.name,
            "default": flag.default,
            "accepted": list(flag.accepted),
            "set": os.environ.get(flag.name),
        }
        if flag.deferred:
            # SGLang's own flag of the same name: show what SGLang reads, never ours.
            entry["owner"] = "sglang"
            entry["value"] = os.environ.get(flag.name, flag.upstream_field.default)
        else:
            try:
                entry["value"] = flag.get()
            except FlagValueError as e:
                entry["error"] = str(e)
        flags.append(entry)
    return {
        "versions": {
            "sglang": _dist_version("sglang"),
            "sglang_pinned": PINNED_SGLANG,
            "sglang_mixgraph": _dist_version("sglang-mixgraph"),
            "torch": _dist_version("torch"),
            "flash_mla": _dist_version("sgl-flash-mla"),
        },
        "gpu": _gpu_info(),
        "plugin": {"loaded": plugin.loaded, "reason": plugin.reason},
        "flags": flags,
        "patches": patches,
        "guards": guards,
        # A patch deferred to upstream fails doctor only when the user switched it on: they
        # asked for this plugin's patch and get SGLang's feature of the same name instead.
        # Unset or off, SGLang's flag is simply SGLang's, and nothing the user asked for is lost.
        "ok": all(p["status"] != "cannot apply" for p in patches)
        and not any(p["requested_but_deferred"] and plugin.loaded for p in patches)
        and all("error" not in f for f in flags)
        and all(g["ok"] for g in guards),
    }


def _print_doctor(report: dict[str, Any]) -> None:
    v = report["versions"]
    print(
        f"sglang {v['sglang']} (pinned {v['sglang_pinned']}), sglang-mixgraph {v['sglang_mixgraph']}, "
        f"torch {v['torch']}, flash_mla {v['flash_mla']}"
    )
    gpu = report["gpu"]
    print(
        "GPU: "
        + (
            f"{gpu['count']}x {gpu['name']} (SM {gpu['capability']})"
            if gpu["available"]
            else f"none ({gpu['reason']})"
        )
    )
    plugin = report["plugin"]
    if plugin["loaded"]:
        print(f"Plugin: loaded ({plugin['reason']})")
    else:
        print(f"Plugin: NOT LOADED: {plugin['reason']}; no patch applies and SGLang runs unpatched")
    print("Flags:")
    for f in report["flags"]:
        shown = f"ERROR: {f['error']}" if "error" in f else repr(f["value"])
        if f.get("owner") == "sglang":
            shown += " (SGLang's own flag: the patch owning it defers to upstream)"
        if f["set"] == "":  # as README's flag section says: empty means unset
            shown += " (set empty: unset, the default applies)"
        print(f"  {f['name']} = {shown}")
    print("Patches:")
    if not report["patches"]:
        print("  (none)")
    for p in report["patches"]:
        status = p["status"]
        if status == NOT_LOADED:
            status += f" (if loaded: {p['status_if_loaded']})"
        print(f"  {p['id']}: {status}  ({p['summary']})")
        for label, key in CATALOGUE:
            if p[key]:
                print(
                    textwrap.fill(
                        f"{label}: {p[key]}",
                        100,
                        initial_indent="      ",
                        subsequent_indent="        ",
                        break_on_hyphens=False,
                    )
                )
        if p["reason"]:
            for line in p["reason"].splitlines():
                print(f"      {line}")
        for t in p["targets"]:
            mark = "ok " if t["ok"] else "BAD"
            print(f"      [{mark}] {t['target']}: {t['found']}")
    print("Upstream guards (what the GLM-5 graph path relies on):")
    for g in report["guards"]:
        print(f"  [{'ok ' if g['ok'] else 'BAD'}] {g['name']}: {g['what']}")
        for problem in g["problems"]:
            print(f"      {problem}")
    print(
        "OK"
        if report["ok"]
        else "PROBLEMS: an enabled patch cannot apply or is switched on but deferred to upstream, "
        "a flag is invalid or an upstream guard fails"
    )


def cmd_doctor(args: argparse.Namespace) -> int:
    from sglang_mixgraph.resolve import environment_problem, quiet_import_warnings

    try:
        with quiet_import_warnings():
            report = doctor_report()
    except OSError as e:
        problem = environment_problem(e)
        if problem is None:
            raise
        print(f"sglang-mixgraph doctor: {problem}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        _print_doctor(report)
    return 0 if report["ok"] else 1


# ---------------------------------------------------------------- plan


def plan_report(
    resolution: Any,
    graph: Any,
    argv: list[str],
    default_deployment: bool,
    user_argv: list[str] | None = None,
    model_note: str | None = None,
    preset: str = "dsv4_pro",
) -> dict[str, Any]:
    from sglang.srt.environ import envs

    from sglang_mixgraph.patches import all_patches
    from sglang_mixgraph.presets import dsa_surface
    from sglang_mixgraph.registry import evaluate

    r = resolution.resolved
    graphs = r["cuda_graph_config"]
    attn_dp = r["attn_dp_size"]
    megamoe = r["moe_a2a_backend"] == "megamoe"
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
            entry["note"] = patch.explain(resolution)
        patches.append(entry)
    return {
        "assumed_gpu": {
            "name": resolution.gpu.name,
            "sm": resolution.gpu.sm,
            "memory_bytes": resolution.gpu.memory_bytes,
            "text": resolution.gpu.describe(),
        },
        "server_args": argv,
        "default_deployment": default_deployment,
        "preset": PRESETS[preset][2] if default_deployment else None,
        "arguments_on_top": list(user_argv or []) if default_deployment else [],
        "plugin": {"loaded": loaded, "reason": resolution.plugin.reason},
        "model_path": r["model_path"],
        "model_class_note": model_note,
        "tp_size": r["tp_size"],
        "attn_dp_size": attn_dp,
        "dp_attention": attn_dp > 1,
        "mixed_chunk": r["enable_mixed_chunk"],
        "chunked_prefill_size_per_dp_rank": r["chunked_prefill_size"],
        "max_running_requests": r["max_running_requests"],
        # as SGLang sizes each DP rank: max(1, max_running_requests // attn_dp_size)
        # (model_executor.pool_configurator); the graph plan's running_per_rank is the same number
        "max_running_requests_per_dp_rank": graph.facts.running_per_rank,
        "attention_backend": r["attention_backend"],
        "moe": {
            "a2a_backend": r["moe_a2a_backend"],
            "runner_backend": r["moe_runner_backend"],
            "megamoe": megamoe,
            "megamoe_max_tokens_per_rank": (
                envs.SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK.get() if megamoe else None
            ),
        },
        "prefill_graph": {
            "backend": graphs["prefill"]["backend"],
            "decided_by": _decision_json(graph.prefill.decided_by),
            "max_bs": graphs["prefill"]["max_bs"],
            "buckets": graphs["prefill"]["bs"],
        },
        "decode_graph": {
            "backend": graphs["decode"]["backend"],
            "max_bs": graphs["decode"]["max_bs"],
            "buckets": graphs["decode"]["bs"],
        },
        "patches": patches,
        "graph": graph_plan_json(graph),
        "dsa_surface": dsa_surface(resolution),
    }


# ---------------------------------------------------------------- the graph plan, as JSON and text


def _capture_json(report) -> dict[str, Any]:
    est = report.estimate
    out: dict[str, Any] = {
        "estimate": {
            "buckets": len(est.buckets),
            "largest": max(est.buckets) if est.buckets else 0,
            "bytes": est.total,
            "terms": dict(est.terms),
        },
        "model": {"hidden": report.shape.hidden_size, "hc_mult": report.shape.hidden_multiplier},
    }
    if report.shape.sparse is not None:
        out["model"]["capture_context_width"] = report.shape.sparse.context_width
        out["model"]["index_topk"] = report.shape.sparse.index_topk
    budget, verdict = report.budget, report.verdict
    if verdict is None:
        from sglang_mixgraph.graph_plan import UNKNOWN_BUDGET

        out["verdict"] = {"fits": None, "why": UNKNOWN_BUDGET}
        return out
    out["budget"] = {
        "gpu_total_bytes": budget.total_bytes,
        "mem_fraction_static": budget.mem_fraction_static,
        "outside_static_bytes": budget.outside_static,
        "reserves": dict(budget.reserves),
        "available_bytes": budget.available,
    }
    out["verdict"] = {
        "fits": verdict.fits,
        "needed_bytes": verdict.needed,
        "available_bytes": verdict.available,
        "margin_bytes": verdict.margin_bytes,
        "required_margin_fraction": verdict.margin_fraction,
    }
    if report.kv_sized_after_capture:
        out["verdict"]["note"] = (
            "the KV pool is sized after capture: capture memory comes out of the KV pool"
        )
    if not verdict.fits:
        out["advice"] = {
            "max_bs_prefill": report.advice_max_bs_prefill,
            "mem_fraction_static_at_most": report.advice_mem_fraction_static,
        }
    return out


def _bucket_list_json(side) -> dict[str, Any] | None:
    if side is None:
        return None
    pad = side.padding
    return {
        "buckets": list(side.buckets),
        "count": len(side.buckets),
        "largest": max(side.buckets),
        "contains_chunk": side.contains_top,
        "capture_bytes": side.capture.estimate.total,
        "capture_fits": side.capture.fits,
        "padding": {
            "range": [pad.lo, pad.hi],
            "count": pad.count,
            "largest": pad.largest,
            "smallest_replayed": pad.smallest_replayed,
            "eager_sizes": pad.eager_sizes,
            "worst_padding_factor": round(pad.worst_factor, 4),
            "worst_padding_tokens": pad.worst_waste_tokens,
            "mean_padding_factor": round(pad.mean_factor, 4),
        },
    }


def _decision_json(decision) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": decision.kind.value}
    if decision.rule is not None:
        out.update(rule=decision.rule, reason=decision.reason)
    elif decision.detail:
        out["detail"] = decision.detail
    return out


def _validation_json(v) -> dict[str, Any]:
    out: dict[str, Any] = {"name": v.name, "ok": v.ok, "message": v.message}
    if v.warning:
        out["severity"] = "warning"
    if v.rows is not None:
        out.update(rows=v.rows, upstream_rows=v.upstream_rows)
    return out


def uncaptured_final_list(plan) -> str | None:
    """Why the resolved prefill list differs from the upstream list shown beside it, or None.

    With the prefill graph off SGLang keeps the list it generated from the global chunked
    prefill size: `parallel_hook.handle_data_parallelism` cuts max_bs and bs to the per-rank
    chunk only when the prefill backend is not disabled. That list is never captured; with the
    graph on, SGLang would capture the upstream list (the per-rank chunk's).
    """
    if not plan.prefill_off_but_estimated or plan.buckets is None:
        return None
    final, upstream = plan.buckets.final, plan.buckets.upstream
    if upstream is None or tuple(final) == tuple(upstream.buckets):
        return None
    return (
        f"the prefill graph is off, so SGLang never captures this list: it is generated from "
        f"the size before the per-rank division (up to {max(final)}) and SGLang cuts it to the "
        f"per-rank chunk only when the graph is on; with the graph on, SGLang alone would "
        f"capture the upstream list ({len(upstream.buckets)} buckets, largest {max(upstream.buckets)})"
    )


def graph_plan_json(plan) -> dict[str, Any]:
    """`plan --json`'s "graph" part, from the planner's typed result."""
    facts = plan.facts
    capture = None
    if plan.capture is not None:
        capture = _capture_json(plan.capture)
        if plan.prefill_off_but_estimated:
            capture["note"] = "prefill graph is off; the estimate is what the final list would need"
    lists = plan.buckets
    if lists is None:
        bucket_lists: dict[str, Any] = {
            "note": "chunked prefill disabled: no per-rank chunk to derive buckets from"
        }
    else:
        bucket_lists = {
            "policy": lists.policy,
            "upstream": _bucket_list_json(lists.upstream),
            "ours": _bucket_list_json(lists.derived)
            if lists.derived is not None
            else {"error": lists.derived_error},
            "final": list(lists.final),
        }
        note = uncaptured_final_list(plan)
        if note is not None:
            bucket_lists["final_note"] = note
    return {
        "gpu": plan.gpu,
        "model": list(facts.architectures),
        "flags": dict(plan.flags),
        "deployment": {
            "tp_size": facts.tp_size,
            "attn_dp_size": facts.attn_dp_size,
            "dp_attention": facts.dp_attention,
            "enable_mixed_chunk": facts.mixed_chunk,
            "chunked_prefill_per_rank": facts.chunk_per_rank,
            "max_running_requests": facts.max_running_requests,
            "running_per_rank": facts.running_per_rank,
            "moe_a2a_backend": facts.moe_a2a_backend,
            "mega_moe_cap_per_rank": facts.mega_moe_cap,
            "mem_fraction_static": facts.mem_fraction_static,
        },
        "prefill_graph": {
            "backend": plan.prefill.backend,
            "decided_by": _decision_json(plan.prefill.decided_by),
            "rules": [
                {"name": r.name, "reason": r.reason, "action": r.action} for r in plan.prefill.rules
            ],
            "max_bs": plan.prefill.max_bs,
            "buckets": list(plan.prefill.buckets),
        },
        "decode_graph": {
            "backend": plan.decode.backend,
            "decided_by": _decision_json(plan.decode.decided_by),
            "max_bs": plan.decode.max_bs,
            "bucket_count": plan.decode.bucket_count,
        },
        "capture_memory": capture,
        "bucket_lists": bucket_lists,
        "validations": [_validation_json(v) for v in plan.validations],
        "plugin_loaded": plan.plugin_loaded,
        "ok": plan.ok,
    }


def _elided(buckets) -> str:
    """A bucket list for people: in full up to 12 entries, else its ends and its length."""
    buckets = list(buckets)
    if len(buckets) <= 12:
        return "[" + ", ".join(str(b) for b in buckets) + "]"
    return (
        "["
        + ", ".join(str(b) for b in buckets[:4])
        + ", ..., "
        + ", ".join(str(b) for b in buckets[-3:])
        + "]"
    )


def _fits_word(fits: bool | None) -> str:
    return {True: "fits", False: "does not fit", None: "unknown"}[fits]


def _bucket_side_lines(name: str, side, error: str | None = None) -> list[str]:
    if side is None:
        return [f"  {name}: {error or 'none'}"]
    pad = side.padding
    return [
        f"  {name}: {len(side.buckets)} buckets, largest {max(side.buckets)}, capture "
        f"{fmt_bytes(side.capture.estimate.total)} ({_fits_word(side.capture.fits)}),"
        f" worst padding {pad.worst_factor:.2f}x / {pad.worst_waste_tokens} tokens,"
        f" mean {pad.mean_factor:.2f}x",
        f"    {_elided(side.buckets)}",
    ]


def _decision_text(decision) -> str:
    if decision.rule is not None:
        return f"{decision.kind.value} {decision.rule!r} ({decision.reason})"
    return f"{decision.kind.value}: {decision.detail}"


def format_graph_plan(plan) -> str:
    """The planner's typed result, for people."""
    facts = plan.facts
    lines = [f"Graph plan on {plan.gpu} for {', '.join(facts.architectures) or 'model'}"]
    lines.append(
        f"  tp {facts.tp_size}, attention DP {facts.attn_dp_size} "
        f"({'on' if facts.dp_attention else 'off'}), "
        f"mixed chunk {'on' if facts.mixed_chunk else 'off'}, chunked prefill per rank "
        f"{facts.chunk_per_rank}, running requests per rank {facts.running_per_rank}"
        f" (max_running_requests {facts.max_running_requests}), MoE a2a {facts.moe_a2a_backend}"
        + (f", MegaMoE cap {facts.mega_moe_cap}" if facts.mega_moe_cap else "")
    )
    flags = ", ".join(f"{k}={v}" for k, v in plan.flags.items())
    if not plan.plugin_loaded:
        flags += " (not read: the plugin is not loaded)"
    lines.append("  flags: " + flags)
    lines.append(
        f"Prefill graph: {plan.prefill.backend} (decided by {_decision_text(plan.prefill.decided_by)})"
    )
    for r in plan.prefill.rules:
        lines.append(f"  rule {r.name!r}: {r.action}")
    dg = plan.decode
    lines.append(
        f"Decode graph: {dg.backend} ({dg.decided_by.kind.value}), max_bs {dg.max_bs}, "
        f"{dg.bucket_count} buckets"
    )
    cm = plan.capture
    if cm is not None:
        v = cm.verdict
        if v is None:
            from sglang_mixgraph.graph_plan import UNKNOWN_BUDGET

            lines.append(
                f"Capture memory: {fmt_bytes(cm.estimate.total)} needed; available unknown "
                f"({UNKNOWN_BUDGET})"
            )
        else:
            lines.append(
                f"Capture memory: {fmt_bytes(v.needed)} needed for {len(cm.estimate.buckets)} "
                f"buckets, {fmt_bytes(v.available)} available, margin {fmt_bytes(v.margin_bytes)} "
                f"-> {_fits_word(v.fits)} (needs {int(v.margin_fraction * 100)}% headroom)"
            )
            terms = ", ".join(f"{k} {fmt_bytes(b)}" for k, b in cm.estimate.terms.items())
            lines.append(f"  terms: {terms}")
        if plan.prefill_off_but_estimated:
            lines.append(
                "  note: prefill graph is off; the estimate is what the final list would need"
                + (
                    " (a list SGLang never captures: see Buckets)"
                    if uncaptured_final_list(plan)
                    else ""
                )
            )
    bl = plan.buckets
    if bl is None:
        lines.append("Buckets: chunked prefill disabled: no per-rank chunk to derive buckets from")
    else:
        lines.append(
            f"Buckets (policy {bl.policy}), final list of {len(bl.final)}: {_elided(bl.final)}"
        )
        note = uncaptured_final_list(plan)
        if note is not None:
            lines.append(f"  note: {note}")
        lines += _bucket_side_lines("upstream", bl.upstream)
        lines += _bucket_side_lines("derived ", bl.derived, bl.derived_error)
    if plan.plugin_loaded:
        lines.append("Validations:")
    else:
        lines.append(
            "Validations (sglang-mixgraph's startup checks; not run, the plugin is not loaded):"
        )
    for v in plan.validations:
        mark = "ok" if v.ok else ("WARN" if v.warning else "FAIL")
        lines.append(f"  [{mark}] {v.name}: {v.message}")
    return "\n".join(lines)


def _print_plan(p: dict[str, Any], graph: Any) -> None:
    print(f"assumed GPU: {p['assumed_gpu']['text']}")
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
    moe = p["moe"]
    print(f"attention backend: {p['attention_backend']}; MoE runner: {moe['runner_backend']}")
    print(format_graph_plan(graph))
    for line in p["dsa_surface"]:
        print(line)
    print("patches:")
    if not p["patches"]:
        print("  (none)")
    for patch in p["patches"]:
        line = f"  {patch['id']}: {patch['status']}"
        if patch["status"] == NOT_LOADED:
            line += f" (if loaded: {patch['status_if_loaded']})"
        if patch.get("note"):
            line += f" - {patch['note']}"
        print(line)
        if patch["reason"] and patch["status"] != NOT_LOADED:
            for reason_line in patch["reason"].splitlines():
                print(f"      {reason_line}")


def _plan_error(message: str) -> None:
    print(f"sglang-mixgraph plan: {message}", file=sys.stderr)


def cmd_plan(args: argparse.Namespace, server_argv: list[str]) -> int:
    from sglang_mixgraph.graph_plan import graph_plan
    from sglang_mixgraph.resolve import (
        PlanInputError,
        explain_failure,
        invalid_environment,
        model_class_problem,
        prepare_argv,
        resolve,
        select_described_platform,
    )

    select_described_platform(args.target_gpu)
    reference_argv, reference_env, _ = PRESETS[args.preset or "dsv4_pro"]
    try:
        prepared = prepare_argv(server_argv, reference_argv=reference_argv)
        if args.preset and not prepared.on_reference:
            raise PlanInputError("--preset plans an embedded deployment; drop it or --model-path")
        if prepared.on_reference:
            for key, value in reference_env.items():
                os.environ.setdefault(key, value)
        problems = invalid_environment()
        if problems:
            for problem in problems:
                _plan_error(problem)
            return 1
        resolution = resolve(prepared.argv, gpu=args.target_gpu)
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
    graph = graph_plan(resolution)
    report = plan_report(
        resolution,
        graph,
        prepared.argv,
        prepared.on_reference,
        prepared.user_argv,
        model_note,
        args.preset or "dsv4_pro",
    )
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        _print_plan(report, graph)
    return 0


# ---------------------------------------------------------------- entry


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-mixgraph",
        description="Inspect the sglang-mixgraph plugin and plan SGLang deployments.",
        allow_abbrev=False,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser(
        "doctor",
        help="versions, GPU, every flag and patch with its target checks",
        allow_abbrev=False,
    )
    doctor.add_argument("--json", action="store_true", help="print JSON")
    plan = sub.add_parser(
        "plan",
        help="resolve SGLang server arguments as launch_server would, for a target GPU",
        description=(
            "Resolve SGLang server arguments exactly as `python -m sglang.launch_server` would "
            "(with this plugin loaded) without starting anything. Arguments not listed here are "
            "SGLang server arguments. Without --model-path they are applied on top of the "
            "embedded reference deployment (each option given replaces the reference's value)."
        ),
        allow_abbrev=False,
    )
    plan.add_argument("--json", action="store_true", help="print JSON")
    sub.add_parser("ab", add_help=False, help="A/B sweeps of serving speed and GSM8K (docs/ab.md)")
    plan.add_argument(
        "--preset",
        choices=list(PRESETS),
        help="embedded deployment to plan when --model-path is not given (default dsv4_pro)",
    )
    plan.add_argument(
        "--target-gpu",
        default=DEFAULT_GPU,
        type=str.upper,
        choices=list(GPUS),
        help=f"GPU to describe to SGLang (default {DEFAULT_GPU})",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["ab"]:  # its own parser: run / report
        from sglang_mixgraph.ab.cli import main as ab_main

        return ab_main(argv[1:])
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "doctor":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return cmd_doctor(args)
    if args.json:
        # Keep stdout pure JSON; SGLang logs to stderr through the root logger.
        logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    return cmd_plan(args, rest)


if __name__ == "__main__":
    sys.exit(main())
