"""`sglang-mixgraph advise --trace-dir DIR` without `--url`: the traces SGLang's profiler wrote
earlier (`<profile_id>-TP-<rank>...trace.json.gz`), read without a server or a live profile;
the newest profile of a directory, the model known from `--model-path` only, one line and
exit 1 for a directory without traces."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from advise_standin import TRACES

from sglang_mixgraph.cli import main
from sglang_mixgraph.resolution.presets import DSV4_MODEL_DIR


def record(tmp_path, scenario: str, profile_id: str, mtime: float | None = None):
    """The scenario's traces named as SGLang names them, as its profiler left them."""
    for trace in sorted((TRACES / scenario).glob("*.trace.json.gz")):
        target = tmp_path / f"{profile_id}-{trace.name}"
        shutil.copyfile(trace, target)
        if mtime is not None:
            os.utime(target, (mtime, mtime))
    return tmp_path


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("sglang-mixgraph advise: ")
    return err


def test_recorded_traces_are_read_without_a_server(tmp_path, capsys):
    record(tmp_path, "dsv4_eager_h200", "1796525228.25")
    args = ["advise", "--trace-dir", str(tmp_path), "--model-path", str(DSV4_MODEL_DIR)]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    prof = report["profile"]
    assert prof["source"] == "recorded" and prof["profile_id"] == "1796525228.25"
    assert prof["ranks_read"] == prof["ranks_expected"] == 2 and prof["steps"] > 0
    assert prof["steps_requested"] is None and prof["load_log"] is None
    assert report["server"]["url"] is None and report["server"]["mixed_chunk"] is None
    assert report["server"]["architectures"] == ["DeepseekV4ForCausalLM"]
    assert report["gpu"] == {"name": "NVIDIA H200", "arch": "sm90"}
    verdicts = {v["id"]: v for v in report["verdicts"]}
    assert verdicts["mixed_split"]["outcome"] in ("pays", "may pay", "no gain")
    assert verdicts["prefill_graph"]["detail"]["eager_steps"] > 0
    assert "eager kernels unpadded (no bucket list known" in verdicts["prefill_graph"]["basis"]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "sglang-mixgraph advise: traces recorded earlier (no server asked: its settings unknown)"
    )


def test_without_the_models_config_every_verdict_is_unknown(tmp_path, capsys):
    record(tmp_path, "dsv4_replay_h200", "p1")
    assert main(["advise", "--trace-dir", str(tmp_path), "--json"]) == 0
    verdicts = json.loads(capsys.readouterr().out)["verdicts"]
    assert {v["outcome"] for v in verdicts} == {"unknown"}
    assert all("--model-path" in v["reason"] and v["low_ms"] is None for v in verdicts)


def test_the_newest_profile_of_a_directory_is_read(tmp_path, capsys):
    record(tmp_path, "dsv4_eager_h200", "old", mtime=1_000_000)
    record(tmp_path, "dsv4_replay_h200", "new", mtime=2_000_000)
    assert main(["advise", "--trace-dir", str(tmp_path), "--json"]) == 0
    prof = json.loads(capsys.readouterr().out)["profile"]
    assert prof["profile_id"] == "new" and prof["profiles_in_dir"] == 2
    assert prof["ranks_read"] == 1


