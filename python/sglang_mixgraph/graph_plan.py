"""The graph configuration of a resolved deployment, as `sglang-mixgraph plan` reports it.

`graph_plan(resolution)` returns a JSON-serialisable dict: which prefill/decode graph
backend was chosen and what decided it, the capture-memory estimate, upstream's bucket
list against the derived one, the per-rank chunk and running requests, and the startup
validations. `format_graph_plan(d)` renders it for people. Nothing here changes the
resolution; numbers are recomputed from the resolved arguments with the same functions
the patches use (patches/graph_config.py, core/).
"""

from __future__ import annotations

from typing import Any

from sglang_mixgraph.core.capture_memory import fmt_bytes


def _lists(server_args, ctx, record, plugin_loaded: bool = True) -> dict:
    from sglang.srt.arg_groups.cuda_graph_hook import generate_prefill_cuda_graph_batch_sizes
    from sglang.srt.arg_groups.overrides import use_mla_backend

    from sglang_mixgraph.core.prefill_buckets import (
        BucketDerivationError,
        bucket_alignment,
        derive_prefill_buckets,
        padding_profile,
    )
    from sglang_mixgraph.patches.graph_config import _mega_moe_cap, capture_estimate

    cfg = ctx["cfg"]
    chunk = ctx["chunk"]
    if not chunk or chunk <= 0:
        return {"note": "chunked prefill disabled: no per-rank chunk to derive buckets from"}
    top = min(chunk, 8192) if use_mla_backend(server_args) else chunk  # memory_hook.py:233-238
    # What upstream captures with BCG on: the generic list up to the per-rank chunk
    # (memory_hook.py:265-268, parallel_hook.py:344-362).
    upstream = generate_prefill_cuda_graph_batch_sizes(top)
    cap = _mega_moe_cap(server_args)
    try:
        ours = derive_prefill_buckets(
            chunk_per_rank=top,
            running_per_rank=ctx["running_per_rank"],
            cap=cap,
            alignment=bucket_alignment(attn_tp_size=ctx["attn_tp"], deepep=ctx["a2a"] == "deepep"),
        )
    except BucketDerivationError as e:
        ours = None
        ours_error = str(e)
    final = list(cfg.cuda_graph_config.prefill.bs or [])

    def describe(buckets):
        if not buckets:
            return None
        prof = padding_profile(buckets, lo=16, hi=max(top, max(buckets)))
        est = capture_estimate(server_args, buckets, chunk)
        return {
            "buckets": list(buckets),
            "count": len(buckets),
            "largest": max(buckets),
            "contains_chunk": top in buckets,
            "capture_bytes": est["estimate"]["bytes"],
            "capture_fits": est["verdict"].get("fits"),
            "padding": prof.as_dict(),
        }

    if record is not None and record.bucket_policy:
        policy = record.bucket_policy
    else:
        policy = "upstream" if plugin_loaded else "upstream (sglang-mixgraph is not loaded)"
    out = {
        "policy": policy,
        "upstream": describe(upstream),
        "ours": describe(ours) if ours else {"error": ours_error},
        "final": final,
    }
    return out


def _prefill_decision(server_args, cfg, record) -> dict:
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase

    from sglang_mixgraph.bcg_rules import matching_rules

    locked = getattr(server_args, "_cuda_graph_config_locked", set()) or set()
    backend = cfg.cuda_graph_config.prefill.backend
    if (Phase.PREFILL, "backend") in locked:
        return {
            "kind": "user",
            "detail": f"prefill backend set explicitly to {backend!r}; no rule evaluated",
        }
    if record is not None and record.prefill_backend_source is not None:
        from sglang_mixgraph.bcg_rules import Source

        src = record.prefill_backend_source
        if src is Source.ESTIMATE:
            return {
                "kind": "estimate",
                "detail": "capture-memory estimate (replaces the blanket DeepSeek-V4 rule)",
            }
        if src is Source.FORCED:
            return {
                "kind": "force",
                "detail": "SGLANG_EXPERIMENTAL_FORCE_BCG=1 overrode the rules listed",
            }
        if src is Source.UPSTREAM_RULE:
            name = record.deciding_rule
            reason = next((m["reason"] for m in record.rule_matches if m["name"] == name), "")
            return {"kind": "upstream rule", "rule": name, "reason": reason}
        return {"kind": "upstream", "detail": src.value}
    if backend == Backend.DISABLED:
        if cfg.pp_size > 1:
            return {
                "kind": "upstream default",
                "detail": "pipeline parallelism: BCG prefill is opt-in (cuda_graph_hook.py:150-162)",
            }
        matches = matching_rules(server_args)
        if matches:
            return {"kind": "upstream rule", "rule": matches[0].name, "reason": matches[0].reason}
        return {
            "kind": "upstream",
            "detail": "disabled elsewhere in resolution (platform or feature check)",
        }
    return {
        "kind": "default",
        "detail": f"upstream default {backend!r}; no incompatibility rule holds",
    }


