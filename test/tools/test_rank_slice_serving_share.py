"""The served burst's prefill share and the step-to-serving prediction, on logs written in
SGLang's line formats (tools/rank-slice/serving_share.py)."""

from __future__ import annotations

import json
import sys

import pytest
from tool_scripts import load

S = load("serving_share")

# One decode line verbatim from an H100 server's log (2026-12-06, the FP8 slice).
DECODE = (
    "[2026-12-06 18:54:22] Decode batch, #running-req: 1, #full token: 256, full token usage: "
    "0.00, #swa token: 256, swa token usage: 0.00, cuda graph: True, gen throughput (token/s): "
    "56.51, #queue-req: 0"
)


def prefill(gap_ms: float, running: int, queued: int, graph: bool, tokens: int = 1000) -> str:
    return (
        f"[t] Prefill batch, #new-seq: 1, #new-token: {tokens}, #cached-token: 0, full token "
        f"usage: 0.10, #running-req: {running}, #queue-req: {queued}, #pending-token: 0, cuda "
        f"graph: {graph}, input throughput (token/s): {tokens / gap_ms * 1000:.4f}"
    )


def decode(step_ms: float, running: int = 4) -> str:
    return DECODE.replace("#running-req: 1", f"#running-req: {running}").replace(
        "56.51", f"{running / step_ms * 1000:.4f}"
    )


def burst(step_ms: float, graph: bool, n: int = 10, tail_ms: float = 50.0, tail: int = 5):
    lines = [prefill(9999, 0, n, graph)]  # from idle: its gap is the idle time, left out
    lines += [prefill(step_ms, 4, n - i, graph) for i in range(1, n)]
    lines += [decode(123456)]  # its gap spans the prefill phase: left out
    lines += [decode(tail_ms) for _ in range(tail)]
    return lines


def test_the_last_load_burst_of_a_log_is_the_visit(tmp_path):
    log = tmp_path / "upstream_1.log"
    log.write_text("\n".join([*burst(500.0, False), *burst(100.0, False)]))
    v = S.visit(log, replayed=False, min_tokens=5000)
    assert v["step_ms"] == pytest.approx(100.0, rel=1e-4)
    assert v["prefill_s"] == pytest.approx(0.9, rel=1e-4)  # 9 gaps of 100 ms
    assert v["tail_s"] == pytest.approx(0.25, rel=1e-4)
    assert v["share"] == pytest.approx(0.9 / 1.15, rel=1e-4)
    with pytest.raises(SystemExit, match="no burst of 20000"):
        S.visit(log, replayed=False, min_tokens=20000)


def test_the_prediction_is_share_times_step_change(tmp_path, capsys, monkeypatch):
    (tmp_path / "servers").mkdir()
    cells = []
    for arm, repeat, step, graph, tok_s in (
        ("upstream", 0, 200.0, False, 100.0),
        ("lean", 1, 100.0, True, 180.0),
    ):
        (tmp_path / "servers" / f"{arm}_{repeat + 1}.log").write_text("\n".join(burst(step, graph)))
        cells.append(
            {
                "kind": "bench",
                "arm": arm,
                "repeat": repeat,
                "block": 0,
                "status": "ok",
                "metrics": {"output_throughput": tok_s},
            }
        )
        # ab's greedy token check after the load cell: same visit, no timing
        cells.append({"kind": "tokens", "arm": arm, "repeat": repeat, "block": 0, "status": "ok"})
    (tmp_path / "results.json").write_text(json.dumps({"cells": cells}))
    monkeypatch.setattr(
        sys, "argv", ["serving_share.py", str(tmp_path), "--arm", "lean", "--min-tokens", "5000"]
    )
    assert S.main() == 0
    out = capsys.readouterr().out
    share = 1.8 / 2.05  # 9 gaps of 200 ms against a 0.25 s tail
    assert f"share {share:.3f}" in out
    # step -50.0% x share = predicted; measured 100 / 180 - 1
    assert f"step -50.0% x share {share:.3f} = {-0.5 * share:+.1%}" in out
    assert f"measured {100 / 180 - 1:+.1%}" in out
