"""The planner's typed result (`graph_plan.GraphPlan`) as `plan` shows it: JSON and text.

`graph_plan_json` is the "graph" part of `plan --json`; the text is in three parts, in this
order: `decision_lines` (what SGLang will do: the graphs on or off, their buckets, the rule),
`estimate_lines` (the capture estimate, only for a list SGLang captures, labelled with the
model and GPU it was fitted on; elsewhere "uncalibrated" instead of a verdict; for a
DeepSeek-V4 model then the split cost model's calibration in a line, its sources only when
verbose) and
`advice_lines`; `format_graph_plan` joins them. The words they share with the graph-config
patch (a list's capture in words, the estimate's calibration) are the planner's (plan_words).
All read only the typed result, never the server arguments, so the JSON and the text cannot
tell different stories.
"""

from __future__ import annotations

from typing import Any

from sglang_mixgraph.core.capture_memory import CALIBRATION, fmt_bytes
from sglang_mixgraph.planner.plan_words import (
    auto_stands_aside,
    calibration_gap,
    capture_words,
    estimate_applies,
    fits_word,
    gpu_name,
)

# The version of the JSON documents `plan --json` and `doctor --json` print; raised when a key
# changes meaning or type or goes away (new keys keep it).
SCHEMA_VERSION = 1
# A patch's status in both documents when SGLang would not load the plugin at all.
NOT_LOADED = "not loaded"


def typed_flag_values(names) -> dict[str, Any]:
    """Each flag's parsed value (a bool, number or word, as JSON types it), by name."""
    from sglang_mixgraph.flags import FLAGS, FlagValueError

    values: dict[str, Any] = {}
    for name in names:
        try:
            values[name] = FLAGS[name].get()
        except FlagValueError as e:
            values[name] = {"error": str(e)}
    return values


def _capture_json(report, calibrated: bool) -> dict[str, Any]:
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
        from sglang_mixgraph.planner.graph_plan import UNKNOWN_BUDGET

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
    out["verdict"]["calibrated"] = calibrated
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


def _bucket_list_json(side, applies: bool) -> dict[str, Any] | None:
    """One list as JSON; its capture figure and grade only where the estimate applies."""
    if side is None:
        return None
    pad = side.padding
    return {
        "buckets": list(side.buckets),
        "count": len(side.buckets),
        "largest": max(side.buckets),
        "contains_chunk": side.contains_top,
        "capture_bytes": side.capture.estimate.total if applies else None,
        "capture_fits": side.capture.fits if applies else None,
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
        capture = _capture_json(plan.capture, calibration_gap(plan) is None)
        capture["applies"] = estimate_applies(plan)
        if not capture["applies"]:  # SGLang's own budget stays; no number of ours
            for key in ("estimate", "verdict", "advice"):
                capture.pop(key, None)
            capture["why"] = not_applicable(plan)
        capture["captured"] = prefill_captured(plan)
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
            "upstream": _bucket_list_json(lists.upstream, estimate_applies(plan)),
            "ours": _bucket_list_json(lists.derived, estimate_applies(plan))
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
        "flags": typed_flag_values(plan.flags),
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
            "speculative_warning": plan.speculative_warning,
        },
        "decode_graph": {
            "backend": plan.decode.backend,
            "decided_by": _decision_json(plan.decode.decided_by),
            "max_bs": plan.decode.max_bs,
            "buckets": list(plan.decode.buckets),
        },
        "memory": memory_json(plan.memory),
        "capture_memory": capture,
        "capture_calibration": {
            "model": CALIBRATION.model,
            "architectures": list(CALIBRATION.architectures),
            "gpus": list(CALIBRATION.gpus),
            "not_calibrated_for": calibration_gap(plan),
        },
        "bucket_lists": bucket_lists,
        # mixed_split's adaptive policy: where its cost model's coefficients come from (DSV4 only).
        "split_cost_calibration": split_cost_calibration(plan),
        "validations": [_validation_json(v) for v in plan.validations],
        "ok": plan.ok,  # the validations block only where the plugin is loaded (plugin.loaded)
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


def calibration_label(plan) -> str:
    gap = calibration_gap(plan)
    label = f"fitted on {CALIBRATION.model} on the {CALIBRATION.gpu_words}"
    return label if gap is None else f"{label}; no measurement of {gap}"


