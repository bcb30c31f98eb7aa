"""The GLM-5 phases of the end-to-end run and what each must show (``run_e2e.py --model glm5``).

A phase is ``glm5-<graph>[-des]``: graph ``eager`` (no CUDA graph), ``dgraph`` (full decode graph;
prefill and MIXED steps eager) or ``bcg`` (full decode graph + breakable prefill graph); ``-des``
adds ``drop_empty_segments``. SGLang 0.5.23 has no piecewise prefill graph any more (it refuses
``tc_piecewise``: "tc_piecewise was removed"), so ``dgraph`` takes its place as the graph mode
whose prefill stays eager. Every phase runs the tiny GLM-5 (tiny_glm5_config.json, written by
tools/glm5/make_tiny_glm5.py) with mixed chunked prefill, the radix cache and the kit's GLM-5
kernels (``GLM5_ENV``/``GLM5_ENGINE`` of ``sglang_mixgraph.kits.gpu_machine``).

The checks of a phase, from its record (e2e_checks.PhaseRecord) and what the GLM-5 probe
(e2e_glm5_probe.py) wrote in its scheduler: it ran, every request got its tokens, no stub was
called, it made MIXED steps, tokens equal ``glm5-eager`` (and a ``-des`` phase its twin without
the patch), no patch fell back and none but ``drop_empty_segments`` acted; in ``bcg`` phases the
indexer ran as one eager split op per indexer layer in every captured bucket and every replayed
prefill step, never while a stream was capturing; empty segments seen (probe, node counts at
each segment's end) and dropped (the patch's counters) agree; and doctor's upstream guards plus
the live-object checks held in the running scheduler. No sglang import here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from e2e_checks import Check, PhaseRecord, compare_tokens, split_stub_calls
from e2e_glm5_probe import CAPTURES_PREFIX, GUARDS_PREFIX
from e2e_phases import _GRAPH_KWARGS, engine_base_kwargs

from sglang_mixgraph.kits.gpu_machine import GLM5_ENGINE, GLM5_ENV, RADIX_CORE_ENV

TINY_CONFIG = Path(__file__).resolve().parent / "tiny_glm5_config.json"
PREFIX = "glm5-"
GRAPHS = ("eager", "dgraph", "bcg")
DES_SUFFIX = "-des"
DES_FLAG = "SGLANG_OPT_BCG_DROP_EMPTY_SEGMENTS"
DES_PATCH = "drop_empty_segments"
HOLD_PATCH = "hold_break_inputs"  # run_e2e --hold-break-inputs switches it on in every phase
BASELINE = f"{PREFIX}eager"
PREFILL_MODES = ("EXTEND", "MIXED")
# Step-log fields the probe adds (e2e_glm5_probe.py): split-op runs in the forward, and of those
# the runs while the current stream was capturing.
SPLIT_OPS, SPLIT_OPS_CAPTURING = "dsa_split_ops", "dsa_split_ops_capturing"


@dataclass(frozen=True)
class Glm5Phase:
    graph: str
    drop_empty: bool = False
    # What run_e2e.py reads of every phase: GLM-5 phases run no split, read-done or live width.
    split = "off"
    read_done = False
    live_width = False

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.graph}" + (DES_SUFFIX if self.drop_empty else "")

    @property
    def baseline(self) -> str:
        return BASELINE

    @property
    def twin(self) -> str:
        """The same graph mode with the patch off (a ``-des`` phase must reproduce it exactly)."""
        return f"{PREFIX}{self.graph}"

    @property
    def is_baseline(self) -> bool:
        return self.name == BASELINE

    def engine_kwargs(
        self, model_dir: str, *, radix: bool, slot: int, dp: int = 1, kernels: str = "standin"
    ) -> dict[str, object]:
        if dp != 1 or kernels != "standin":
            raise ValueError("GLM-5 phases run on one GPU with the kit's stand-in kernels only")
        kwargs = engine_base_kwargs(model_dir, radix=radix, slot=slot)
        kwargs.update(GLM5_ENGINE)
        kwargs.update(_GRAPH_KWARGS[self.graph])
        return kwargs

    def env(
        self, patch_flag_off_values: Mapping[str, str], *, radix: bool, kernels: str = "standin"
    ) -> dict[str, str]:
        env = dict(GLM5_ENV)
        env.update(patch_flag_off_values)
        env[DES_FLAG] = "1" if self.drop_empty else "0"
        if radix:
            env[RADIX_CORE_ENV] = "python"  # the Rust radix core is built for another torch
        return env


def parse(names: list[str]) -> list[Glm5Phase]:
    """Phase names (``all`` or none: all six), the baseline first, each twin before its -des."""
    if not names or names == ["all"]:
        names = [f"{PREFIX}{g}{s}" for g in GRAPHS for s in ("", DES_SUFFIX)]
    phases = []
    for name in names:
        base = name[: -len(DES_SUFFIX)] if name.endswith(DES_SUFFIX) else name
        graph = base[len(PREFIX) :] if base.startswith(PREFIX) else ""
        if graph not in GRAPHS:
            raise ValueError(f"unknown GLM-5 phase {name!r}: {PREFIX}<{'|'.join(GRAPHS)}>[-des]")
        phases.append(Glm5Phase(graph, name.endswith(DES_SUFFIX)))
    return sorted(
        set(phases), key=lambda p: (not p.is_baseline, p.drop_empty, GRAPHS.index(p.graph))
    )


def indexer_layers(config: Mapping) -> int:
    """Layers that run their own indexer: all of GLM-5's (no ``index_topk_freq`` sharing)."""
    freq = int(config.get("index_topk_freq") or 1)
    return sum(1 for i in range(int(config["num_hidden_layers"])) if i % freq == 0)


