"""The boundary workload on CPU: decode rows of MIXED steps across the SWA window, the page and
the c4 top-k threshold, and the check that reads the crossings from the step log."""

from __future__ import annotations

import json
from pathlib import Path

import e2e_checks as C
import e2e_phases as P
import e2e_workload as W
import pytest
from test_e2e_harness import POLICY

CONFIG = json.loads((Path(__file__).resolve().parent / P.CONFIG).read_text())
PAGE = 256  # DeepSeek-V4's page (SGLang sets page_size 256 for its attention backend)
SEGS = W.build(chunk=P.CHUNK, workload=W.BOUNDARY)
# The Engine override of the recorded short runs (docs/results/e2e_tiny_dsv4_h200.md).
OVERRIDE_POOL, OVERRIDE_RUNNING = 32768, 8


def test_the_boundaries_are_the_tiny_models():
    crossings = W.BOUNDARY_CROSSINGS
    assert crossings["swa"][1] == CONFIG["window_size"]
    assert crossings["page"][1] == PAGE
    # The c4 indexer keeps its top-k of the compressed keys: every key up to 4 x top-k tokens.
    assert crossings["c4_topk"][1] == 4 * CONFIG["index_topk"]
    assert all(lens == (b - 1, b, b + 1) for lens in crossings.values() for b in [lens[1]])
    assert W.boundary_lens() == (127, 128, 129, 255, 256, 257, 2047, 2048, 2049)


def test_boundary_workload_is_fixed_and_fits_the_recorded_engine_settings():
    assert SEGS == W.build(chunk=P.CHUNK, workload=W.BOUNDARY) and len(SEGS) == 1
    (seg,) = SEGS
    (late,) = seg.then
    assert -(-len(late.prompt) // P.CHUNK) == W.BOUNDARY_CHUNKS
    assert len(seg.first) + len(seg.then) <= OVERRIDE_RUNNING <= P.MAX_RUNNING
    assert W.peak_tokens(SEGS) <= OVERRIDE_POOL


# Tokens a row may have decoded before the late prompt's first chunk: the long rows' own prefill
# chunks and the late prompt's admission, with room for speculative steps accepting several.
DECODED_BEFORE = 16


@pytest.mark.parametrize("before", range(DECODED_BEFORE + 1))
def test_some_row_crosses_each_boundary_whatever_it_decoded_before_the_late_chunks(before):
    """A row's context in the late prompt's j-th MIXED step is prompt + 1 + before + j, where
    ``before`` is what it decoded until then (more under speculative decoding): for each
    boundary one of its rows still starts below it and the chunks carry it past."""
    (seg,) = SEGS
    for name, (below, at, above) in W.BOUNDARY_CROSSINGS.items():
        rows = [r for r in seg.first if r.rid.startswith(f"bnd_{name}_")]
        covered = set()
        for r in rows:
            start = len(r.prompt) + 1 + before
            # Still decoding through every late chunk.
            assert r.max_new >= before + W.BOUNDARY_CHUNKS + W.BOUNDARY_MARGIN
            covered.update(range(start, start + W.BOUNDARY_CHUNKS))
        assert {below, at, above} <= covered, (name, before)


def _mixed(lens, draft=False):
    step = {
        "mode": "MIXED",
        "graph": False,
        "seq_lens": [600, *lens],
        "extend_seq_lens": [512] + [1] * len(lens),
    }
    return dict(step, draft=True) if draft else step


def _rec(steps):
    return C.PhaseRecord(
        name="eager-off",
        split="off",
        ran=True,
        outputs={"r0": [1]},
        expected_lens={"r0": 1},
        steps=steps,
        boundary_lens=W.boundary_lens(),
    )


CROSSED = "decode rows of MIXED steps crossed the SWA window, the page and the c4 top-k threshold"


def test_the_check_reads_the_crossings_from_the_target_steps():
    every = [_mixed([n, n + 1000]) for n in W.boundary_lens()]
    assert C.mixed_decode_lens(every) >= set(W.boundary_lens())
    checks = C.check_phase(_rec(every), None, POLICY)
    assert next(c for c in checks if c.name == CROSSED).ok
    # 2048 only in a draft line and as a prefill row: not a crossing.
    partial = [s for s in every if 2048 not in s["seq_lens"]]
    partial += [
        _mixed([2048], draft=True),
        dict(_mixed([]), seq_lens=[2048], extend_seq_lens=[512]),
    ]
    bad = next(c for c in C.check_phase(_rec(partial), None, POLICY) if c.name == CROSSED)
    assert not bad.ok and bad.detail == "no decode row at context [2048]"
    # Outside the boundary workload the check is not made.
    plain = C.PhaseRecord(name="eager-off", split="off", ran=True, steps=every)
    assert CROSSED not in [c.name for c in C.check_phase(plain, None, POLICY)]


def test_the_driver_gives_the_boundary_phases_the_lens_to_check(tmp_path):
    import run_e2e

    phase = P.Phase("eager", "off")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / f"{phase.name}.log").write_text("")
    (tmp_path / phase.name / "steps").mkdir(parents=True)
    (tmp_path / phase.name / "out.json").write_text(json.dumps({"ok": True}))
    args = (phase, str(tmp_path), str(tmp_path / "logs"), 1.0, False)
    assert run_e2e.collect(*args, W.BOUNDARY)["record"].boundary_lens == W.boundary_lens()
    assert run_e2e.collect(*args, "short")["record"].boundary_lens == ()
