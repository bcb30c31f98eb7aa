"""The planner's typed result (`graph_plan.GraphPlan`) as `plan` shows it: JSON and text.

`graph_plan_json` is the "graph" part of `plan --json`; `format_graph_plan` the text block of
`plan`. Both read only the typed result, never the server arguments, so the JSON and the text
cannot tell different stories.
"""

from __future__ import annotations

from typing import Any

from sglang_mixgraph.core.capture_memory import fmt_bytes

# The version of the JSON documents `plan --json` and `doctor --json` print; raised when a key
# changes meaning or type or goes away (new keys keep it).
SCHEMA_VERSION = 1


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
        },
        "decode_graph": {
            "backend": plan.decode.backend,
            "decided_by": _decision_json(plan.decode.decided_by),
            "max_bs": plan.decode.max_bs,
            "buckets": list(plan.decode.buckets),
        },
        "capture_memory": capture,
        "bucket_lists": bucket_lists,
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
