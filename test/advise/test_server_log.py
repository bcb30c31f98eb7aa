"""The profiler's factor on the eager host from the server's log (advise/server_log.py): the
profile's own lines bound its window, replayed batches and batches after an empty queue are not
timed, and too little evidence is a reason, not a number. The lines themselves:
test/core/test_prefill_log.py."""

from __future__ import annotations

import pytest
from advise_standin import batch_line as line

from sglang_mixgraph.advise import server_log as L

PID = "mixgraph-advise-1-2"


START = (
    f"[2026-12-07 10:00:01] Profiling starts. Traces will be saved to: /t (with profile id: {PID})"
)
STOP = "[2026-12-07 10:00:02] Stop profiling..."


def test_the_factor_is_the_unprofiled_gaps_over_the_profiled_ones():
    before = [line(900, running=0), *(line(g) for g in (280, 290, 270, 285, 300))]
    during = [line(5000), *(line(g) for g in (400, 390, 410, 420))]
    after = [line(14000), line(280)]  # the export's pause, then unprofiled again
    text = "\n".join([*before, START, *during, STOP, *after])
    s = L.host_scale(text, PID)
    # each window's first line has no predecessor in it; the decode-free first line is not MIXED
    assert (s.unprofiled_batches, s.profiled_batches) == (5, 4)
    assert s.unprofiled_ms == pytest.approx(285, abs=0.01)
    assert s.profiled_ms == pytest.approx(405, abs=0.01)
    assert s.factor == pytest.approx(285 / 405, abs=1e-4)


def test_replayed_batches_and_batches_after_an_empty_queue_are_not_eager_steps():
    # a replay; a batch that empties the queue; after it decode-only steps ran, so the next
    # line's gap (900) spans several steps
    before = [line(280), line(280), line(30, graph=True), line(280, queued=0), line(900)]
    before += [line(280)] * 4
    during = [line(400)] * 6
    s = L.host_scale("\n".join([*before, START, *during, STOP]), PID)
    assert s.unprofiled_batches == 6 and s.unprofiled_ms == pytest.approx(280, abs=0.01)


def test_an_earlier_profile_ends_the_before_window_and_another_id_is_not_this_one():
    earlier = [line(280)] * 6 + [START.replace(PID, "other"), line(400), STOP]
    text = "\n".join([*earlier, line(281), line(282), START, *[line(400)] * 6, STOP])
    reason = L.host_scale(text, PID)
    assert reason == (
        "the log has 1 back-to-back eager MIXED batches before the profile and 5 in it "
        "(at least 4 each are needed)"
    )
    assert L.host_scale(text, "nope") == "the log does not show profile nope starting"


def test_the_bursts_prefill_share_prices_the_profile_and_leaves_the_export_out():
    before = [line(900, running=0), *(line(g) for g in (280, 280, 280, 280))]
    during = [line(400)] * 4
    after = [line(14000), line(280), line(280)]  # the trace export's pause, then unprofiled
    text = "\n".join([*before, START, *during, STOP, *after])
    scale = L.HostScale(280.0, 400.0, 4, 4)
    spent = 4 * 0.28 + 4 * 0.4 + 14.0 + 2 * 0.28
    got = L.served_share(text, PID, scale, duration_s=spent + 2.0)
    assert got.batches == 11
    # the export leaves the duration and counts as one median step (280 ms, all priced)
    assert got.prefill_s == pytest.approx(6 * 0.28 + 4 * 0.4 * 0.7 + 0.28, abs=2e-3)
    assert got.tail_s == pytest.approx(2.0, abs=2e-3)
    assert got.share == pytest.approx(got.prefill_s / (got.prefill_s + got.tail_s))
    assert got.to_json()["prefill_share"] == got.share


def test_no_share_without_the_profiles_stop_enough_batches_or_a_tail():
    scale = L.HostScale(280.0, 400.0, 4, 4)
    burst = [line(900, running=0), *[line(280)] * 4, START, *[line(400)] * 4]
    assert "starting and stopping" in L.served_share("\n".join(burst), PID, scale, 60.0)
    few = [line(900, running=0), line(280), START, line(400), STOP]
    assert "2 timed prefill batches" in L.served_share("\n".join(few), PID, scale, 60.0)
    whole = "\n".join([*burst, STOP])
    assert "other traffic shared the server" in L.served_share(whole, PID, scale, 2.0)