def graph_plan(resolution: Any) -> dict:
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase

    from sglang_mixgraph.bcg_rules import matching_rules, recorded
    from sglang_mixgraph.flags import FLAGS
    from sglang_mixgraph.patches.graph_config import (
        _ctx,
        _mega_moe_cap,
        capture_estimate,
        validations,
    )
    from sglang_mixgraph.target_gpu import described_gpu

    server_args = resolution.server_args
    plugin = getattr(resolution, "plugin", None)
    plugin_loaded = plugin is None or plugin.loaded
    record = recorded(server_args)
    with described_gpu(resolution.gpu.name):
        cfg = resolving_view(server_args)
        ctx = _ctx(server_args)
        prefill = cfg.cuda_graph_config.prefill
        decode = cfg.cuda_graph_config.decode
        locked = getattr(server_args, "_cuda_graph_config_locked", set()) or set()
        rules = (
            list(record.rule_matches)
            if record is not None and record.rule_matches
            else [
                {"name": r.name, "reason": r.reason, "action": "holds"}
                for r in matching_rules(server_args)
            ]
        )
        final = list(prefill.bs or [])
        chunk = ctx["chunk"] if ctx["chunk"] and ctx["chunk"] > 0 else (max(final) if final else 0)
        estimate = capture_estimate(server_args, final, chunk) if final else None
        checks = validations(server_args)
        plan = {
            "gpu": resolution.gpu.describe(),
            "model": list(getattr(ctx["hf"], "architectures", None) or []),
            "flags": {
                name: str(FLAGS[name].get())
                for name in ("SGLANG_EXPERIMENTAL_FORCE_BCG", "SGLANG_MIXGRAPH_PREFILL_BUCKETS")
                if name in FLAGS
            },
            "deployment": {
                "tp_size": cfg.tp_size,
                "attn_dp_size": ctx["attn_dp"],
                "dp_attention": ctx["attn_dp_enabled"],
                "enable_mixed_chunk": bool(cfg.enable_mixed_chunk),
                "chunked_prefill_per_rank": ctx["chunk"],
                "max_running_requests": cfg.max_running_requests,
                "running_per_rank": ctx["running_per_rank"],
                "moe_a2a_backend": ctx["a2a"],
                "mega_moe_cap_per_rank": _mega_moe_cap(server_args),
                "mem_fraction_static": cfg.mem_fraction_static,
            },
            "prefill_graph": {
                "backend": prefill.backend,
                "decided_by": _prefill_decision(server_args, cfg, record),
                "rules": rules,
                "max_bs": prefill.max_bs,
                "buckets": final,
            },
            "decode_graph": {
                "backend": decode.backend,
                "decided_by": {"kind": "user"}
                if (Phase.DECODE, "backend") in locked
                else {"kind": "default"},
                "max_bs": decode.max_bs,
                "bucket_count": len(decode.bs or []),
            },
            "capture_memory": estimate,
            "bucket_lists": _lists(server_args, ctx, record, plugin_loaded),
            "validations": checks,
            # Without the plugin SGLang runs none of these checks: they are reported, not enforced.
            "plugin_loaded": plugin_loaded,
        }
        if prefill.backend == Backend.DISABLED and estimate is not None:
            plan["capture_memory"]["note"] = (
                "prefill graph is off; the estimate is what the final list would need"
            )
    plan["ok"] = not plugin_loaded or all(v["ok"] or v.get("severity") == "warning" for v in checks)
    return plan


def _elided(buckets: list) -> str:
    """A bucket list for people: in full up to 12 entries, else its ends and its length."""
    if len(buckets) <= 12:
        return "[" + ", ".join(str(b) for b in buckets) + "]"
    return (
        "["
        + ", ".join(str(b) for b in buckets[:4])
        + ", ..., "
        + ", ".join(str(b) for b in buckets[-3:])
        + "]"
    )