def not_applicable(plan) -> str:
    arch = ", ".join(plan.facts.architectures) or "this model"
    return (
        f"the capture estimate does not apply to {arch} (fitted on {CALIBRATION.model} on the "
        f"{CALIBRATION.gpu_words} only): no fit verdict, no memory advice"
    )


def _bucket_side_lines(plan, name: str, side, error: str | None = None) -> list[str]:
    if side is None:
        return [f"  {name}: {error or 'none'}"]
    pad = side.padding
    return [
        f"  {name}: {len(side.buckets)} buckets, largest {max(side.buckets)}, "
        f"{capture_words(plan, side)},"
        f" worst padding {pad.worst_factor:.2f}x / {pad.worst_waste_tokens} tokens,"
        f" mean {pad.mean_factor:.2f}x",
        f"    {_elided(side.buckets)}",
    ]


def _decision_text(decision) -> str:
    if decision.rule is not None:
        return f"{decision.kind.value} {decision.rule!r} ({decision.reason})"
    return f"{decision.kind.value}: {decision.detail}"


def prefill_captured(plan) -> bool:
    """Whether SGLang will capture a prefill bucket list (the graph is on and has buckets)."""
    return not plan.prefill_off_but_estimated and plan.capture is not None


def decision_lines(plan) -> list[str]:
    """What SGLang will do: the graphs, on or off, their buckets and what decided them."""
    facts, pg, dg = plan.facts, plan.prefill, plan.decode
    lines = [f"What SGLang will do on {plan.gpu} for {', '.join(facts.architectures) or 'model'}:"]
    chunk = f"per rank {facts.chunk_per_rank}" if facts.chunked else "off"
    running = (
        "sized at startup from the KV pool"
        if facts.max_running_requests is None
        else f"per rank {facts.running_per_rank} (max_running_requests "
        f"{facts.max_running_requests})"
    )
    lines.append(
        f"  tp {facts.tp_size}, attention DP {facts.attn_dp_size} "
        f"({'on' if facts.dp_attention else 'off'}), "
        f"mixed chunk {'on' if facts.mixed_chunk else 'off'}, chunked prefill {chunk}, "
        f"running requests {running}, MoE a2a {facts.moe_a2a_backend}"
        + (f", MegaMoE cap {facts.mega_moe_cap}" if facts.mega_moe_cap else "")
    )
    lines += memory_lines(plan)
    flags = ", ".join(f"{k}={v}" for k, v in plan.flags.items())
    if not plan.plugin_loaded:
        flags += " (not read: the plugin is not loaded)"
    lines.append("  flags: " + flags)
    on = "ON" if prefill_captured(plan) else "OFF"
    lines.append(
        f"  Prefill graph: {on} ({pg.backend}), decided by {_decision_text(pg.decided_by)}"
    )
    for r in pg.rules:
        lines.append(f"    rule {r.name!r}: {r.action}")
    if plan.speculative_warning is not None:
        lines.append(f"    WARNING: {plan.speculative_warning}")
    bl = plan.buckets
    policy = f" (policy {bl.policy})" if bl is not None else ""
    if on == "ON":
        lines.append(
            f"  Prefill buckets{policy}: {len(pg.buckets)} captured, {_elided(pg.buckets)}"
        )
    elif bl is None:
        lines.append("  Prefill buckets: none (chunked prefill disabled)")
    else:
        final = bl.final
        resolved = f"; the resolved list has {len(final)}, {_elided(final)}" if final else ""
        lines.append(
            f"  Prefill buckets{policy}: none captured (the prefill graph is off{resolved})"
        )
        note = uncaptured_final_list(plan)
        if note is not None:
            lines.append(f"    note: {note}")
    if dg.max_bs is None or not dg.buckets:
        lines.append(f"  Decode graph: {dg.backend} ({dg.decided_by.kind.value}), no buckets")
    else:
        lines.append(
            f"  Decode graph: {dg.backend} ({dg.decided_by.kind.value}), max_bs {dg.max_bs}, "
            f"{dg.bucket_count} buckets"
        )
    if not plan.validations:
        return lines
    if plan.plugin_loaded:
        lines.append("Validations:")
    else:
        lines.append(
            "Validations (sglang-mixgraph's startup checks; not run, the plugin is not loaded):"
        )
    for v in plan.validations:
        mark = "ok" if v.ok else ("WARN" if v.warning else "FAIL")
        lines.append(f"  [{mark}] {v.name}: {v.message}")
    return lines


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def memory_lines(plan) -> list[str]:
    """The memory settings, then whether the weights fit the static pool and the KV tokens
    they leave (planner.memory_fit), then why the pool is smaller than it need be."""
    facts, mem, fit = plan.facts, plan.facts.memory, plan.memory
    head = f"  memory: mem_fraction_static {facts.mem_fraction_static}"
    if fit is not None:
        head += f" (static pool {_gib(fit.static_bytes)} of {_gib(fit.gpu_bytes)} a GPU)"
    lines = [f"{head}, page size {facts.page_size}, KV cache dtype {mem.kv_cache_dtype}"]
    if fit is None:
        return lines
    if fit.weights_bytes is None:
        lines.append(f"  weights: not estimated ({fit.weights_note})")
    else:
        parts = ", ".join(
            f"{name} {v / (1 << 30):.1f}"
            for name, v in sorted(fit.weights_by_group.items(), key=lambda kv: -kv[1])
        )
        line = (
            f"  weights: at least {_gib(fit.weights_bytes)} a GPU ({fit.weights_note}; {parts} GiB)"
        )
        if not fit.fits:
            line += (
                f": DOES NOT FIT: {_gib(fit.shortfall_bytes)} over the static pool "
                f"({_gib(fit.static_bytes)}); SGLang would stop at startup with no memory left "
                "for the KV cache"
            )
        lines.append(line)
        lines.append("  KV cache: " + _kv_words(fit, mem.max_total_tokens))
    if fit.reserve_warning:
        lines.append(f"  WARNING: {fit.reserve_warning}")
    return lines