def test_a_directory_without_traces_is_one_line(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("no trace here")
    assert main(["advise", "--trace-dir", str(tmp_path)]) == 1
    assert f"no SGLang trace in {tmp_path}" in one_line(capsys.readouterr().err)


def test_traces_without_a_step_are_one_line(tmp_path, capsys):
    record(tmp_path, "idle_h200", "idle")
    assert main(["advise", "--trace-dir", str(tmp_path)]) == 1
    assert "hold no forward step" in one_line(capsys.readouterr().err)


def test_an_unreadable_model_config_is_one_line(tmp_path, capsys):
    record(tmp_path, "dsv4_replay_h200", "p1")
    bad = tmp_path / "model"
    bad.mkdir()
    (bad / "config.json").write_text("[1, 2]")
    assert main(["advise", "--trace-dir", str(tmp_path), "--model-path", str(bad)]) == 1
    assert "is not a model config" in one_line(capsys.readouterr().err)


def real_shaped_rank(row: dict, steps: int = 10):
    """One rank of replayed MIXED steps shaped as the real H100 run's median MIXED step (host,
    kernel ms, GPU span, 140 launches of which 5 graph launches), with the GPU idle measured
    there (3.54 ms) before each next step."""
    from make_traces import FORWARD, MS, mixed_label

    from sglang_mixgraph.kits.profiler_trace import TraceBuilder

    b = TraceBuilder(gpu="H100", pid=8000, tid=8000)
    launches, graphs = int(row["launches"]), int(row["graph_launches"])
    small = 0.05  # ms of each eager kernel; the graph launches carry the rest
    big = (row["kernel_ms"] - small * (launches - graphs)) / graphs
    gap = (row["wall_ms"] - row["kernel_ms"]) / (launches - 1) * MS
    t = 1_000_000.0
    for i in range(steps):
        host = row["host_ms"] * MS
        b.frame(FORWARD, t, host)
        gpu = first = t + 0.5 * MS
        for k in range(launches):
            graph = k % (launches // graphs) == 0 and k // (launches // graphs) < graphs
            ms = big if graph else small
            at = t + (k + 0.5) * host / launches
            call = "cudaGraphLaunch" if graph else "cudaLaunchKernel"
            b.launch(at, [(f"kernel_{k}", gpu, ms * MS)], call=call)
            gpu += ms * MS + (gap if k < launches - 1 else 0)
        label = mixed_label(6, 1159, 1558, 0, 20 + i)
        b.annotation(label, t, host, gpu_span=(first, gpu))
        t = gpu + 3.5356 * MS - 0.5 * MS  # the next step's first kernel 3.54 ms after the last
    return b


def test_a_trace_shaped_as_the_real_h100_run_reads_as_advise_read_it_there(tmp_path, capsys):
    """The real run (docs/results/advise_real_h100, one H100, tiny DeepSeek-V4, breakable prefill graph):
    advise read its MIXED steps as host 14.07, kernels 23.41, wall 28.78 ms, 140 launches, 5
    graph launches; a trace of that shape, recorded earlier, reads the same without a server."""
    real = json.loads((Path(__file__).parent / "real_h100_tiny_dsv4.json").read_text())
    row = real["advise_mixed_row"]
    real_shaped_rank(row).write(tmp_path / "1796525228.75-TP-0.trace.json.gz")
    args = ["advise", "--trace-dir", str(tmp_path), "--model-path", str(DSV4_MODEL_DIR), "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gpu"] == {"name": "NVIDIA H100 80GB HBM3", "arch": "sm90"}
    (mixed,) = [r for r in report["steps"] if r["mode"] == "MIXED"]
    assert mixed["graph"] == "replay" and mixed["steps"] == 10
    for key in ("host_ms", "kernel_ms", "wall_ms", "launches", "graph_launches", "decode_rows"):
        assert mixed[key] == pytest.approx(row[key], abs=0.01), key
    verdicts = {v["id"]: v for v in report["verdicts"]}
    assert verdicts["prefill_graph"]["outcome"] == "already on"
    rd = verdicts["replay_read_done"]  # nine steps followed by another, 3.54 ms idle each
    assert rd["outcome"] == "may pay" and rd["low_ms"] == pytest.approx(-3.54, abs=0.01)


def test_the_servers_log_of_a_recorded_profile_prices_its_host(tmp_path, capsys):
    from advise_standin import batch_line

    record(tmp_path, "dsv4_eager_h200", "p7")
    log = tmp_path / "server.log"
    lines = [batch_line(150.0)] * 5 + [
        "[t] Profiling starts. Traces will be saved to: x (with profile id: p7)",
        *[batch_line(212.0)] * 5,
        "[t] Stop profiling...",
    ]
    log.write_text("\n".join(lines) + "\n")
    args = ["advise", "--trace-dir", str(tmp_path), "--model-path", str(DSV4_MODEL_DIR)]
    assert main([*args, "--server-log", str(log), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["profile"]["unprofiled"]["factor"] == pytest.approx(150 / 212, abs=1e-3)
    graph = {v["id"]: v for v in report["verdicts"]}["prefill_graph"]
    assert graph["wall_ms"] == pytest.approx(150.0, abs=0.5)
