"""What the end-to-end run must show, computed from what the phases recorded (pure Python).

Inputs per phase: the greedy tokens of every request, the step log (mode at entry to
``ModelRunner.forward``, whether a graph ran), the patches' counters (the scheduler's last
``sglang-mixgraph counters`` line) and the stand-in / stub lines of its log. A split phase passes
only if its tokens equal its graph mode's ``off`` phase AND the counters show the split acted
where it is meant to: in every MIXED step that ran eagerly (``EagerRunner`` runs it as EXTEND),
and, in breakable-graph replays, as the recorded fallback (the split does not act there yet).
An equality where the split never acted is a failed check, not a pass.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

PATCH = "mixed_split"
RATIOS = (0, 4, 128)


@dataclass(frozen=True)
class Mismatch:
    rid: str
    first_diff: Optional[int]  # first differing token position; None when one side is missing
    baseline_len: int
    phase_len: int


@dataclass(frozen=True)
class Check:
    phase: str
    name: str
    ok: bool
    detail: str = ""


@dataclass
class PhaseRecord:
    """What one phase left behind (see run_e2e.py for how each part is collected)."""

    name: str
    split: str  # off | always | adaptive
    ran: bool
    error: str = ""
    outputs: Dict[str, List[int]] = field(default_factory=dict)
    expected_lens: Dict[str, int] = field(default_factory=dict)
    steps: List[dict] = field(default_factory=list)
    counters: dict = field(default_factory=dict)
    stub_calls: List[str] = field(default_factory=list)


def compare_tokens(
    baseline: Mapping[str, Sequence[int]], phase: Mapping[str, Sequence[int]]
) -> List[Mismatch]:
    """Per request (every request of either side), where the phase's tokens leave the baseline's."""
    out = []
    for rid in sorted(set(baseline) | set(phase)):
        a, b = baseline.get(rid), phase.get(rid)
        if a is None or b is None:
            out.append(Mismatch(rid, None, len(a or ()), len(b or ())))
            continue
        a, b = list(a), list(b)
        if a == b:
            continue
        first = next(
            (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )
        out.append(Mismatch(rid, first, len(a), len(b)))
    return out


def split_stub_calls(calls: Sequence[str]) -> tuple:
    """(calls while serving, calls while a module was being imported). An import-time call is
    a stubbed decorator in a module whose import upstream's model registry skips with "Ignore
    import error when loading ..." (seen: ``cutlass.cute.jit`` in ``sglang.srt.models.inkling``);
    it is listed, not failed. Any other call is a failed check."""
    at_import = [c for c in calls if "importlib._bootstrap" in c]
    return [c for c in calls if c not in at_import], at_import


def merge_counters(snapshots: Iterable[Mapping]) -> dict:
    """Totals over processes from their counter lines: the last line of each pid (counts are
    cumulative per process), summed across pids."""
    last: Dict[int, Mapping] = {}
    for snap in snapshots:
        last[snap.get("pid", 0)] = snap
    total: dict = {"events": {}, "fallbacks": {}}
    for snap in last.values():
        for kind in ("events", "fallbacks"):
            for patch, counts in (snap.get(kind) or {}).items():
                mine = total[kind].setdefault(patch, {})
                for key, n in counts.items():
                    mine[key] = mine.get(key, 0) + int(n)
    return total


def steps_by_mode(steps: Iterable[Mapping]) -> Dict[str, int]:
    """``{"MIXED/eager": n, "DECODE/graph": n, ...}`` (mode at entry to the forward)."""
    c = Counter(f"{s['mode']}/{'graph' if s.get('graph') else 'eager'}" for s in steps)
    return dict(sorted(c.items()))


def _mixed(steps: Iterable[Mapping], graph: bool) -> int:
    return sum(1 for s in steps if s["mode"] == "MIXED" and bool(s.get("graph")) == graph)


def _events(rec: PhaseRecord) -> Dict[str, int]:
    return dict(rec.counters.get("events", {}).get(PATCH, {}))


def _fallbacks(rec: PhaseRecord) -> Dict[str, int]:
    return dict(rec.counters.get("fallbacks", {}).get(PATCH, {}))


def check_phase(rec: PhaseRecord, baseline: Optional[PhaseRecord]) -> List[Check]:
    checks = [Check(rec.name, "ran to the end", rec.ran, rec.error)]
    if not rec.ran:
        return checks
    short = {
        r: (len(rec.outputs.get(r) or ()), n)
        for r, n in rec.expected_lens.items()
        if len(rec.outputs.get(r) or ()) != n
    }
    checks.append(
        Check(
            rec.name,
            "every request got all its tokens",
            not short,
            ", ".join(f"{r}: {got} of {n}" for r, (got, n) in sorted(short.items())),
        )
    )
    serving, at_import = split_stub_calls(rec.stub_calls)
    checks.append(
        Check(rec.name, "no stub was called while serving", not serving, "; ".join(serving[:5]))
    )
    mixed_eager, mixed_graph = _mixed(rec.steps, False), _mixed(rec.steps, True)
    ev, fb = _events(rec), _fallbacks(rec)
    if rec.split == "off":
        checks.append(
            Check(
                rec.name,
                "the workload made MIXED steps",
                mixed_eager + mixed_graph > 0,
                f"{mixed_eager} eager, {mixed_graph} replayed",
            )
        )
        checks.append(
            Check(
                rec.name,
                "mixed_split inactive (flag off)",
                not ev and not fb,
                f"events {ev}, fallbacks {fb}",
            )
        )
        return checks
    if baseline is None or not baseline.ran:
        checks.append(
            Check(rec.name, "tokens equal the off phase", False, "the off phase did not run")
        )
    else:
        mism = compare_tokens(baseline.outputs, rec.outputs)
        checks.append(
            Check(
                rec.name,
                f"tokens equal {baseline.name}",
                not mism,
                "; ".join(
                    f"{m.rid}: first differs at {m.first_diff} ({m.baseline_len} vs {m.phase_len} tokens)"
                    for m in mism
                ),
            )
        )
    checks.extend(_acted(rec, mixed_eager, mixed_graph, ev, fb))
    return checks


def _acted(
    rec: PhaseRecord, mixed_eager: int, mixed_graph: int, ev: Dict[str, int], fb: Dict[str, int]
) -> List[Check]:
    out = []
    if mixed_eager == 0 and mixed_graph == 0:
        return [
            Check(rec.name, "mixed_split acted", False, "no MIXED step: nothing shows the split")
        ]
    if mixed_eager:
        seen = ev.get("steps_seen.mixed_run_as_extend", 0) + ev.get("steps_seen.mixed", 0)
        out.append(
            Check(
                rec.name,
                "every eager MIXED step recognised (run as EXTEND)",
                seen == mixed_eager,
                f"recognised {seen} of {mixed_eager}",
            )
        )
        out += _decided(
            rec,
            "eager MIXED step",
            mixed_eager,
            ev.get("steps_split", 0),
            ev.get("steps_unsplit_adaptive", 0),
        )
    if mixed_graph:
        seen = ev.get("replays_seen", 0)
        out.append(
            Check(
                rec.name,
                "every replayed MIXED step recognised",
                seen == mixed_graph,
                f"recognised {seen} of {mixed_graph}",
            )
        )
        out += _decided(
            rec,
            "replayed MIXED step",
            mixed_graph,
            ev.get("replays_split", 0),
            ev.get("replays_unsplit_adaptive", 0),
        )
    if rec.split == "always":
        missing = [r for r in RATIOS if not ev.get(f"layers_split.c{r}")]
        out.append(
            Check(
                rec.name,
                "layers of every compress ratio split",
                not missing,
                f"none split for ratios {missing}" if missing else "",
            )
        )
    return out


def _decided(rec: PhaseRecord, what: str, n: int, split: int, kept: int) -> List[Check]:
    if rec.split == "always":
        return [
            Check(rec.name, f"split acted in every {what}", split == n > 0, f"split {split} of {n}")
        ]
    return [
        Check(
            rec.name,
            f"adaptive decided every {what}",
            split + kept == n,
            f"split {split} + kept unsplit {kept} of {n}",
        ),
        Check(
            rec.name,
            f"adaptive split at least one {what}",
            split > 0,
            f"split {split}, kept unsplit {kept}",
        ),
    ]


def summarize(rec: PhaseRecord) -> List[str]:
    """Lines for the log: steps by mode and graph, the split's counters and fallbacks."""
    lines = [f"steps: {steps_by_mode(rec.steps)}"]
    lines.append(f"mixed_split counters: {_events(rec) or '{}'}")
    lines.append(f"fallbacks (every patch): {rec.counters.get('fallbacks') or 'none'}")
    at_import = split_stub_calls(rec.stub_calls)[1]
    if at_import:
        lines.append(
            f"stubs called while importing a module upstream then skipped: {sorted(set(c.split(' (pid')[0] for c in at_import))}"
        )
    others = {p: c for p, c in rec.counters.get("events", {}).items() if p != PATCH}
    if others:
        lines.append(f"other patches: {others}")
    return lines