def _kv_words(fit, max_total_tokens: int | None) -> str:
    if not fit.fits:
        return "none left"
    left = f"{_gib(fit.kv_budget_bytes)} left by the weights"
    if max_total_tokens:
        return f"{left}; {max_total_tokens} tokens a GPU (--max-total-tokens)"
    if fit.kv_tokens is None:
        return f"{left}; tokens not estimated: {fit.kv_note}"
    if fit.kv_swa_tokens is not None:  # DeepSeek-V4, as SGLang's DSV4PoolConfigurator sizes it
        return (
            f"{left}: about {fit.kv_tokens} tokens a GPU (full-attention tokens; SWA tokens "
            f"{fit.kv_swa_tokens}) at about {round(fit.kv_cell_bytes)} bytes a full-attention token"
        )
    return f"{left}: about {fit.kv_tokens} tokens a GPU at {fit.kv_cell_bytes} bytes a token"


def memory_json(fit) -> dict[str, Any] | None:
    """`plan --json`'s "memory": the figures of the memory line, in bytes."""
    if fit is None:
        return None
    return {
        "gpu_bytes": fit.gpu_bytes,
        "mem_fraction_static": fit.mem_fraction_static,
        "static_pool_bytes": fit.static_bytes,
        "weights_bytes_per_gpu": fit.weights_bytes,
        "weights_by_group": dict(fit.weights_by_group),
        "weights_note": fit.weights_note,
        "weights_fit": fit.fits,
        "shortfall_bytes": fit.shortfall_bytes,
        "kv_budget_bytes": fit.kv_budget_bytes if fit.fits else 0,
        "kv_bytes_per_token": fit.kv_cell_bytes,
        "kv_tokens_per_gpu": fit.kv_tokens if fit.fits else 0,
        "kv_swa_tokens_per_gpu": fit.kv_swa_tokens if fit.fits else None,
        "kv_note": fit.kv_note or None,
        "reserve_warning": fit.reserve_warning,
    }


def split_cost_calibration(plan) -> dict | None:
    """For a DeepSeek-V4 model: the calibration the mixed_split patch's adaptive policy would
    load on the target GPU (``split_cost_model.calibration_info``: the file and its
    architecture, and the source of the per-layer, eager and step coefficients); else None."""
    if not plan.facts.deepseek_v4:
        return None
    from sglang_mixgraph.core import split_cost_model as scm
    from sglang_mixgraph.target_gpu import GPUS

    spec = GPUS.get(gpu_name(plan))
    return scm.calibration_info(scm.load_coefficients(f"sm{spec.sm}" if spec else None))


