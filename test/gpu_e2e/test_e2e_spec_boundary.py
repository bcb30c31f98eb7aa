"""The speculative boundary workload on CPU: every boundary length reached by a MIXED step's
decode row whatever the acceptance, its schedule model held against the H100 record, its fit in
the documented engine settings, and the driver's and phase's use of it."""

from __future__ import annotations

import itertools
import json
import lzma
import sys
from pathlib import Path
from types import SimpleNamespace

import e2e_phases as P
import e2e_spec_boundary as SB
import e2e_workload as W
import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "docs/results/e2e_tiny_dsv4_mtp_h100/boundary_results.json.xz"
SEGS = W.build(chunk=P.CHUNK, workload=W.BOUNDARY, spec=True)
SEG = SEGS[0]
PROMPTS = [len(r.prompt) for r in SEG.first]
STEPS = SB.mixed_schedule(PROMPTS, P.CHUNK)
# The engine override the documented speculative command passes.
OVERRIDE_POOL, OVERRIDE_RUNNING = 32768, 16
SHIFT_MARGIN = 12  # tokens a row's whole schedule may move, either way, and still cross
N = SB.ROWS_PER_BOUNDARY


def _groups():
    """(boundary name, its lengths, the indices of its rows in the segment)."""
    for g, name in enumerate(SB.ORDER):
        yield name, W.BOUNDARY_CROSSINGS[name], range(g * N, (g + 1) * N)


def _seen(rows, extra=lambda i, t: 0) -> set[int]:
    """Contexts the given rows had in the modelled MIXED steps, each moved by ``extra``."""
    return {
        ctx + extra(i, t) for t, step in enumerate(STEPS) for i, ctx in step.items() if i in rows
    }


def test_without_speculation_the_boundary_workload_is_unchanged():
    plain = W.build(chunk=P.CHUNK, workload=W.BOUNDARY)
    assert plain == W.build(chunk=P.CHUNK, workload=W.BOUNDARY, spec=False) != SEGS
    assert [(s.name, len(s.first), len(s.then)) for s in plain] == [("boundary", 6, 1)]
    assert W.engine_overrides(W.BOUNDARY) == {}
    assert W.engine_overrides(W.BOUNDARY, spec=True) == {"swa_full_tokens_ratio": 1.0}
    # The other workloads under speculation: the same, then the logprob segment.
    short = W.build(chunk=P.CHUNK, workload="short")
    assert W.build(chunk=P.CHUNK, workload="short", spec=True)[:-1] == short
    assert [s.name for s in SEGS] == ["boundary", W.LOGPROB]


def test_every_request_is_sent_at_once_rows_first_and_late_last():
    assert SEGS == W.build(chunk=P.CHUNK, workload=W.BOUNDARY, spec=True)  # fixed seed
    assert SEG.then == () and SEG.first[-1].rid == "bnd_late"
    rids = [r.rid for r in SEG.first[:-1]]
    assert rids == [f"bnd_{name}_{j}" for name in SB.ORDER for j in range(N)]
    # The late prompt is the last to prefill, its chunks the last MIXED steps; the rows decode
    # through every one of them and past them.
    late = len(SEG.first) - 1
    assert late not in STEPS[-1] and all(late not in s for s in STEPS)
    for i, r in enumerate(SEG.first[:-1]):
        first = next(t for t, s in enumerate(STEPS) if i in s)
        assert all(i in s for s in STEPS[first:])
        assert r.max_new >= len(STEPS) - first + SB.ROW_MARGIN


def test_the_schedule_model_gives_decode_rows_one_token_of_the_chunk_each():
    steps = SB.mixed_schedule([600, 100, 1200], 512)
    # 512 of 600; its last 88, all 100 and 324 of 1200; then 1200 goes on beside the two rows
    # that finished (510 tokens of the chunk), and its last 366.
    assert steps == [{}, {}, {0: 601, 1: 101}, {0: 602, 1: 102}]
    with pytest.raises(ValueError, match="no chunk"):
        SB.mixed_schedule([10] * 5 + [600], 4)


def _record_mixed_runs():
    """Consecutive target MIXED steps of the H100 boundary record, every phase."""
    report = json.loads(lzma.decompress(RECORD.read_bytes()))
    for phase in report["phases"].values():
        target = [s for s in phase["steps"] if not s.get("draft")]
        for a, b in itertools.pairwise(target):
            if a["mode"] == b["mode"] == "MIXED":
                yield a, b


def _decode(step):
    return [n for n, e in zip(step["seq_lens"], step["extend_seq_lens"], strict=False) if e == 1]


def test_the_h100_record_bears_out_the_schedule_model():
    """Under EAGLE a decode row of a MIXED step gets one token: across two MIXED steps in a row
    each row is one further (or a request whose prefill ended joins), whatever it accepted in
    verify steps; and a MIXED step's prefill takes at most the chunk less its decode rows."""
    pairs = list(_record_mixed_runs())
    assert len(pairs) > 100
    for a, b in pairs:
        prefill = [n for n, e in zip(a["seq_lens"], a["extend_seq_lens"], strict=False) if e > 1]
        assert set(_decode(b)) <= {n + 1 for n in _decode(a) + prefill}, (a, b)
        assert sum(e for e in a["extend_seq_lens"] if e > 1) <= P.CHUNK - len(_decode(a))
    # Where nothing else limits it (the late prompt's chunks), it takes exactly that.
    full = [a for a, _ in pairs if a["extend_seq_lens"][0] == P.CHUNK - len(_decode(a))]
    assert len(full) > 50


