"""The replay attribution command on a probe's traces.tar, without a GPU
(tools/rank-slice/step_attribution.py; the pairing itself: test/core/test_step_attribution.py)."""

from __future__ import annotations

import io
import json
import lzma
import tarfile

from tool_scripts import load

from sglang_mixgraph.kits.profiler_trace import TraceBuilder

S = load("step_attribution")
GEMM = "nvjet_sm90_tst_256x160_64x4_1x2_h_bz_coopA_TNT"


def traces_tar(tmp_path):
    eager = TraceBuilder(gpu="H100")
    eager.launch(0, [(GEMM, 100, 1000)])
    replay = TraceBuilder(gpu="H100")
    replay.launch(0, [(GEMM, 100, 1100)], call="cudaGraphLaunch")
    replay.launch(
        5, [("Memcpy DtoD (Device -> Device)", 1300, 240)], "cudaMemcpyAsync", nbytes=10**9
    )
    path = tmp_path / "traces.tar"
    with tarfile.open(path, "w") as tar:
        for arm, b in (("upstream", eager), ("bcg-auto#2", replay)):
            data = lzma.compress(json.dumps(b.document()).encode())
            info = tarfile.TarInfo(f"{arm}/trace_4242_185.json.xz")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_prints_the_difference_and_its_parts(tmp_path, capsys, monkeypatch):
    out = tmp_path / "a.json"
    argv = ["x", str(traces_tar(tmp_path)), "--replay", "bcg-auto#2", "--json", str(out)]
    monkeypatch.setattr("sys.argv", argv)
    assert S.main() == 0
    text = capsys.readouterr().out
    assert "kernels: eager 1.0 ms, replayed 1.3 ms, difference +0.3 ms" in text
    assert "-> x1       0.240 1.00 GB {'after': 1}  [elementwise] Memcpy DtoD" in text
    assert "GPU busy (overlapping ops counted once): eager 1.0 ms, replayed 1.3 ms" in text
    assert (
        "GPU idle inside the step: eager 0.0 ms, replayed 0.1 ms (waiting for: after 0.1)" in text
    )
    assert json.loads(out.read_text())["by_class"]["gemm"]["delta_ms"] == 0.1


def test_a_missing_arm_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["x", str(traces_tar(tmp_path)), "--replay", "bcg-auto"])
    try:
        S.main()
    except SystemExit as e:
        assert str(e) == "step_attribution: 0 traces of step 185 for arm 'bcg-auto'"
    else:
        raise AssertionError("no refusal")
