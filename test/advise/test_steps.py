"""A rank's trace read into steps (advise/steps.py): the step spans' labels, each step's host
and GPU time, launches and graph launches, kernel classes, decode rows and contexts, the GPU's
idle time after a step, the plugin's frames; on the recorded traces, on a real torch CPU
profile, and on small traces built for one rule each."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from make_traces import SCENARIOS, TRACES

from sglang_mixgraph.advise.steps import StepLabel, read_steps
from sglang_mixgraph.core.kernel_classes import read_trace
from sglang_mixgraph.kits.profiler_trace import TraceBuilder


def rank_steps(scenario: str, rank: str):
    path = TRACES / scenario / f"{rank}.trace.json.gz"
    return read_steps(read_trace(str(path)), rank)


def test_the_recorded_traces_are_what_make_traces_builds():
    """The committed files hold exactly the generator's events (no hand edits, no drift)."""
    for scenario, ranks in SCENARIOS.items():
        for rank, build in ranks.items():
            path = TRACES / scenario / f"{rank}.trace.json.gz"
            with gzip.open(path, "rt") as f:
                assert json.load(f) == json.loads(json.dumps(build().document())), path
            assert path.stat().st_size < 8 * 1024


def test_eager_mixed_steps_host_time_gpu_time_and_classes():
    trace = rank_steps("dsv4_eager_h200", "TP-0-DP-0-EP-0")
    assert trace.gpu.name == "NVIDIA H200" and trace.gpu.arch == "sm90" and trace.with_stack
    modes = [(s.mode, s.replayed) for s in trace.steps]
    assert modes == [("EXTEND", False)] + [("MIXED", False)] * 3 + [("DECODE", True)] * 4
    mixed = trace.steps[1]
    assert mixed.host_ms == pytest.approx(212.0) and mixed.kernel_ms == pytest.approx(140.0)
    assert mixed.host_bound and mixed.launches == 6 and mixed.graph_launches == 0
    # by the frames that launched them: FlashMLA, the dequant inside attention, the indexer,
    # a GEMM inside attention (a projection), the MoE, a copy outside every class
    assert {k: v for k, v in mixed.class_ms.items() if v} == pytest.approx(
        {"attention": 30, "dequant": 12, "indexer": 8, "gemm": 50, "moe": 20, "elementwise": 20}
    )
    # the GPU ran its kernels over most of the host span: the wall is the host's
    assert 170 < mixed.gpu_span_ms < 212 and mixed.wall_ms == pytest.approx(212.0)


def test_replayed_decode_steps_count_one_launch_for_the_graphs_kernels():
    decode = rank_steps("dsv4_eager_h200", "TP-0-DP-0-EP-0").steps[4]
    assert decode.replayed and decode.launches == 1 and decode.graph_launches == 1
    assert decode.kernels == 4 and decode.kernel_ms == pytest.approx(20.0)
    assert not decode.host_bound
    # graph kernels carry only their names: FlashMLA's decode, a GEMM, the MoE, a copy
    assert {k: v for k, v in decode.class_ms.items() if v} == pytest.approx(
        {"attention": 6, "gemm": 8, "moe": 4, "elementwise": 2}
    )


def test_decode_rows_and_contexts_come_from_the_detailed_annotations():
    steps = rank_steps("dsv4_eager_h200", "TP-0-DP-0-EP-0").steps
    mixed, decode = steps[1].label, steps[4].label
    assert (mixed.decode_rows, mixed.prefill_requests, mixed.prefill_rows) == (24, 1, 2560)
    assert mixed.rows == 2584 and mixed.prefill_context == 4608
    assert mixed.decode_context == pytest.approx(2050)
    assert mixed.longest_context_at_least == 4608  # the one prefill request's, exact
    assert (decode.decode_rows, decode.rows, decode.longest_context_at_least) == (23, 23, 2060)
    extend = steps[0].label
    assert (extend.decode_rows, extend.prefill_rows, extend.rows) == (0, 2816, 2816)


@pytest.mark.parametrize(
    "name, mode, decode_rows, rows",
    [
        ("step[MIXED bs=12]", "MIXED", None, None),  # no detailed annotations: unknown
        ("step[EXTEND bs=2 toks=700]", "EXTEND", 0, 700),
        ("step[DECODE bs=7]", "DECODE", 7, 7),
        ("step[VERIFY bs=4 g_sq=16]", "VERIFY", None, None),
        ("step[IDLE bs=0]", "IDLE", None, None),
    ],
)
def test_labels_without_annotations_leave_what_they_do_not_say_unknown(
    name, mode, decode_rows, rows
):
    label = StepLabel.parse(name)
    assert (label.mode, label.decode_rows, label.rows) == (mode, decode_rows, rows)
    assert label.longest_context_at_least is None