# ---- reading what the probe wrote ---------------------------------------------------------


def read_probe(steps_dir: Path) -> dict:
    """``{"captures": [...], "guards": [...]}`` from the probe's files in a phase's step folder."""
    out: dict = {"captures": [], "guards": []}
    for path in sorted(Path(steps_dir).iterdir()):
        if path.name.startswith(CAPTURES_PREFIX):
            out["captures"] += [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        elif path.name.startswith(GUARDS_PREFIX):
            out["guards"].append(json.loads(path.read_text()))
    return out


# ---- the checks ---------------------------------------------------------------------------


def check_phase(
    rec: PhaseRecord, phase: Glm5Phase, records: Mapping[str, PhaseRecord], layers: int
) -> list[Check]:
    """Every check of one GLM-5 phase; ``records`` holds the run's phases by name (the baseline
    and the twin among them), ``layers`` is the tiny model's indexer layers."""
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
    serving = split_stub_calls(rec.stub_calls)[0]
    checks.append(
        Check(rec.name, "no stub was called while serving", not serving, "; ".join(serving[:5]))
    )
    mixed = [s for s in rec.steps if s["mode"] == "MIXED"]
    checks.append(
        Check(
            rec.name,
            "mixed chunked prefill made MIXED steps",
            bool(mixed),
            f"{len(mixed)} MIXED steps ({sum(1 for s in mixed if s.get('graph'))} replayed)",
        )
    )
    if not phase.is_baseline:
        checks.append(_tokens_equal(rec, records.get(BASELINE)))
    if phase.drop_empty:
        checks.append(_tokens_equal(rec, records.get(phase.twin)))
    checks.append(_no_fallback(rec, phase))
    checks.extend(_indexer_split_op(rec, phase, layers))
    checks.append(_empty_segments(rec, phase))
    checks.append(_guards_live(rec))
    return checks


def _tokens_equal(rec: PhaseRecord, other: PhaseRecord | None) -> Check:
    if other is None or not other.ran:
        return Check(
            rec.name, "tokens equal the phase it is compared with", False, "it did not run"
        )
    mism = compare_tokens(other.outputs, rec.outputs)
    return Check(
        rec.name,
        f"tokens equal {other.name}",
        not mism,
        "; ".join(
            f"{m.rid}: first differs at {m.first_diff} ({m.baseline_len} vs {m.phase_len} tokens)"
            for m in mism
        ),
    )


def _no_fallback(rec: PhaseRecord, phase: Glm5Phase) -> Check:
    """No patch handed anything back to upstream, and none but drop_empty_segments (where the
    phase switches it on) and hold_break_inputs (where the run does) counted an event. None is
    expected to fall back in any phase."""
    fb = {p: c for p, c in (rec.counters.get("fallbacks") or {}).items() if c}
    allowed = {DES_PATCH} if phase.drop_empty else set()
    if rec.hold_break_inputs:
        allowed.add(HOLD_PATCH)
    acting = sorted(p for p, c in (rec.counters.get("events") or {}).items() if c)
    stray = [p for p in acting if p not in allowed]
    return Check(
        rec.name,
        "no fallback, and no patch acted but the phase's",
        not fb and not stray,
        f"fallbacks {fb or 'none'}; patches with events {acting or 'none'}",
    )


def _indexer_split_op(rec: PhaseRecord, phase: Glm5Phase, layers: int) -> list[Check]:
    """The split op counted at runtime (probe): in ``bcg`` every captured bucket recorded one
    split-op break per indexer layer, and every replayed prefill step ran that many split ops,
    none while a stream was capturing; elsewhere no step ran a split op (the indexer's eager
    path)."""
    steps = [s for s in rec.steps if s["mode"] in PREFILL_MODES]
    unlogged = [s for s in steps if SPLIT_OPS not in s]
    if unlogged:
        return [
            Check(
                rec.name,
                "the probe counted the indexer in every prefill step",
                False,
                f"{len(unlogged)} of {len(steps)} prefill steps without its counts",
            )
        ]
    capturing = sum(s[SPLIT_OPS_CAPTURING] for s in steps)
    replayed = [s for s in steps if s.get("graph")]
    if phase.graph != "bcg":
        ran = sum(s[SPLIT_OPS] for s in steps)
        return [
            Check(
                rec.name,
                "the indexer ran eagerly, never as a split op (no prefill graph)",
                ran == 0 and not replayed,
                f"{ran} split-op runs in {len(steps)} prefill steps, {len(replayed)} replayed",
            )
        ]
    captures = [c for c in (rec.probe.get("captures") or ()) if c.get("indexer_breaks")]
    bad_captures = [c for c in captures if c["indexer_breaks"] != layers]
    bad_steps = [s for s in replayed if s[SPLIT_OPS] != layers]
    eager_with_ops = [s for s in steps if not s.get("graph") and s[SPLIT_OPS]]
    ok = (
        bool(captures)
        and bool(replayed)
        and not bad_captures
        and not bad_steps
        and not eager_with_ops
        and capturing == 0
    )
    return [
        Check(
            rec.name,
            "the indexer ran as one eager split op per layer in every captured prefill",
            ok,
            f"{len(captures)} captured buckets with split-op breaks ("
            f"{len(bad_captures)} without {layers}); {len(replayed)} replayed prefill steps "
            f"({len(bad_steps)} without {layers} split-op runs: "
            f"{sorted({s[SPLIT_OPS] for s in bad_steps})}); {capturing} runs while capturing; "
            f"{len(eager_with_ops)} eager steps with split-op runs",
        )
    ]


def _empty_segments(rec: PhaseRecord, phase: Glm5Phase) -> Check:
    """Empty segments seen (the probe's node counts) and dropped (the patch's counters)."""
    captures = rec.probe.get("captures") or []
    seen = sum(c.get("empty", 0) for c in captures)
    segments = sum(c.get("segments", 0) for c in captures)
    ev = dict((rec.counters.get("events") or {}).get(DES_PATCH, {}))
    checked, dropped = ev.get("captures_checked", 0), ev.get("segments_dropped", 0)
    skipped = ev.get("launches_skipped", 0)
    facts = (
        f"{len(captures)} breakable captures, {segments} segments, {seen} empty; patch: "
        f"{checked} captures checked, {dropped} dropped, {skipped} launches skipped"
    )
    if phase.graph != "bcg":
        return Check(
            rec.name,
            "no breakable graph, nothing for drop_empty_segments",
            not captures and not checked,
            facts,
        )
    if not phase.drop_empty:
        return Check(
            rec.name,
            "empty segments counted; drop_empty_segments off",
            bool(captures) and not ev,
            facts,
        )
    ok = checked == len(captures) > 0 and dropped == seen and (dropped == 0 or skipped > 0)
    return Check(rec.name, "drop_empty_segments dropped every empty segment seen", ok, facts)


def _guards_live(rec: PhaseRecord) -> Check:
    """Doctor's upstream guards and the live-object checks, run by the probe in the scheduler."""
    reports = rec.probe.get("guards") or []
    failed = [
        f"{item['name']}: {'; '.join(item.get('problems') or [item.get('detail', '')])}"
        for report in reports
        for item in list(report.get("guards", [])) + list(report.get("live", []))
        if not item.get("ok")
    ]
    names = sorted(
        {item["name"] for r in reports for item in r.get("guards", []) + r.get("live", [])}
    )
    return Check(
        rec.name,
        "doctor's GLM-5 guards hold against the running server's objects",
        bool(reports) and not failed,
        "; ".join(failed) if failed else f"{len(reports)} scheduler(s): {', '.join(names)}",
    )
