"""What the end-to-end run must show, computed from what the phases recorded.

Inputs per phase: the greedy tokens of every request, the step log (mode at entry to
``ModelRunner.forward``, whether a graph ran, and for a MIXED step the shape the split decides
on), the patches' counters (each process's last ``sglang-mixgraph counters`` line) and the
stand-in / stub lines of its log. Every phase but a baseline (``<graph>-off``) must reproduce its
baseline's tokens, and an equality where the patch under test never acted is a failed check, not
a pass:

* split ``always``: the split acted in every MIXED step, eager (``EagerRunner`` runs it as
  EXTEND) or replayed under the breakable graph, and layers of every compress ratio split;
* split ``adaptive``: every MIXED step decided, and exactly as many split as the cost model
  (``sglang_mixgraph.core.split_cost_model``, the GPU's coefficients) splits at the logged
  shapes; when it splits none, the check says so and the ``always`` phases show the split;
* read-done (``-rd``): read-done published for replayed MIXED and EXTEND steps
  (``replay_read_done``), the debug check saw publications and no violation
  (``war_snapshot_check``), no ``replay_read_done`` fallback; in every other phase both patches
  are inactive, as is the split in the ``off`` phases;
* attention DP over N > 1 ranks (``--dp N``, per rank: the step log's ``dp_rank`` and each
  process's own counters): every rank ran steps and some ran IDLE ones; no rank planned a split
  for more steps than it ran non-IDLE; with the split on, it acted on every rank that ran MIXED
  steps and on the decode-only batches SGLang relabels to EXTEND (under the breakable prefill
  graph, so that every rank replays it; the step log sees them as one-token EXTEND batches);
  with read-done on, every rank that replayed MIXED steps published; every DP logits
  gather (upstream's ``SGLANG_TRACE_LOGITS_E2E`` lines) held at most the running requests,
  not a padded bucket of tokens;
* speculative decoding (``spec-`` phases, EAGLE over the next-n layer): each is compared with
  eager upstream (``spec-eager-off``); every request verified drafts, the accept length (tokens
  per verify step, upstream's ``spec_accept_length``) equals the reference's within
  ``ACCEPT_LENGTH_TOLERANCE``; the step log's MIXED steps are the target's (the draft's lines are
  counted apart), and with the split on its draft forwards fell back (``spec_draft``) once per
  MIXED step and were counted apart (``draft_steps_seen.*``, ``draft_replays_seen``), no other
  fallback, and layers split only as many times as the target has layers. Where the split-off
  breakable arm already differs from the reference, its check says that is upstream's replay
  under EAGLE (SGLang issue 29985), and the split arms are also compared with it; with the
  overlap scheduler off (``-noovl``) the reference is ``spec-eager-off-noovl``, with acceptance
  forced to swing (``-acc``) ``spec-eager-off-acc``, and the tokens per verify step must show the
  swing (``SWING_ACCEPT_RANGE``); with tail graphs (``-tail``) every split layer's decode tail
  from the graphs: a split step's first layer of each ratio makes the step's schedule
  (``tail_graph_schedules`` = split steps x ratios), the other layers replay
  (``tail_graph_replays``), no ``tail_graph_eager.*``; with upstream's online c128 MTP compression
  (``-online``, reference ``spec-eager-off-online``) the split arms split nothing: every target
  MIXED step recognised and fell back (``spec_online_c128``), ``steps_split``/``replays_split`` 0;
* the boundary workload: the decode rows of the target's MIXED steps had every context length of
  ``e2e_workload.boundary_lens`` (the SWA window, the page, the c4 top-k threshold, each crossed);
* lean (``-lean``: ``wo_a_in_break`` and ``compress_plan_cap``): under the breakable prefill graph
  every captured layer's attention break carried wo_a, the breaks ran in every replayed prefill
  step, every replayed batch was checked against the capped plans, no break fell back and no
  batch was over the cap; in an eager or dgraph phase both patches counted nothing;
* the pressure workload (small pool, client aborts): the requests the client aborts are left out
  of the token comparison and of the length check, and must have stopped mid-generation with an
  abort; the pool log must show retractions and radix-cache evictions in every phase.

Pure Python but for the cost model (CPU torch), which :class:`AdaptivePolicy` imports lazily.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

PATCH = "mixed_split"
RD_PATCH = "replay_read_done"
DES_PATCH = "drop_empty_segments"
LW_PATCH = "live_width_indexer"
WO_A_PATCH = "wo_a_in_break"
CAP_PATCH = "compress_plan_cap"
WAR_PATCH = "war_snapshot_check"
RATIOS = (0, 4, 128)
# Upstream's trace of the DP logits gather (logits_processor._trace_e2e_logits), printed per step.
LOGITS_TRACE_ENV = "SGLANG_TRACE_LOGITS_E2E"
LOGITS_GATHER_STAGE = "stage=dp_metadata_returned"
# The accept length of a speculative arm may move this much (relative) from the reference's:
# greedy verification keeps the tokens, but the draft reads the target's hidden states, whose
# bf16 rounding the split changes (summation order), so a near-tie among the draft's top
# tokens may flip and one verify step accept a token more or less.
ACCEPT_LENGTH_TOLERANCE = 0.01
# The -acc variant forces each verify step to commit 2 or 3 tokens, one as often as the other: a
# mean in this range cannot come from one of the two alone.
SWING_ACCEPT_RANGE = (2.1, 2.9)
SPEC_REFERENCE = "spec-eager-off"  # e2e_phases.SPEC_REFERENCE (no sglang import there either)
# The split's fallback under upstream's online c128 MTP compression (mixed_split/state.py).
ONLINE_FALLBACK = "spec_online_c128"
# The split's counters that say a step split or was decided (plan.py ``_plan``).
SPLIT_ACTIVITY = (
    "steps_split",
    "replays_split",
    "decode_rows_split",
    "steps_unsplit_adaptive",
    "replays_unsplit_adaptive",
)
UPSTREAM_29985 = (
    "upstream's breakable prefill replay under EAGLE (SGLang issue 29985), not the split's"
)


def _upstream(graph: str) -> str:
    """What a difference of a split-off speculative arm from the eager reference is."""
    return (
        UPSTREAM_29985 if graph == "bcg" else f"upstream's {graph} arm under EAGLE, not the split's"
    )


@dataclass(frozen=True)
class Mismatch:
    rid: str
    first_diff: int | None  # first differing token position; None when one side is missing
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
    read_done: bool = False  # the -rd variant: replay_read_done and war_snapshot_check on
    drop_empty: bool = False  # the -des variant: drop_empty_segments on
    live_width: bool = False  # the -lw variant: live_width_indexer on
    lean: bool = False  # the -lean variant: wo_a_in_break and compress_plan_cap on
    error: str = ""
    outputs: dict[str, list[int]] = field(default_factory=dict)
    expected_lens: dict[str, int] = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)
    counters: dict = field(default_factory=dict)
    stub_calls: list[str] = field(default_factory=list)
    abort_targets: dict[str, int] = field(default_factory=dict)  # rid -> tokens before abort
    finish_reasons: dict[str, str] = field(default_factory=dict)  # of the aborted requests
    pool: dict = field(default_factory=dict)  # e2e_pool_log.summarize of the phase
    pool_pressure: bool = False  # the pressure workload: retractions and evictions required
    graph: str = ""  # eager | dgraph | bcg
    dp: int = 1  # attention-DP ranks
    counters_by_pid: dict = field(default_factory=dict)  # each process's last counter line
    logits_gather_rows: list[int] = field(default_factory=list)  # DP logits gather buffer rows
    max_running: int = 0  # the Engine's max_running_requests (all ranks)
    probe: dict = field(default_factory=dict)  # GLM-5 phases: e2e_glm5.read_probe of the phase
    spec: bool = False  # a speculative phase (EAGLE over the next-n layer)
    tail_graphs: bool = False  # the -tail variant: SGLANG_MIXGRAPH_SPLIT_TAIL_GRAPHS=1
    no_overlap: bool = False  # the -noovl variant: SGLang's overlap scheduler off
    swing_accept: bool = False  # the -acc variant: acceptance forced to 2 or 3 a verify step
    online_c128: bool = False  # the -online variant: upstream's online c128 MTP compression
    hold_break_inputs: bool = False  # run_e2e --hold-break-inputs: hold_break_inputs on
    spec_counts: dict = field(default_factory=dict)  # rid -> e2e_phase.spec_counts
    boundary_lens: tuple[int, ...] = ()  # the boundary workload: context lengths rows must cross
    logprob_rids: tuple[str, ...] = ()  # requests with return_logprob (speculative workloads)
    logprobs: dict[str, int] = field(default_factory=dict)  # rid -> output-token logprobs

    @property
    def is_baseline(self) -> bool:
        """A ``<graph>-off`` phase: the tokens every other phase of its graph mode must equal;
        under speculation only the eager one (``spec-eager-off``, ``spec-eager-off-noovl``,
        ``spec-eager-off-online``...)."""
        return (
            self.split == "off"
            and (not self.spec or self.graph == "eager")
            and not self.read_done
            and not self.drop_empty
            and not self.live_width
            and not self.lean
            and not self.tail_graphs
        )


@dataclass(frozen=True)
class AdaptivePolicy:
    """What ``adaptive`` decides a MIXED step with (mixed_split/plan.py ``_adaptive_splits``):
    the cost model's coefficients for the GPU, the c4 layers' top-k and the model's layers per
    compress ratio. A step splits when the whole step's prediction says so
    (``split_cost_model.decide_step``: every layer split with one prefill-only chunk cache, or
    none with upstream's)."""

    coeffs: object  # split_cost_model.Coefficients
    topk: int
    layers: Mapping[int, int]  # {compress ratio: layers}

    @property
    def num_layers(self) -> int:
        """The model's layers (``num_hidden_layers`` of the config, every compress ratio)."""
        return sum(self.layers.values())

    @property
    def ratios(self) -> frozenset[int]:
        return frozenset(r for r, n in self.layers.items() if n)

    @classmethod
    def for_model(cls, config: Mapping, arch: str = "sm90") -> AdaptivePolicy:
        """From the model's config.json; ``sm90`` is the H200 the run is on. The layers are the
        pool's (``compression_ratios`` over the model's ``num_hidden_layers``)."""
        from sglang_mixgraph.core import split_cost_model as scm

        mix = scm.layer_mix(config["compress_ratios"][: config["num_hidden_layers"]])
        return cls(scm.load_coefficients(arch), int(config["index_topk"]), mix)

    def splits(self, step: Mapping) -> bool | None:
        """Whether the cost model splits this logged MIXED step; None when the log lacks its
        shape (no decode count: the split did not record one) or the shape is inconsistent."""
        from sglang_mixgraph.core import split_cost_model as scm

        num_decode, exts = step.get("num_decode"), step.get("extend_seq_lens")
        if not num_decode or not exts:
            return None
        # The split sizes the step by its requests (plan.py: seq_lens[:n], n = len(exts)).
        seqs = list(step.get("seq_lens") or ())[: len(exts)]
        try:
            counts = scm.StepCounts.from_lists(
                seqs, exts, num_decode, topk=self.topk, ratios=tuple(r for r in self.ratios if r)
            )
            return scm.decide_step(
                counts,
                self.layers,
                self.coeffs,
                regime=scm.REPLAY if step.get("graph") else scm.EAGER,
            )
        except ValueError:
            return None


def compare_tokens(
    baseline: Mapping[str, Sequence[int]], phase: Mapping[str, Sequence[int]]
) -> list[Mismatch]:
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


def last_counters_by_pid(snapshots: Iterable[Mapping]) -> dict[int, Mapping]:
    """Each process's last counter line (its counts are cumulative)."""
    last: dict[int, Mapping] = {}
    for snap in snapshots:
        last[int(snap.get("pid", 0))] = snap
    return last


def merge_counters(snapshots: Iterable[Mapping]) -> dict:
    """Totals over processes from their counter lines: the last line of each pid (counts are
    cumulative per process), summed across pids."""
    total: dict = {"events": {}, "fallbacks": {}}
    for snap in last_counters_by_pid(snapshots).values():
        for kind in ("events", "fallbacks"):
            for patch, counts in (snap.get(kind) or {}).items():
                mine = total[kind].setdefault(patch, {})
                for key, n in counts.items():
                    mine[key] = mine.get(key, 0) + int(n)
    return total


def logits_gather_rows(line: str) -> int | None:
    """The rows of a DP logits gather's buffer from upstream's trace line
    (``... stage=dp_metadata_returned buffer_shape=(rows, hidden) ...``), else None."""
    if LOGITS_GATHER_STAGE not in line or "buffer_shape=(" not in line:
        return None
    first = line.split("buffer_shape=(", 1)[1].split(",", 1)[0].split(")", 1)[0]
    return int(first) if first.strip().isdigit() else None


def steps_by_mode(steps: Iterable[Mapping]) -> dict[str, int]:
    """``{"MIXED/eager": n, "DECODE/graph": n, "draft MIXED/eager": n, ...}`` (mode at entry to
    the forward; the speculative draft model's forwards apart)."""
    c = Counter(
        f"{'draft ' if s.get('draft') else ''}{s['mode']}/{'graph' if s.get('graph') else 'eager'}"
        for s in steps
    )
    return dict(sorted(c.items()))


def _of_mode(steps: Iterable[Mapping], mode: str, graph: bool) -> list[Mapping]:
    """The target model's steps of ``mode`` (a speculative draft's forwards are not steps)."""
    return [
        s
        for s in steps
        if s["mode"] == mode and bool(s.get("graph")) == graph and not s.get("draft")
    ]


def _mixed(steps: Iterable[Mapping], graph: bool) -> int:
    return len(_of_mode(steps, "MIXED", graph))


def _events(rec: PhaseRecord, patch: str = PATCH) -> dict[str, int]:
    return dict(rec.counters.get("events", {}).get(patch, {}))


def _fallbacks(rec: PhaseRecord, patch: str = PATCH) -> dict[str, int]:
    return dict(rec.counters.get("fallbacks", {}).get(patch, {}))


def check_phase(
    rec: PhaseRecord,
    baseline: PhaseRecord | None,
    policy: AdaptivePolicy,
    upstream_arm: PhaseRecord | None = None,
) -> list[Check]:
    """Every check of one phase; ``baseline`` is its ``<graph>-off`` phase (``spec-eager-off``
    for a speculative one; None for a baseline), ``policy`` what the adaptive split decides
    with, ``upstream_arm`` a speculative split arm's split-off arm of its graph mode (for a
    breakable one: ``spec-bcg-off``)."""
    checks = [Check(rec.name, "ran to the end", rec.ran, rec.error)]
    if rec.read_done:
        # Also when the phase died: the violation raises in the scheduler, which may be what
        # ended it, and the count is logged before the raise.
        violations = _events(rec, WAR_PATCH).get("violations", 0)
        checks.append(
            Check(
                rec.name,
                "no shared-table read after read-done (WarSnapshotViolation)",
                violations == 0,
                f"{violations} violations",
            )
        )
    if not rec.ran:
        return checks
    short = {
        r: (len(rec.outputs.get(r) or ()), n)
        for r, n in rec.expected_lens.items()
        if r not in rec.abort_targets and len(rec.outputs.get(r) or ()) != n
    }
    checks.append(
        Check(
            rec.name,
            "every request got all its tokens"
            + (" (but those the client aborted)" if rec.abort_targets else ""),
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
    if rec.abort_targets:
        checks.append(_aborted_mid_generation(rec))
    if rec.pool_pressure:
        checks.append(_pool_pressure(rec))
    if rec.boundary_lens:
        checks.append(_boundary_crossed(rec))
    if rec.logprob_rids:
        checks.extend(_logprob_unmixed(rec))
    if rec.spec:
        checks.extend(_speculative(rec, baseline, upstream_arm, mixed_eager + mixed_graph, policy))
    elif not rec.is_baseline:
        checks.append(_tokens_equal(rec, baseline))
    if rec.split != "off" and rec.online_c128:
        checks.extend(_online_fell_back(rec, mixed_eager + mixed_graph, ev, fb))
    elif rec.split != "off":
        checks.extend(_acted(rec, mixed_eager, mixed_graph, ev, fb, policy))
    checks.extend(_read_done(rec) if rec.read_done else [_read_done_inactive(rec)])
    if rec.drop_empty:
        checks.append(_drop_empty(rec))
    if rec.live_width:
        checks.append(_live_width(rec, mixed_graph))
    if rec.lean:
        checks.extend(_lean(rec, policy.num_layers))
    if rec.dp > 1:
        checks.extend(_dp_checks(rec))
    return checks


def _pid_events(snap: Mapping, patch: str) -> dict[str, int]:
    return dict((snap.get("events") or {}).get(patch, {}))


def _relabelled(step: Mapping) -> bool:
    """A decode-only batch SGLang ran as EXTEND (``convert_decode_to_extend``: one token per
    request), as the step log saw it at entry. A prefill of one new token per request would look
    the same; the workloads' random prompts never leave a radix hit one token short."""
    return step["mode"] == "EXTEND" and 0 < int(step.get("bs", 0)) == int(step.get("rows", -1))


def _dp_checks(rec: PhaseRecord) -> list[Check]:
    """Attention DP: per rank, from the step log's ``dp_rank`` and each process's counters."""
    by_pid: dict[int, list[Mapping]] = {}
    for s in rec.steps:
        by_pid.setdefault(int(s.get("pid", 0)), []).append(s)
    rank_of = {
        pid: next((s["dp_rank"] for s in steps if "dp_rank" in s), None)
        for pid, steps in by_pid.items()
    }
    ranks = {r for r in rank_of.values() if r is not None}
    idle = sum(1 for s in rec.steps if s["mode"] == "IDLE")
    checks = [
        Check(
            rec.name,
            f"every one of the {rec.dp} attention-DP ranks ran steps",
            ranks == set(range(rec.dp)),
            f"ranks seen {sorted(ranks)} in {len(by_pid)} processes",
        ),
        Check(rec.name, "some ranks ran IDLE steps (the workload idles them)", idle > 0, f"{idle}"),
        _logits_gather(rec),
    ]
    if rec.graph == "bcg":
        # Upstream relabels so that every rank replays the prefill graph (DPAttnAdapter's vote).
        relabelled = sum(1 for s in rec.steps if _relabelled(s))
        checks.append(
            Check(
                rec.name,
                "SGLang ran decode-only batches as EXTEND on some rank",
                relabelled > 0,
                f"{relabelled} steps",
            )
        )
    if rec.split != "off":
        over, missing = [], []
        for pid, steps in by_pid.items():
            ev = _pid_events(rec.counters_by_pid.get(pid, {}), PATCH)
            planned = sum(n for k, n in ev.items() if k.startswith("steps_seen.")) + ev.get(
                "replays_seen", 0
            )
            busy = sum(1 for s in steps if s["mode"] != "IDLE")
            if planned > busy:
                over.append(f"rank {rank_of[pid]}: {planned} planned, {busy} non-IDLE steps")
            owed = sum(1 for s in steps if s["mode"] == "MIXED" or _relabelled(s))
            split = ev.get("steps_split", 0) + ev.get("replays_split", 0)
            if split < owed:
                missing.append(
                    f"rank {rank_of[pid]}: {owed} MIXED or relabelled steps, {split} split"
                )
        checks.append(Check(rec.name, "idle ranks planned no split", not over, "; ".join(over)))
        if rec.split == "always":
            checks.append(
                Check(
                    rec.name,
                    "the split acted on every rank's MIXED and relabelled decode-only steps",
                    not missing,
                    "; ".join(missing),
                )
            )
    if rec.read_done:
        silent = []
        for pid, steps in by_pid.items():
            replayed = sum(1 for s in steps if s["mode"] == "MIXED" and s.get("graph"))
            ev = _pid_events(rec.counters_by_pid.get(pid, {}), RD_PATCH)
            if replayed and not ev.get("replays_published.mixed", 0):
                silent.append(f"rank {rank_of[pid]}: {replayed} MIXED replays, none published")
        checks.append(
            Check(
                rec.name,
                "read-done published on every rank that replayed MIXED steps",
                not silent,
                "; ".join(silent),
            )
        )
    return checks


def _logits_gather(rec: PhaseRecord) -> Check:
    """Without logprobs a step's logits are one row per request, so a gather over the running
    requests holds at most ``max_running`` rows; one over a padded bucket holds its tokens."""
    rows = rec.logits_gather_rows
    ok = bool(rows) and rec.max_running > 0 and max(rows) <= rec.max_running
    return Check(
        rec.name,
        "every DP logits gather held the live rows, not a padded bucket",
        ok,
        f"{len(rows)} gathers, largest {max(rows) if rows else '-'} rows, "
        f"{rec.max_running} running requests at most",
    )


def _live_width(rec: PhaseRecord, mixed_graph: int) -> Check:
    """The live-width variant: every captured c4 indexer became a break, the breaks ran in the
    replays and narrowed the page table there (the workload's contexts are far below the capture
    width), and nothing fell back. Steps with a request beyond 4 x top-k tokens (the ``long``
    segment's) keep the capture width by design (``long_rows``): counted, not a failure."""
    ev, fb = _events(rec, LW_PATCH), _fallbacks(rec, LW_PATCH)
    full_width = fb.pop("long_rows", 0)
    wrapped, ran, narrowed = (
        ev.get("layers_wrapped", 0),
        ev.get("breaks_run", 0),
        ev.get("breaks_narrowed", 0),
    )
    ok = wrapped > 0 and mixed_graph > 0 and ran >= mixed_graph and narrowed > 0 and not fb
    return Check(
        rec.name,
        "live_width_indexer ran the c4 indexer at the live width in replays",
        ok,
        f"{wrapped} indexer calls captured as breaks, {ran} breaks run ({narrowed} narrowed, "
        f"{full_width} kept the capture width for a request beyond the top-k) over {mixed_graph} "
        f"replayed MIXED steps; fallbacks {fb or 'none'}",
    )


def _lean(rec: PhaseRecord, layers: int) -> list[Check]:
    """The lean variant: both patches act under the breakable prefill graph; eager and dgraph
    phases have none, so there both must count nothing."""
    if rec.graph != "bcg":
        return [_lean_inactive(rec)]
    replays = len(_of_mode(rec.steps, "MIXED", graph=True)) + len(
        _of_mode(rec.steps, "EXTEND", graph=True)
    )
    return [_wo_a_in_break(rec, layers, replays), _compress_plan_cap(rec, replays)]


def _listed(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k}: {n}" for k, n in sorted(counts.items())) or "none"


def _wo_a_in_break(rec: PhaseRecord, layers: int, replays: int) -> Check:
    """Every layer of every capture took its attention through wo_a in one break
    (``layers_through_wo_a``, counted per captured layer), each replayed prefill step ran every
    layer's break (``breaks_run``, also counted once per layer at capture), no break fell back
    to upstream's."""
    ev, fb = _events(rec, WO_A_PATCH), _fallbacks(rec, WO_A_PATCH)
    through, ran = ev.get("layers_through_wo_a", 0), ev.get("breaks_run", 0)
    ok = through > 0 and through % layers == 0 and 0 < ran and layers * replays <= ran and not fb
    return Check(
        rec.name,
        "wo_a_in_break ran attention, inverse RoPE and wo_a in one break per layer",
        ok,
        f"layers_through_wo_a {through} ({layers} layers a capture), breaks_run {ran} "
        f"(at least {layers} x {replays} replayed prefill steps); fallbacks {_listed(fb)}",
    )


def _compress_plan_cap(rec: PhaseRecord, replays: int) -> Check:
    """Each replayed prefill step's batch was checked against the capped compressor plans
    (``batches_checked``, in ``can_run_graph``), and none was over the cap (``over_cap``: it
    would have run eagerly). Other fallbacks (a plan left uncapped) are listed."""
    ev, fb = _events(rec, CAP_PATCH), dict(_fallbacks(rec, CAP_PATCH))
    checked, over = ev.get("batches_checked", 0), fb.pop("over_cap", 0)
    capped = {k: n for k, n in ev.items() if k.startswith("plans_capped.")}
    return Check(
        rec.name,
        "compress_plan_cap checked every replayed batch against the capped plans",
        0 < checked and replays <= checked and not over,
        f"batches_checked {checked} over {replays} replayed prefill steps, over_cap {over}; "
        f"plans capped {_listed(capped)}; other fallbacks {_listed(fb)}",
    )


def _lean_inactive(rec: PhaseRecord) -> Check:
    active = {
        f"{p} {kind}": {k: n for k, n in counts.items() if n}
        for p in (WO_A_PATCH, CAP_PATCH)
        for kind, counts in (("events", _events(rec, p)), ("fallbacks", _fallbacks(rec, p)))
        if any(counts.values())
    }
    return Check(
        rec.name,
        "wo_a_in_break and compress_plan_cap inactive without a breakable prefill graph",
        not active,
        f"active: {active}" if active else "",
    )


def _drop_empty(rec: PhaseRecord) -> Check:
    """The drop-empty variant: the patch examined the breakable graphs it captured (how many
    empty segments it found is information: DSV4's layers may have none) and, where it dropped
    some, skipped their launches."""
    ev, fb = _events(rec, DES_PATCH), _fallbacks(rec, DES_PATCH)
    checked, dropped = ev.get("captures_checked", 0), ev.get("segments_dropped", 0)
    skipped = ev.get("launches_skipped", 0)
    ok = checked > 0 and not fb and (dropped == 0 or skipped > 0)
    return Check(
        rec.name,
        "drop_empty_segments examined every capture",
        ok,
        f"{checked} captures checked, {dropped} empty segments dropped, {skipped} launches "
        f"skipped; fallbacks {dict(fb) or 'none'}",
    )


def _aborted_mid_generation(rec: PhaseRecord) -> Check:
    """Each request the client aborted streamed its tokens before the abort, then stopped short
    of its length with an abort (not an error, not its full length)."""
    bad = []
    for rid, after in sorted(rec.abort_targets.items()):
        got, n = len(rec.outputs.get(rid) or ()), rec.expected_lens.get(rid, 0)
        finish = rec.finish_reasons.get(rid)
        if finish != "abort" or not after <= got < n:
            bad.append(f"{rid}: {got} of {n} tokens (abort after {after}), finish {finish}")
    return Check(
        rec.name,
        "aborted requests stopped mid-generation",
        not bad,
        "; ".join(bad) or f"{len(rec.abort_targets)} aborted",
    )


def mixed_decode_lens(steps: Iterable[Mapping]) -> set[int]:
    """The context lengths (``seq_lens``, the new token included) of the decode rows of the
    target's MIXED steps: the requests with one new token, as the step log recorded them."""
    lens = set()
    for s in steps:
        if s["mode"] != "MIXED" or s.get("draft"):
            continue
        exts = s.get("extend_seq_lens") or ()
        lens.update(n for n, e in zip(s.get("seq_lens") or (), exts, strict=False) if e == 1)
    return lens


def _boundary_crossed(rec: PhaseRecord) -> Check:
    missing = sorted(set(rec.boundary_lens) - mixed_decode_lens(rec.steps))
    return Check(
        rec.name,
        "decode rows of MIXED steps crossed the SWA window, the page and the c4 top-k threshold",
        not missing,
        f"no decode row at context {missing}" if missing else "",
    )


def _logprob_unmixed(rec: PhaseRecord) -> list[Check]:
    """A return_logprob request: its logprobs came back, and from its prefill to its last step
    (the target's steps whose batch returns logprobs, ``"logprob"`` in the step log) the prompt
    that arrived beside it ran as EXTEND steps, no step MIXED (upstream mixes none then)."""
    missing = {r: rec.logprobs.get(r, 0) for r in rec.logprob_rids if not rec.logprobs.get(r)}
    target = [s for s in rec.steps if not s.get("draft")]
    marked = [i for i, s in enumerate(target) if s.get("logprob")]
    window = target[marked[0] : marked[-1] + 1] if marked else []
    modes = Counter(s["mode"] for s in window)
    return [
        Check(
            rec.name,
            "the return_logprob requests got their logprobs",
            not missing,
            f"none for {missing}" if missing else f"{dict(sorted(rec.logprobs.items()))}",
        ),
        Check(
            rec.name,
            "no MIXED step while a return_logprob request ran (the prompt beside it as EXTEND)",
            bool(marked) and modes["MIXED"] == 0 and modes["EXTEND"] > 1,
            f"steps from its prefill to its last: {dict(sorted(modes.items()))}"
            if marked
            else "no step returned logprobs",
        ),
    ]


def _pool_pressure(rec: PhaseRecord) -> Check:
    """The pressure workload did what it is for: the scheduler retracted decoding requests and
    the radix cache evicted (the pool log, e2e_pool_log.py)."""
    p = rec.pool
    evicted = p.get("evicted_tokens", 0) + p.get("evicted_swa_tokens", 0)
    return Check(
        rec.name,
        "the pool forced retractions and evictions",
        p.get("retracted_reqs", 0) > 0 and evicted > 0,
        f"{p.get('retractions', 0)} retractions ({p.get('retracted_reqs', 0)} requests), "
        f"{p.get('evictions', 0)} evictions ({p.get('evicted_tokens', 0)} tokens, "
        f"{p.get('evicted_swa_tokens', 0)} SWA tokens)",
    )


def _tokens_equal(rec: PhaseRecord, baseline: PhaseRecord | None, why: str = "") -> Check:
    """``why``: what a difference would mean, added to a failed check's detail."""
    if baseline is None or not baseline.ran:
        return Check(rec.name, "tokens equal the off phase", False, "the off phase did not run")
    # Where the client aborted a request its tokens depend on when the abort landed.
    aborted = set(rec.abort_targets) | set(baseline.abort_targets)
    mism = [m for m in compare_tokens(baseline.outputs, rec.outputs) if m.rid not in aborted]
    # A retracted request is prefilled again over its output: named, still a failure.
    retracted = set(rec.pool.get("retracted_rids", ())) | set(
        baseline.pool.get("retracted_rids", ())
    )
    detail = "; ".join(
        f"{m.rid}: first differs at {m.first_diff} ({m.baseline_len} vs {m.phase_len} tokens)"
        + (" (retracted)" if m.rid in retracted else "")
        for m in mism
    )
    return Check(
        rec.name,
        f"tokens equal {baseline.name}" + (" (surviving requests)" if aborted else ""),
        not mism,
        f"{why}: {detail}" if mism and why else detail,
    )


def accept_length(rec: PhaseRecord) -> float | None:
    """Tokens per verify step over every request (upstream's ``spec_accept_length``, pooled),
    None without verify steps."""
    verify = sum(c["verify_ct"] for c in rec.spec_counts.values())
    return sum(c["tokens"] for c in rec.spec_counts.values()) / verify if verify else None


def _speculative(
    rec: PhaseRecord,
    reference: PhaseRecord | None,
    upstream_arm: PhaseRecord | None,
    mixed: int,
    policy: AdaptivePolicy,
) -> list[Check]:
    """A speculative phase: drafts verified, and against the eager reference its tokens and
    accept length; with the split on, how its counters saw the draft's forwards."""
    unverified = sorted(
        r
        for r in rec.expected_lens
        if r not in rec.abort_targets and rec.spec_counts.get(r, {}).get("verify_ct", 0) <= 0
    )
    out = [
        Check(
            rec.name,
            "speculative decoding verified drafts for every request",
            not unverified,
            f"no verify step reported for {unverified[:8]}" if unverified else "",
        )
    ]
    if rec.swing_accept:
        out.append(_acceptance_swung(rec))
    if rec.is_baseline:
        return out
    # A split-off arm runs no split: a difference there is upstream's.
    why = f"{_upstream(rec.graph)} (the split is off in this phase)" if rec.split == "off" else ""
    upstream_differs = (
        upstream_arm is not None
        and upstream_arm.ran
        and reference is not None
        and reference.ran
        and bool(compare_tokens(reference.outputs, upstream_arm.outputs))
    )
    if upstream_differs:
        why = f"{upstream_arm.name} differs from {reference.name} as well: {_upstream(rec.graph)}"
    out.append(_tokens_equal(rec, reference, why))
    out.append(_accept_length_equal(rec, reference, why))
    if upstream_differs:
        # Upstream's difference held fixed: what the split alone changes.
        out.append(_tokens_equal(rec, upstream_arm))
    if rec.split != "off":
        out.extend(_draft_counted_apart(rec, mixed, policy))
    if rec.tail_graphs:
        out.append(_tails_replayed(rec))
    return out


def tokens_per_verify_step(rec: PhaseRecord) -> float | None:
    """Tokens each verify step committed, over every request: its accepted drafts plus the
    target's own token (``spec_num_correct_drafts`` / verify steps + 1). Unlike the accept
    length it leaves out the tokens no verify step made: each request's first (its prefill)
    and one per MIXED step a running request sat in."""
    verify = sum(c["verify_ct"] for c in rec.spec_counts.values())
    drafts = sum(c["correct_drafts"] for c in rec.spec_counts.values())
    return 1 + drafts / verify if verify else None


def _acceptance_swung(rec: PhaseRecord) -> Check:
    """The -acc variant: verify steps committed 2 and 3 tokens in a mix (each step draws one of
    the two), so the tokens per verify step lie well inside (2, 3); a request's last step may
    be cut short by its token limit, which moves the mean by little."""
    per_step = tokens_per_verify_step(rec)
    lo, hi = SWING_ACCEPT_RANGE
    return Check(
        rec.name,
        f"acceptance swung between 2 and 3 tokens a verify step (tokens per verify step in "
        f"[{lo}, {hi}])",
        per_step is not None and lo <= per_step <= hi,
        f"tokens per verify step {'none' if per_step is None else f'{per_step:.4f}'}",
    )


TAILS_CHECK = "every split layer's decode tail from the graphs (tail_graph_replays, _schedules)"


def _tails_replayed(rec: PhaseRecord) -> Check:
    """The -tail variant: every split layer's decode tail from the graphs' static buffers, the
    step's first layer of each ratio run eagerly to make the step's split schedule
    (``tail_graph_schedules``: split steps x ratios split) and every other one replayed from its
    CUDA graph (eager phases capture nothing else, so no call may have found the stream
    capturing)."""
    ev = _events(rec)
    per_ratio = [ev.get(f"layers_split.c{r}", 0) for r in RATIOS]
    layers = sum(per_ratio)
    steps = ev.get("steps_split", 0) + ev.get("replays_split", 0)
    replays = ev.get("tail_graph_replays", 0)
    schedules = ev.get("tail_graph_schedules", 0)
    eager = {k: n for k, n in ev.items() if k.startswith("tail_graph_eager.")}
    expected = steps * sum(1 for n in per_ratio if n)
    return Check(
        rec.name,
        TAILS_CHECK,
        layers > 0 and schedules == expected and replays == layers - expected > 0 and not eager,
        f"tail_graph_replays {replays}, tail_graph_schedules {schedules} (expected "
        f"{expected}: {steps} split steps x ratios) of {layers} layers split; eager calls "
        f"{eager or 'none'}",
    )


def _accept_length_equal(rec: PhaseRecord, reference: PhaseRecord | None, why: str) -> Check:
    ref_name = reference.name if reference is not None else SPEC_REFERENCE
    name = f"accept length equals {ref_name}'s (within {ACCEPT_LENGTH_TOLERANCE:.0%})"
    if reference is None or not reference.ran:
        return Check(rec.name, name, False, "the reference did not run")
    mine, ref = accept_length(rec), accept_length(reference)
    if mine is None or ref is None:
        return Check(rec.name, name, False, f"no verify steps: {mine} vs {ref}")
    ok = abs(mine - ref) <= ACCEPT_LENGTH_TOLERANCE * ref
    moved = sorted(
        r
        for r, c in rec.spec_counts.items()
        if reference.spec_counts.get(r, {}).get("verify_ct") != c["verify_ct"]
    )
    detail = f"{mine:.4f} vs {ref:.4f}; verify steps differ for {len(moved)} requests"
    if moved:
        detail += f" ({moved[:8]})"
    return Check(rec.name, name, ok, f"{why}: {detail}" if why and not ok else detail)


def _draft_counted_apart(rec: PhaseRecord, mixed: int, policy: AdaptivePolicy) -> list[Check]:
    """The split's counters under speculation: the draft's forward of each MIXED step fell back
    once and was counted apart, nothing else fell back, and no draft layer split."""
    ev, fb = _events(rec), _fallbacks(rec)
    draft_seen = ev.get("draft_replays_seen", 0) + sum(
        n for k, n in ev.items() if k.startswith("draft_steps_seen.")
    )
    split = ev.get("steps_split", 0) + ev.get("replays_split", 0)
    layers = {r: ev.get(f"layers_split.c{r}", 0) for r in RATIOS}
    expected = {r: policy.layers.get(r, 0) * split for r in RATIOS}
    # Under online c128 MTP the target's MIXED steps fall back too (_online_fell_back).
    expected_keys = ("spec_draft", ONLINE_FALLBACK) if rec.online_c128 else ("spec_draft",)
    others = {k: n for k, n in fb.items() if k not in expected_keys}
    return [
        Check(
            rec.name,
            "the draft's forward of every MIXED step kept upstream's path (spec_draft)",
            fb.get("spec_draft", 0) == mixed > 0,
            f"spec_draft {fb.get('spec_draft', 0)} of {mixed} MIXED steps",
        ),
        Check(
            rec.name,
            "the draft's steps counted apart (draft_steps_seen, draft_replays_seen)",
            draft_seen == mixed,
            f"{draft_seen} draft steps seen, {mixed} MIXED steps",
        ),
        Check(rec.name, "no unexpected fallback", not others, f"{others}" if others else ""),
        Check(
            rec.name,
            "layers split are the target's only (its layers per ratio x split steps)",
            layers == expected,
            f"layers_split {layers}, expected {expected} ({split} split steps)",
        ),
    ]


def _online_fell_back(rec: PhaseRecord, mixed: int, ev: dict, fb: dict) -> list[Check]:
    """The -online variant's split arms: the split keeps upstream's path in every target MIXED
    step (plan.py ``_speculative_reason``: the compressor's per-request online state is not
    split), after recognising it, so each is counted once in ``steps_seen.*``/``replays_seen``
    and once in the ``spec_online_c128`` fallback, and nothing split or was decided."""
    seen = sum(n for k, n in ev.items() if k.startswith("steps_seen.")) + ev.get("replays_seen", 0)
    fell = fb.get(ONLINE_FALLBACK, 0)
    acted = {
        k: n
        for k, n in ev.items()
        if n and (k in SPLIT_ACTIVITY or k.startswith(("layers_split.", "tail_graph")))
    }
    return [
        Check(
            rec.name,
            "every MIXED step recognised (steps_seen, replays_seen)",
            seen == mixed,
            f"recognised {seen} of {mixed}",
        ),
        Check(
            rec.name,
            f"the split fell back on every MIXED step for online c128 MTP ({ONLINE_FALLBACK})",
            fell == mixed > 0,
            f"{ONLINE_FALLBACK} {fell} of {mixed} MIXED steps",
        ),
        Check(
            rec.name,
            "no MIXED step split under online c128 MTP (steps_split, replays_split 0)",
            not acted,
            _listed(acted) if acted else "",
        ),
    ]


def _read_done(rec: PhaseRecord) -> list[Check]:
    """The read-done variant: the event published where replays ran, the debug check armed by
    it, and no replay handed back to upstream's whole-forward barrier."""
    ev, fb = _events(rec, RD_PATCH), _fallbacks(rec, RD_PATCH)
    out = []
    for mode in ("MIXED", "EXTEND"):
        replayed = len(_of_mode(rec.steps, mode, graph=True))
        if replayed:
            published = ev.get(f"replays_published.{mode.lower()}", 0)
            out.append(
                Check(
                    rec.name,
                    f"read-done published for replayed {mode} steps",
                    published > 0,
                    f"published {published} of {replayed} replayed {mode} steps",
                )
            )
    marked = _events(rec, WAR_PATCH).get("forwards_marked", 0)
    out.append(
        Check(
            rec.name,
            "the WAR snapshot check saw read-done published",
            marked > 0,
            f"{marked} forwards marked",
        )
    )
    out.append(
        Check(
            rec.name,
            "no replay_read_done fallback",
            not fb,
            ", ".join(f"{reason}: {n}" for reason, n in sorted(fb.items())),
        )
    )
    return out


def _read_done_inactive(rec: PhaseRecord) -> Check:
    active = {
        p: {"events": _events(rec, p), "fallbacks": _fallbacks(rec, p)}
        for p in (RD_PATCH, WAR_PATCH)
        if _events(rec, p) or _fallbacks(rec, p)
    }
    return Check(
        rec.name,
        "replay_read_done and war_snapshot_check inactive (flags off)",
        not active,
        f"active: {active}" if active else "",
    )


def _acted(
    rec: PhaseRecord,
    mixed_eager: int,
    mixed_graph: int,
    ev: dict[str, int],
    fb: dict[str, int],
    policy: AdaptivePolicy,
) -> list[Check]:
    out = []
    if mixed_eager == 0 and mixed_graph == 0:
        return [
            Check(rec.name, "mixed_split acted", False, "no MIXED step: nothing shows the split")
        ]
    # Eager and replayed MIXED steps: (count, graph, what, check, the counters of the steps
    # seen, split and kept unsplit).
    kinds = (
        (
            mixed_eager,
            False,
            "eager MIXED step",
            "every eager MIXED step recognised (run as EXTEND)",
            ("steps_seen.mixed_run_as_extend", "steps_seen.mixed"),
            "steps_split",
            "steps_unsplit_adaptive",
        ),
        (
            mixed_graph,
            True,
            "replayed MIXED step",
            "every replayed MIXED step recognised",
            ("replays_seen",),
            "replays_split",
            "replays_unsplit_adaptive",
        ),
    )
    for count, graph, what, check, seen_by, split, kept in kinds:
        if not count:
            continue
        seen = sum(ev.get(k, 0) for k in seen_by)
        out.append(Check(rec.name, check, seen == count, f"recognised {seen} of {count}"))
        out += _decided(
            rec,
            what,
            _of_mode(rec.steps, "MIXED", graph=graph),
            ev.get(split, 0),
            ev.get(kept, 0),
            policy,
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


def _decided(
    rec: PhaseRecord,
    what: str,
    steps: Sequence[Mapping],
    split: int,
    kept: int,
    policy: AdaptivePolicy,
) -> list[Check]:
    n = len(steps)
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
        _as_cost_model(rec, what, steps, split, kept, policy),
    ]


def _as_cost_model(
    rec: PhaseRecord,
    what: str,
    steps: Sequence[Mapping],
    split: int,
    kept: int,
    policy: AdaptivePolicy,
) -> Check:
    """The counters say how many steps adaptive split, the step log what the cost model says
    of each step's shape: the two counts must agree (per-step pairing is not logged)."""
    name = f"adaptive split the {what}s the cost model splits"
    n = len(steps)
    decisions = [policy.splits(s) for s in steps]
    unknown = decisions.count(None)
    if unknown:
        return Check(
            rec.name,
            name,
            False,
            f"{unknown} of {n} {what}s have no shape in the step log (no decode count): "
            "the cost model cannot be run on them",
        )
    expected = decisions.count(True)
    ok = split == expected and kept == n - expected
    got = f"adaptive split {split}, kept unsplit {kept}"
    if expected == 0:
        detail = (
            f"the cost model keeps all {n} {what}s unsplit at these shapes; the split itself "
            f"is shown by the always phases ({got})"
        )
    else:
        detail = f"the cost model splits {expected} of {n}, keeps {n - expected}; {got}"
    return Check(rec.name, name, ok, detail)


def summarize(rec: PhaseRecord) -> list[str]:
    """Lines for the log: steps by mode and graph, the counters of the split and the read-done
    patches, and every patch's fallbacks."""
    lines = [f"steps: {steps_by_mode(rec.steps)}"]
    if rec.spec:
        length = accept_length(rec)
        verify = sum(c["verify_ct"] for c in rec.spec_counts.values())
        lines.append(
            f"speculative: accept length {'none' if length is None else f'{length:.4f}'} over "
            f"{verify} verify steps of {len(rec.spec_counts)} requests"
        )
    lines += [f"{p} counters: {_events(rec, p) or '{}'}" for p in (PATCH, RD_PATCH, WAR_PATCH)]
    lines.append(f"fallbacks (every patch): {rec.counters.get('fallbacks') or 'none'}")
    if rec.pool_pressure or rec.abort_targets:
        lines.append(f"pool: {rec.pool or '{}'}; aborted: {rec.finish_reasons or '{}'}")
    at_import = split_stub_calls(rec.stub_calls)[1]
    if at_import:
        lines.append(
            f"stubs called while importing a module upstream then skipped: {sorted(set(c.split(' (pid')[0] for c in at_import))}"
        )
    others = {
        p: c
        for p, c in rec.counters.get("events", {}).items()
        if p not in (PATCH, RD_PATCH, WAR_PATCH)
    }
    if others:
        lines.append(f"other patches: {others}")
    return lines
