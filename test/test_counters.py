"""Activity counters: counting, the snapshot, the log line and its interval flag, fallbacks."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

from sglang_mixgraph import counters, fallback
from sglang_mixgraph.flags import FLAGS, FlagValueError

INTERVAL = "SGLANG_MIXGRAPH_COUNTERS_LOG_INTERVAL"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    # No periodic thread unless a test asks for one; every test starts from zero.
    monkeypatch.setenv(INTERVAL, "0")
    counters.stop_reporter()
    counters.reset()
    fallback._said.clear()
    yield
    counters.stop_reporter()
    counters.reset()
    fallback._said.clear()


def test_counts_add_up_per_patch_and_event():
    counters.count("p", "steps")
    counters.count("p", "steps")
    counters.count("p", "rows", 7)
    counters.count("q", "steps")
    counters.count_fallback("p", "why")
    snap = counters.snapshot()
    assert snap["events"] == {"p": {"rows": 7, "steps": 2}, "q": {"steps": 1}}
    assert snap["fallbacks"] == {"p": {"why": 1}}
    assert counters.get("p", "steps") == 2 and counters.get("p", "never") == 0
    counters.reset()
    assert counters.snapshot()["events"] == {} and counters.get_fallback("p", "why") == 0


def test_fallback_counts_every_time_and_logs_once(caplog):
    with caplog.at_level(logging.INFO, logger="sglang_mixgraph"):
        results = [fallback.fallback_once("p", "a long reason", key="short") for _ in range(3)]
        fallback.fallback_once("p", "other reason")
    assert results == [True, False, False]
    assert counters.snapshot()["fallbacks"] == {"p": {"other reason": 1, "short": 3}}
    said = [r.message for r in caplog.records if "falls back" in r.message]
    assert said == [
        "sglang-mixgraph: p falls back to upstream: a long reason",
        "sglang-mixgraph: p falls back to upstream: other reason",
    ]


def test_log_line_round_trips_through_any_log_prefix():
    counters.count("mixed_split", "steps_split", 3)
    counters.count_fallback("mixed_split", "bcg")
    line = "[2026-11-30 10:00:00 TP0] " + counters.format_line()
    parsed = counters.parse_line(line)
    assert parsed == counters.snapshot()
    assert parsed["events"]["mixed_split"]["steps_split"] == 3
    assert counters.parse_line("some other line") is None
    assert counters.parse_line(counters.LOG_PREFIX + "{not json") is None


@pytest.mark.parametrize(
    "value", ["abc", "-1", "nan", "inf", "1s", "1e10", "86400.5", "1e-9", "0.09", "-0.5"]
)
def test_interval_flag_is_strict(value, monkeypatch):
    monkeypatch.setenv(INTERVAL, value)
    with pytest.raises(
        FlagValueError, match=f"{INTERVAL}=.*<seconds>, 0, or a number from 0.1 to 86400"
    ):
        counters.INTERVAL_FLAG.get()


def test_interval_below_the_floor_is_one_line_at_startup(monkeypatch):
    """1e-9 s used to be accepted and the reporter thread then spun (a quarter of a core in each
    SGLang process); now startup stops on it in one line, and 0 and the floor still pass."""
    from sglang_mixgraph import plugin

    for ok in ("0", "0.1", "0.5"):
        monkeypatch.setenv(INTERVAL, ok)
        assert counters.INTERVAL_FLAG.get() == float(ok)
    monkeypatch.setenv(INTERVAL, "1e-9")
    with pytest.raises(SystemExit) as stopped:
        plugin.register()
    assert str(stopped.value).splitlines()[1] == (
        f"{INTERVAL}='1e-9' is not a valid value; accepted values: <seconds>, 0, or a number "
        "from 0.1 to 86400 (one day) (unset means 60)"
    )


def test_interval_above_one_day_stops_startup_and_fails_doctor(monkeypatch, doctor_here):
    """1e10 s used to pass the flag and `doctor`, then the reporter thread died in
    threading.Event.wait with OverflowError; now it is refused where every bad value is."""
    from sglang_mixgraph import plugin

    monkeypatch.setenv(INTERVAL, "86400")
    assert counters.INTERVAL_FLAG.get() == 86400  # one day is the largest value accepted
    monkeypatch.setenv(INTERVAL, "1e10")
    with pytest.raises(SystemExit, match=f"{INTERVAL}='1e10' is not a valid value"):
        plugin.register()
    # doctor reads the flags when it runs: in this process, as `cli.main` (test/conftest.py)
    code, out = doctor_here(env={INTERVAL: "1e10"})
    assert code == 1, out.out[-2000:]
    assert f"{INTERVAL} = ERROR: {INTERVAL}='1e10' is not a valid value" in out.out


def test_interval_flag_values_and_registration(monkeypatch):
    assert FLAGS[INTERVAL] is counters.INTERVAL_FLAG
    monkeypatch.delenv(INTERVAL)
    assert counters.INTERVAL_FLAG.get() == 60
    monkeypatch.setenv(INTERVAL, " 0.5 ")
    assert counters.INTERVAL_FLAG.get() == 0.5


def test_bad_interval_stops_startup(monkeypatch):
    from sglang_mixgraph import plugin

    monkeypatch.setenv(INTERVAL, "often")
    with pytest.raises(SystemExit, match=INTERVAL):
        plugin.register()


def test_reporter_logs_changes_at_the_interval_only(monkeypatch, caplog):
    monkeypatch.setenv(INTERVAL, "0.1")
    with caplog.at_level(logging.INFO, logger="sglang_mixgraph.counters"):
        counters.count("p", "steps")  # the first count starts the reporter
        deadline = time.monotonic() + 5
        while not _lines(caplog) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [line["events"] for line in _lines(caplog)] == [{"p": {"steps": 1}}]
        time.sleep(0.35)  # nothing changed: no new line
        assert len(_lines(caplog)) == 1
        counters.count("p", "steps")
        deadline = time.monotonic() + 5
        while len(_lines(caplog)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert _lines(caplog)[-1]["events"] == {"p": {"steps": 2}}


def _lines(caplog):
    return [
        counters.parse_line(r.getMessage())
        for r in caplog.records
        if counters.parse_line(r.getMessage())
    ]


def _clean_env(**extra):
    # A fresh interpreter as a user would start it: none of the SGLANG_* settings the test
    # session made (conftest describes a GPU to SGLang for this process only).
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env.update(extra)
    return env


def test_a_process_logs_its_totals_at_exit():
    code = (
        "import logging; logging.basicConfig(level=logging.INFO, format='%(name)s %(message)s')\n"
        "from sglang_mixgraph import counters\n"
        "counters.count('p', 'steps', 2); counters.count_fallback('p', 'why')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=_clean_env(**{INTERVAL: "0"}),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [
        counters.parse_line(line) for line in proc.stderr.splitlines() if counters.parse_line(line)
    ]
    assert len(lines) == 1
    assert lines[0]["events"] == {"p": {"steps": 2}} and lines[0]["fallbacks"] == {"p": {"why": 1}}
    assert "sglang_mixgraph.counters " + counters.LOG_PREFIX in proc.stderr


def test_a_process_that_counted_nothing_logs_nothing():
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import logging; logging.basicConfig(level=logging.INFO)\n"
            "from sglang_mixgraph import counters",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=_clean_env(),
    )
    assert proc.returncode == 0 and counters.LOG_PREFIX not in proc.stderr