def estimate_lines(plan, verbose: bool = False) -> list[str]:
    """The capture estimate of the list SGLang will capture, labelled with its calibration
    (nothing about a list it never captures), then, for a DeepSeek-V4 model, the split cost
    model's calibration: one line, or with `verbose` where each coefficient comes from."""
    from sglang_mixgraph.core.split_cost_model import calibration_lines, calibration_summary

    lines = _capture_estimate_lines(plan)
    info = split_cost_calibration(plan)
    if info is not None:
        head = f"Split cost model (mixed_split, adaptive policy) on the {gpu_name(plan)}"
        if verbose:
            lines += [f"{head}:", *calibration_lines(info)]
        else:
            lines.append(f"{head}: {calibration_summary(info)} (sources: --verbose)")
    return lines


def _capture_estimate_lines(plan) -> list[str]:
    if not prefill_captured(plan):
        return [
            "Capture estimate: none (SGLang captures no prefill graph here; what the lists "
            "would need with the graph on is under Advice)"
        ]
    cm = plan.capture
    if not estimate_applies(plan):
        lines = [f"Capture estimate: none: {not_applicable(plan)}"]
        budget = cm.budget
        if budget is not None:
            lines.append(
                f"  SGLang's own budget: mem_fraction_static {budget.mem_fraction_static} leaves "
                f"{fmt_bytes(budget.outside_static)} per GPU outside the static pool for "
                "activations and CUDA graphs; SGLang sizes its KV pool from what the weights "
                "leave of the static part at startup"
            )
        return lines
    lines = [f"Capture estimate ({calibration_label(plan)}):"]
    v = cm.verdict
    if v is None:
        from sglang_mixgraph.planner.graph_plan import UNKNOWN_BUDGET

        lines.append(
            f"  {fmt_bytes(cm.estimate.total)} needed; available unknown ({UNKNOWN_BUDGET})"
        )
        return lines
    lines.append(
        f"  {fmt_bytes(v.needed)} needed for {len(cm.estimate.buckets)} buckets, "
        f"{fmt_bytes(v.available)} available, margin {fmt_bytes(v.margin_bytes)} "
        f"-> {fits_word(v.fits, calibration_gap(plan))} "
        f"(needs {int(v.margin_fraction * 100)}% headroom)"
    )
    terms = ", ".join(f"{k} {fmt_bytes(b)}" for k, b in cm.estimate.terms.items())
    lines.append(f"  terms: {terms}")
    if cm.kv_sized_after_capture:
        lines.append("  note: the KV pool is sized after capture: capture memory comes out of it")
    return lines


def advice_lines(plan) -> list[str]:
    """What to change where the estimate does not fit, and the prefill lists compared (what
    upstream and the derived policy would capture with the graph on)."""
    lines = ["Advice:"]
    cm = plan.capture
    if prefill_captured(plan) and cm.fits is False and estimate_applies(plan):
        hints = []
        if cm.advice_max_bs_prefill:
            hints.append(f"--cuda-graph-max-bs-prefill {cm.advice_max_bs_prefill}")
        if cm.advice_mem_fraction_static is not None:
            hints.append(f"--mem-fraction-static {cm.advice_mem_fraction_static} or lower")
        hints.append("fewer buckets (--cuda-graph-bs-prefill)")
        lines.append("  to fit the capture estimate: " + "; or ".join(hints))
    bl = plan.buckets
    if bl is None:
        lines.append("  no bucket lists to compare: chunked prefill is disabled")
    else:
        lines.append("  prefill bucket lists with the graph on:")
        lines += ["  " + line for line in _bucket_side_lines(plan, "upstream", bl.upstream)]
        lines += [
            "  " + line
            for line in _bucket_side_lines(plan, "derived ", bl.derived, bl.derived_error)
        ]
        aside = auto_stands_aside(plan)
        if aside is not None and bl.derived is not None:
            lines.append(f"    (SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto does not apply it: {aside})")
    return lines


def format_graph_plan(plan, verbose: bool = False) -> str:
    """The planner's typed result, for people: what SGLang will do, the capture estimate of
    the list it captures, then the advice."""
    return "\n".join(decision_lines(plan) + estimate_lines(plan, verbose) + advice_lines(plan))
