"""SGLang's prefill batch lines read back from its log (core/prefill_log.py): the format is the
installed SGLang's, a line's gap is its tokens over its throughput, the back-to-back MIXED gaps
per kind, and a visit's summary of its steps as `ab`'s report prints it."""

from __future__ import annotations

import inspect

import pytest

from sglang_mixgraph.core import prefill_log as P

# Verbatim, from SGLang 0.5.23's log of the 61-layer FP8 slice on one H100 (2026-12-07).
REAL = (
    "[2026-12-07 10:46:18] Prefill batch, #new-seq: 1, #new-token: 1024, #cached-token: 0, "
    "full token usage: 0.01, swa token usage: 0.02, #running-req: 1, #queue-req: 61, "
    "#pending-token: 0, cuda graph: False, input throughput (token/s): 2658.80"
)


def line(gap_ms: float, running: int = 8, queued: int = 40, graph: bool = False) -> str:
    return (
        f"[t] Prefill batch, #new-seq: 1, #new-token: 1024, #cached-token: 0, #running-req: "
        f"{running}, #queue-req: {queued}, #pending-token: 0, cuda graph: {graph}, input "
        f"throughput (token/s): {1024 / gap_ms * 1000:.2f}"
    )


def test_sglangs_own_line_is_read_and_its_gap_is_the_tokens_over_the_throughput():
    b = P.parse_batch(REAL)
    assert (b.tokens, b.running, b.queued, b.replayed, b.mixed) == (1024, 1, 61, False, True)
    assert b.gap_ms == pytest.approx(1024 / 2658.80 * 1000)
    assert P.parse_batch(REAL.replace("cuda graph: False", "cuda graph: True")).replayed
    assert P.parse_batch(REAL.replace("Prefill batch,", "Prefill batch [812],")).tokens == 1024
    assert (
        P.parse_batch(
            REAL.replace("throughput (token/s): 2658.80", "throughput (token/s): 0.00")
        ).gap_ms
        is None
    )
    assert P.parse_batch("[2026-12-07 10:46:18] Decode batch, #running-req: 8") is None


def test_the_line_is_the_one_the_installed_sglang_writes():
    from sglang.srt.managers.scheduler_components.metrics_reporter import SchedulerMetricsReporter
    from sglang.srt.managers.scheduler_components.profiler_manager import SchedulerProfilerManager

    source = inspect.getsource(SchedulerMetricsReporter.report_prefill_stats)
    for piece in (
        '"Prefill batch',
        "#new-token: ",
        "#running-req: ",
        "#queue-req: ",
        "input throughput (token/s): ",
        "gap_latency",
    ):
        assert piece in source, piece
    decode = inspect.getsource(SchedulerMetricsReporter.report_decode_stats)
    for piece in ('"Decode batch', "#running-req: ", "gen throughput (token/s): ", "gap_latency"):
        assert piece in decode, piece
    profiler = inspect.getsource(SchedulerProfilerManager)
    assert "Profiling starts" in profiler and "(with profile id: " in profiler
    assert '"Stop profiling"' in profiler


def test_the_tail_is_read_from_an_offset(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("\n".join([line(1)] * 3) + "\n")
    offset = log.stat().st_size
    with log.open("a") as f:
        f.write("\n".join([line(280)] * 2) + "\n")
    assert sum(b.mixed for b in P.batches(P.read_tail(log, offset))) == 2
    assert sum(b.mixed for b in P.batches(P.read_tail(log))) == 5


def test_a_visits_steps_are_counted_and_timed_per_kind():
    text = "\n".join(
        [
            line(900, running=0),  # the burst's first chunk: no decode row yet
            line(280),
            line(290),
            line(120, graph=True),  # after an eager batch with requests queued: timed
            line(110, graph=True),
            line(100, graph=True, queued=0),
            line(2000, graph=True),  # decode-only steps ran before it: not timed
            "[t] Decode batch, #running-req: 8, gen throughput (token/s): 10.0",
        ]
    )
    s = P.step_summary(text)
    assert (s["prefill_batches"], s["replayed"], s["mixed"]) == (7, 4, 6)
    assert (s["eager_mixed_timed"], s["replayed_mixed_timed"]) == (2, 3)
    assert s["eager_mixed_apart_ms"] == pytest.approx(285, abs=0.01)
    assert s["replayed_mixed_apart_ms"] == pytest.approx(110, abs=0.01)
    empty = P.step_summary("nothing")
    assert empty["prefill_batches"] == 0 and empty["eager_mixed_apart_ms"] is None


# Verbatim, from the same server's log at --decode-log-interval 1 (2026-12-06).
REAL_DECODE = (
    "[2026-12-06 18:54:22] Decode batch, #running-req: 1, #full token: 256, full token usage: "
    "0.00, #swa token: 256, swa token usage: 0.00, cuda graph: True, gen throughput (token/s): "
    "56.51, #queue-req: 0"
)


def decode(step_ms: float, running: int = 4) -> str:
    return REAL_DECODE.replace("#running-req: 1", f"#running-req: {running}").replace(
        "56.51", f"{running / step_ms * 1000:.4f}"
    )


def test_a_burst_is_its_prefill_phase_and_the_decode_tail_after_it():
    burst = [
        line(5000, running=0, queued=3),  # from idle: its gap is the idle time, left out
        line(300, queued=2),
        decode(40),  # between two prefill batches: inside the next one's gap
        line(320, queued=0),
        decode(99999),  # timed from the last decode line: spans the prefill phase, left out
        decode(50),
        decode(30, running=2),
    ]
    text = "\n".join([REAL_DECODE, *burst, *burst])  # a decode line before any burst: ignored
    first, second = P.bursts(text)
    assert len(first.prefills) == len(second.prefills) == 3
    assert first.prefill_tokens == 3 * 1024
    assert first.prefill_phase_s == pytest.approx(0.62, rel=1e-4)
    assert first.tail_s == pytest.approx(0.08, rel=1e-4)
    assert first.prefill_share == pytest.approx(0.62 / 0.70, rel=1e-4)
    # the decode line's gap is its running requests over its throughput
    (one,) = P.bursts("\n".join([line(1, running=0), REAL_DECODE]))
    assert one.tail_ms == pytest.approx([1 / 56.51 * 1000])
    # a prefill batch from idle while the tail has not begun stays in the same burst
    assert len(P.bursts("\n".join([line(1, running=0), line(1, running=0)]))) == 1
    assert P.bursts("nothing") == [] and P.Burst([], []).prefill_share is None