def _fmt_bucket_side(name: str, side: dict | None) -> list[str]:
    if not side:
        return [f"  {name}: none"]
    if "error" in side:
        return [f"  {name}: {side['error']}"]
    pad = side["padding"]
    shown = _elided(side["buckets"])
    return [
        f"  {name}: {side['count']} buckets, largest {side['largest']}, capture {fmt_bytes(side['capture_bytes'])}"
        f" ({'fits' if side['capture_fits'] else 'does not fit' if side['capture_fits'] is False else 'unknown'}),"
        f" worst padding {pad['worst_padding_factor']:.2f}x / {pad['worst_padding_tokens']} tokens,"
        f" mean {pad['mean_padding_factor']:.2f}x",
        f"    {shown}",
    ]


def format_graph_plan(d: dict) -> str:
    lines = [f"Graph plan on {d['gpu']} for {', '.join(d['model']) or 'model'}"]
    dep = d["deployment"]
    lines.append(
        f"  tp {dep['tp_size']}, attention DP {dep['attn_dp_size']} ({'on' if dep['dp_attention'] else 'off'}), "
        f"mixed chunk {'on' if dep['enable_mixed_chunk'] else 'off'}, chunked prefill per rank "
        f"{dep['chunked_prefill_per_rank']}, running requests per rank {dep['running_per_rank']}"
        f" (max_running_requests {dep['max_running_requests']}), MoE a2a {dep['moe_a2a_backend']}"
        + (f", MegaMoE cap {dep['mega_moe_cap_per_rank']}" if dep["mega_moe_cap_per_rank"] else "")
    )
    flags = ", ".join(f"{k}={v}" for k, v in d["flags"].items())
    if not d.get("plugin_loaded", True):
        flags += " (not read: the plugin is not loaded)"
    lines.append("  flags: " + flags)
    pg = d["prefill_graph"]
    dec = pg["decided_by"]
    how = dec["kind"] + (
        f" {dec['rule']!r} ({dec['reason']})" if dec.get("rule") else f": {dec.get('detail', '')}"
    )
    lines.append(f"Prefill graph: {pg['backend']} (decided by {how})")
    for r in pg["rules"]:
        lines.append(f"  rule {r['name']!r}: {r['action']}")
    dg = d["decode_graph"]
    lines.append(
        f"Decode graph: {dg['backend']} ({dg['decided_by']['kind']}), max_bs {dg['max_bs']}, {dg['bucket_count']} buckets"
    )
    cm = d.get("capture_memory")
    if cm:
        v = cm["verdict"]
        if v.get("fits") is None:
            lines.append(
                f"Capture memory: {fmt_bytes(cm['estimate']['bytes'])} needed; available unknown ({v.get('why')})"
            )
        else:
            lines.append(
                f"Capture memory: {fmt_bytes(v['needed_bytes'])} needed for {cm['estimate']['buckets']} buckets, "
                f"{fmt_bytes(v['available_bytes'])} available, margin {fmt_bytes(v['margin_bytes'])} -> "
                f"{'fits' if v['fits'] else 'does not fit'} (needs {int(v['required_margin_fraction'] * 100)}% headroom)"
            )
            terms = ", ".join(f"{k} {fmt_bytes(b)}" for k, b in cm["estimate"]["terms"].items())
            lines.append(f"  terms: {terms}")
        if cm.get("note"):
            lines.append(f"  note: {cm['note']}")
    bl = d["bucket_lists"]
    if "note" in bl:
        lines.append(f"Buckets: {bl['note']}")
    else:
        final = bl["final"]
        lines.append(
            f"Buckets (policy {bl['policy']}), final list of {len(final)}: {_elided(final)}"
        )
        lines += _fmt_bucket_side("upstream", bl["upstream"])
        lines += _fmt_bucket_side("derived ", bl["ours"])
    if d.get("plugin_loaded", True):
        lines.append("Validations:")
    else:
        lines.append(
            "Validations (sglang-mixgraph's startup checks; not run, the plugin is not loaded):"
        )
    for v in d["validations"]:
        mark = "ok" if v["ok"] else ("WARN" if v.get("severity") == "warning" else "FAIL")
        lines.append(f"  [{mark}] {v['name']}: {v['message']}")
    return "\n".join(lines)