@pytest.mark.parametrize("name", ["step[MIXED]", "stepping", "step[mixed bs=1]", "run_batch"])
def test_other_spans_are_not_steps(name):
    assert StepLabel.parse(name) is None


def test_the_gpu_idle_time_after_a_replayed_step_is_read():
    steps = rank_steps("dsv4_replay_h200", "TP-0").steps
    assert [s.graph_launches for s in steps] == [2] * 4
    assert [s.gpu_idle_after_ms for s in steps[:-1]] == pytest.approx([0.4] * 3)
    assert steps[-1].gpu_idle_after_ms is None  # nothing followed it
    assert steps[0].kernel_ms == pytest.approx(175.0) and steps[0].host_ms == pytest.approx(35.0)


@pytest.mark.parametrize("host_us, host_bound", [(1250, False), (1500, True)])
def test_a_replayed_steps_side_stream_kernels_count_once_in_its_gpu_time(host_us, host_bound):
    # a graph whose two branches overlap (DeepSeek-V4's side streams run only in a captured
    # graph): 1000 us and 600 us kernels sharing the GPU from 100 to 1100 us, then a break's
    # kernel from 1200 to 1500 us. Busy 1300 us; summed 1900 us; the class columns sum.
    b = TraceBuilder()
    b.annotation("step[MIXED bs=3 c=1 g=2 c_sq=10 c_sk=10 g_sq=2 g_sk=200]", 0, host_us)
    branches = [("nvjet_sm90_tst_256x128", 100, 1000), ("nvjet_sm90_tss_128x160", 400, 600)]
    b.launch(10, branches, call="cudaGraphLaunch")
    b.launch(1000, [("flash_mla_kernel", 1200, 300)])
    (step,) = read_steps(b.document(), "TP-0").steps
    assert step.kernels == 3 and step.kernel_ms == pytest.approx(1.3)
    assert sum(step.class_ms.values()) == pytest.approx(1.9)
    # a host of 1.5 ms is longer than the GPU's 1.3 ms of work, though shorter than the sum
    assert step.host_bound is host_bound


def test_work_launched_outside_a_step_and_the_plugins_frames():
    b = TraceBuilder()
    b.annotation("step[MIXED bs=3 c=1 g=2 c_sq=10 c_sk=10 g_sq=2 g_sk=200]", 0, 100)
    b.frame(
        "sglang_mixgraph/patches/mixed_split/forward.py(88): around_forward_prefill_sparse", 10, 5
    )
    b.launch(12, [("flash_mla_kernel", 20, 30)])
    b.launch(150, [("void at::native::copy_kernel", 200, 50)])  # the scheduler's, after the step
    (step,) = read_steps(b.document(), "TP-0").steps
    assert step.kernels == 1 and step.kernel_ms == pytest.approx(0.03)
    assert step.patches_seen == {"mixed_split"}


def test_a_trace_without_steps_gives_none():
    trace = rank_steps("idle_h200", "TP-0")
    assert trace.steps == [] and trace.gpu.arch == "sm90"


def test_a_real_torch_cpu_profile_reads_as_the_kit_writes_it(tmp_path):
    """The CPU half of the format, from torch itself: the document's keys, the step span's
    event and its args, a Python frame's; and the reader finds the step in it."""
    label = "step[MIXED bs=3 c=1 g=2 c_sq=8 c_sk=8 g_sq=2 g_sk=20 forward_id=7]"
    acts = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts, with_stack=True) as prof:
        with torch.profiler.record_function(label):
            torch.randn(16, 16) @ torch.randn(16, 16)
    path = tmp_path / "real.trace.json"
    prof.export_chrome_trace(str(path))
    real = json.loads(Path(path).read_text())
    (step,) = read_steps(real, "TP-0").steps
    assert step.label.fields["forward_id"] == 7 and step.host_ms > 0 and step.kernels == 0

    b = TraceBuilder()
    b.annotation(label, 0, 10)
    b.frame("x.py(1): f", 1, 2)
    kit = b.document()
    # (torch adds distributedInfo where torch.distributed runs, as in SGLang's schedulers)
    assert set(kit) == set(real) - {"distributedInfo"}

    def first(doc, cat):
        return next(e for e in doc["traceEvents"] if e.get("cat") == cat)

    for cat in ("user_annotation", "python_function"):
        assert set(first(kit, cat)) == set(first(real, cat)), cat
    real_args = set(first(real, "user_annotation")["args"])
    assert set(first(kit, "user_annotation")["args"]) == real_args - {"Ev Idx"}