def test_each_boundary_length_is_reached_in_the_modelled_schedule():
    for name, lens, rows in _groups():
        assert set(lens) <= _seen(rows), name
    assert set(W.boundary_lens()) <= _seen(range(len(PROMPTS) - 1))


@pytest.mark.parametrize("shift", range(-SHIFT_MARGIN, SHIFT_MARGIN + 1))
def test_each_row_alone_reaches_its_boundary_if_the_schedule_moves_it(shift):
    """However far (within the margin) the real schedule moves one row (a verify step before
    the rows' first MIXED step, a chunk cut otherwise), it still crosses its boundary alone."""
    for name, lens, rows in _groups():
        for i in rows:
            assert set(lens) <= _seen([i], lambda i, t: shift), (name, i, shift)


def _skipped_by_one_verify(steps, rows, lens):
    """A verify step between MIXED steps t and t + 1 moves each row by its own 1 to 3 tokens
    (unseen) on top of the schedule: the first (place, advances) after which the rows miss one
    of ``lens``, or None."""
    for t0, advances in itertools.product(
        range(len(steps)), itertools.product((1, 2, 3), repeat=N)
    ):
        extra = dict(zip(rows, advances, strict=True))
        seen = {
            ctx + (extra[i] if t > t0 else 0)
            for t, step in enumerate(steps)
            for i, ctx in step.items()
            if i in rows
        }
        if not set(lens) <= seen:
            return t0, advances
    return None


def test_no_single_verify_step_anywhere_makes_a_boundary_skipped():
    """Every place and every pattern of advances: each boundary's rows still land on its three
    lengths."""
    for name, lens, rows in _groups():
        assert _skipped_by_one_verify(STEPS, rows, lens) is None, name


def test_three_rows_a_token_apart_would_miss_a_length(monkeypatch):
    """The worst case behind ``ROW_SPACING``: rows at L - 3, L - 2, L - 1 each advancing 3 in
    one verify step go from c to c + 4, and none is seen at L."""
    monkeypatch.setattr(SB, "ROW_SPACING", 1)
    seg = W.build(chunk=P.CHUNK, workload=W.BOUNDARY, spec=True)[0]
    steps = SB.mixed_schedule([len(r.prompt) for r in seg.first], P.CHUNK)
    missed = [_skipped_by_one_verify(steps, rows, lens) for _, lens, rows in _groups()]
    assert all(m is not None and 3 in m[1] for m in missed)


def test_it_fits_the_documented_engine_settings():
    assert W.peak_tokens(SEGS) <= OVERRIDE_POOL
    needed = W.concurrent_requests(W.BOUNDARY, SEGS, spec=True)
    assert needed == 3 * N + 1 and 8 < needed <= OVERRIDE_RUNNING <= P.MAX_RUNNING
    assert W.concurrent_requests(W.BOUNDARY, W.build(chunk=P.CHUNK, workload=W.BOUNDARY)) == 0


def test_the_driver_refuses_too_few_running_requests(tmp_path, monkeypatch, capsys):
    import run_e2e

    argv = ["run_e2e.py", "spec", "--workload", "boundary", "--out", str(tmp_path / "o")]
    argv += ["--work", str(tmp_path / "w"), "--engine-override", '{"max_running_requests": 8}']
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit):
        run_e2e.main()
    assert "needs 10 requests running at once, max_running_requests is 8" in capsys.readouterr().err
    # Speculative and plain phases cannot share the boundary workload (it differs).
    monkeypatch.setattr(sys, "argv", [*argv[:1], "spec", "bcg-off", *argv[2:-2]])
    with pytest.raises(SystemExit):
        run_e2e.main()
    assert "run the spec phases apart" in capsys.readouterr().err


def test_the_phase_sends_a_speculative_engine_the_speculative_workload(monkeypatch):
    import e2e_phase
    from test_e2e_spec import _SpecEngine

    sent = []

    class Engine(_SpecEngine):
        def generate(self, input_ids, sampling_params):
            sent.append([len(p) for p in input_ids])
            return super().generate(input_ids, sampling_params)

    monkeypatch.setitem(sys.modules, "sglang", SimpleNamespace(Engine=Engine))
    monkeypatch.setenv("MIXGRAPH_E2E_WORKLOAD", W.BOUNDARY)
    monkeypatch.setenv("SGLANG_MIXGRAPH_COUNTERS_LOG_INTERVAL", "0")
    res = e2e_phase.run({"chunked_prefill_size": P.CHUNK, "speculative_algorithm": "EAGLE"})
    assert res["ok"] and sent == [PROMPTS]  # one call, rows first, every request
    assert set(res["spec"]) == {r.rid for r in W.all_requests(SEGS)}
