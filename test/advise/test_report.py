"""advise's report (advise/report.py): the order and groups of the text, a change in words
(point, share, range, or a bound), unknowns left as such, and JSON that round-trips."""

from __future__ import annotations

import json

from advise_standin import recorded_server_info

from sglang_mixgraph.advise import verdicts as V
from sglang_mixgraph.advise.report import SCHEMA_VERSION, report_json, report_text
from sglang_mixgraph.advise.server import ServerFacts
from sglang_mixgraph.advise.steps import read_steps
from sglang_mixgraph.advise.summary import kind_rows
from sglang_mixgraph.kits.profiler_trace import TraceBuilder

DSV4 = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4"}
PROFILE = {"trace_dir": "/t", "steps": 1, "ranks_read": 1, "ranks_expected": 2, "with_stack": False}


def verdict(id_, outcome, **kw) -> V.Verdict:
    return V.Verdict(id_, id_, id_.replace("_", " "), outcome, f"why {id_}", **kw)


def render(verdicts):
    facts = ServerFacts.read("http://h:1", recorded_server_info(), DSV4)
    b = TraceBuilder()
    b.annotation("step[MIXED bs=12]", 0, 5000)  # no annotations: rows unknown
    b.launch(10, [("k", 100, 2000)])
    rows = kind_rows(read_steps(b.document(), "TP-0").steps, facts)
    report = report_json(facts, None, PROFILE, verdicts, rows)
    return report, report_text(report, verdicts, rows)


def test_what_pays_comes_first_then_each_group_with_its_reason():
    verdicts = [
        verdict("a", V.MAY_PAY, delta_ms=-1.0, low_ms=-3.0, high_ms=1.0, wall_ms=100.0),
        verdict("b", V.PAYS, delta_ms=-20.0, low_ms=-30.0, high_ms=-10.0, wall_ms=200.0),
        verdict("c", V.CANNOT_ACT),
        verdict("d", V.UNKNOWN),
        verdict("e", V.MAY_PAY, low_ms=-0.4, high_ms=0.0, flags=("X=1",)),
        verdict("f", V.NO_GAIN, delta_ms=2.0, low_ms=2.0, high_ms=2.0, wall_ms=50.0),
    ]
    report, text = render(verdicts)
    assert report["switch_on_first"] == ["b", "a", "e"]
    lines = text.splitlines()
    first = lines.index("Switch on first:")
    assert (
        lines[first + 1]
        == "  1. b: -20.0 ms per MIXED step (-10.0%), range -30.0 to -10.0 ms (pays)"
    )
    assert lines[first + 2] == "     why b"
    assert "  3. e: up to 0.40 ms less per step (may pay)" in lines
    assert "     set: X=1" in lines
    assert lines.index("Does not pay here:") < lines.index("Not priced (unknown):")
    assert "  - f (+2.0 ms per MIXED step (+4.0%)): why f" in lines
    assert "  - d: why d" in lines and "  - c: why c" in lines
    assert "Already on:" not in text  # empty groups are left out
    assert lines[1] == "DeepseekV4ForCausalLM on a GPU the traces do not name"
    assert "profiled 1 steps on 1 of 2 ranks; traces in /t" in text and "stacks" not in text


def test_nothing_to_switch_on_is_said_and_unknown_rows_stay_unknown():
    report, text = render([verdict("c", V.CANNOT_ACT)])
    assert "  nothing: no patch is predicted to shorten the MIXED step here" in text
    row = text.splitlines()[-2].split()  # the MIXED row, above the attention-DP note
    assert row[:4] == ["MIXED", "eager", "1", "5.0"] and row[6:8] == ["unknown", "unknown"]
    assert report["steps"][0]["decode_rows"] is None


def test_the_json_has_its_schema_version_and_round_trips():
    report, _ = render([verdict("b", V.PAYS, delta_ms=-1.0, low_ms=-2.0, high_ms=-0.5)])
    assert report["schema_version"] == SCHEMA_VERSION == 1
    assert json.loads(json.dumps(report)) == report
    assert report["gpu"] is None and report["verdicts"][0]["flags"] == []
    assert report["server"]["prefill_graph"]["backend"] == "disabled"
