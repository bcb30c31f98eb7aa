"""`advise`'s answer: what to switch on first, the other verdicts, then the evidence table.

`report_json` holds everything with a `schema_version` (the server's facts, the GPU, where the
traces are, every verdict with its range, basis and flags, one row per step kind); `report_text`
is the same for people: the patches that pay (or may), largest gain first, each with its
predicted change of the MIXED step's wall, the reason in one line and the flags to set; then
the others grouped by outcome; then the per-kind medians the verdicts rest on.
"""

from __future__ import annotations

import textwrap

from sglang_mixgraph.advise.server import ServerFacts
from sglang_mixgraph.advise.steps import Gpu
from sglang_mixgraph.advise.summary import SHOWN_CLASSES, KindRow
from sglang_mixgraph.advise.verdicts import (
    ALREADY_ON,
    CANNOT_ACT,
    NO_GAIN,
    UNKNOWN,
    Verdict,
    switch_on_order,
)

SCHEMA_VERSION = 1
WIDTH = 100


def report_json(
    facts: ServerFacts,
    gpu: Gpu | None,
    profile: dict,
    verdicts: list[Verdict],
    rows: list[KindRow],
) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "server": {
            "url": facts.url,
            "sglang_version": facts.sglang_version,
            "model_path": facts.model_path,
            "architectures": list(facts.architectures),
            "tp_size": facts.tp_size,
            "pp_size": facts.pp_size,
            "dp_size": facts.dp_size,
            "attn_dp_size": facts.attn_dp_size,
            "mixed_chunk": facts.mixed_chunk,
            "speculative_algorithm": facts.speculative_algorithm,
            "prefill_graph": {
                "backend": facts.prefill_graph.backend,
                "buckets": list(facts.prefill_graph.buckets),
            },
            "decode_graph": {
                "backend": facts.decode_graph.backend,
                "buckets": list(facts.decode_graph.buckets),
            },
        },
        "gpu": None if gpu is None else {"name": gpu.name, "arch": gpu.arch},
        "profile": profile,
        "switch_on_first": [v.id for v in switch_on_order(verdicts)],
        "verdicts": [v.to_json() for v in verdicts],
        "steps": [r.to_json() for r in rows],
    }


def _ms(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.1f}" if signed else f"{value:.1f}"


def _change(v: Verdict) -> str:
    """The predicted change in words: the point, its share of the step's wall, the range."""
    if v.low_ms is None or v.high_ms is None:
        return ""
    if v.delta_ms is None:  # the evidence bounds the gain, it does not predict it
        return f"up to {-v.low_ms:.2f} ms less per step"
    share = f" ({v.delta_ms / v.wall_ms:+.1%})" if v.wall_ms else ""
    text = f"{_ms(v.delta_ms, True)} ms per MIXED step{share}"
    if v.high_ms - v.low_ms >= 0.05:
        text += f", range {_ms(v.low_ms, True)} to {_ms(v.high_ms, True)} ms"
    return text


def _count(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.0f}"


def _wrap(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ")


def _table(rows: list[KindRow]) -> list[str]:
    head = ["kind", "graph", "steps", "host ms", "kernel ms", "launches", "decode rows"]
    head += ["longest ctx", "bucket", "padding", *SHOWN_CLASSES]
    body = []
    for r in rows:
        ctx = f">={r.longest_context_at_least}" if r.longest_context_at_least else "unknown"
        lower = ">=" if r.bucket_is_lower_bound and r.bucket is not None else ""
        body.append(
            [
                r.mode,
                r.graph,
                str(r.steps),
                _ms(r.host_ms),
                _ms(r.kernel_ms),
                f"{r.launches:.0f}",
                _count(r.decode_rows),
                ctx,
                "-" if r.graph == "eager" else lower + _count(r.bucket),
                "-" if r.graph == "eager" else _count(r.padding_rows),
                *(_ms(r.class_ms[c]) for c in SHOWN_CLASSES),
            ]
        )
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=False)]
    return [
        "  ".join(
            x.rjust(w) if i > 1 else x.ljust(w)
            for i, (x, w) in enumerate(zip(c, widths, strict=True))
        )
        for c in (head, *body)
    ]


def _unprofiled_line(u: dict | None) -> str:
    if u is None:
        return "eager host as profiled (the profiler slows it; --server-log prices it unprofiled)"
    if "factor" not in u:
        return f"eager host as profiled: {u['problem']}"
    return (
        f"eager host unprofiled: the server's log spaced {u['unprofiled_batches']} eager MIXED "
        f"batches {u['unprofiled_ms']:.1f} ms apart before the profile and "
        f"{u['profiled_batches']} {u['profiled_ms']:.1f} ms apart inside it (x{u['factor']:.2f})"
    )


def _served_line(served: dict | None) -> list[str]:
    if served is None:
        return []
    if "prefill_share" not in served:
        return _wrap(f"no prefill share of the load's burst: {served['problem']}", "")
    return _wrap(
        f"the load's burst: prefill phase {served['prefill_s']:.1f} s (unprofiled, "
        f"{served['prefill_batches']} batches), the rest {served['decode_tail_s']:.1f} s (decode "
        "after the last prefill batch, and any wait before the first): "
        f"prefill share {served['prefill_share']:.2f}",
        "",
    )


def report_text(report: dict, verdicts: list[Verdict], rows: list[KindRow]) -> str:
    s, gpu, prof = report["server"], report["gpu"], report["profile"]
    on_gpu = f"{gpu['name']} ({gpu['arch']})" if gpu else "a GPU the traces do not name"
    stacks = " (Python stacks recorded: host times include the profiler's own)"
    where = f"{s['url']} (sglang {s['sglang_version']})"
    if s["url"] is None:
        where = "traces recorded earlier (no server asked: its settings unknown)"
    lines = [
        f"sglang-mixgraph advise: {where}",
        f"{', '.join(s['architectures']) or 'unknown model'} on {on_gpu}",
    ]
    lines += _wrap(
        f"profiled {prof['steps']} steps on {prof['ranks_read']} of {prof['ranks_expected']} "
        f"ranks; traces in {prof['trace_dir']}" + (stacks if prof["with_stack"] else ""),
        "",
    )
    lines += _wrap(_unprofiled_line(prof.get("unprofiled")), "")
    lines += _served_line(prof.get("served"))
    lines += ["", "Switch on first:"]
    first = switch_on_order(verdicts)
    for i, v in enumerate(first, 1):
        lines += _wrap(f"{i}. {v.title}: {_change(v)} ({v.outcome})", "  ")
        lines += _wrap(v.reason, "     ")
        lines += _wrap("set: " + " ".join(v.flags), "     ")
        if v.basis:
            lines += _wrap("from: " + v.basis, "     ")
    if not first:
        lines.append("  nothing: no patch is predicted to shorten the MIXED step here")
    groups = (
        (NO_GAIN, "Does not pay here:"),
        (ALREADY_ON, "Already on:"),
        (UNKNOWN, "Not priced (unknown):"),
        (CANNOT_ACT, "Cannot act here:"),
    )
    for outcome, title in groups:
        chosen = [v for v in verdicts if v.outcome == outcome]
        if chosen:
            lines += ["", title]
        for v in chosen:
            change = _change(v)
            lines += _wrap(f"- {v.title}{f' ({change})' if change else ''}: {v.reason}", "  ")
    lines += ["", "Evidence (medians per step kind over every rank; times in ms):"]
    lines += ["  " + line for line in _table(rows)]
    if any(r.bucket_is_lower_bound for r in rows):
        lines.append("  (>= bucket: under attention DP every rank pads to the largest rank's rows)")
    return "\n".join(lines)
