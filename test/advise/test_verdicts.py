"""The verdicts (advise/verdicts.py) on the recorded traces: what pays and by how much, the
reason, the flags; what cannot act (model, backend, speculative mode, no such step) and why;
what is not priced (no calibration for the GPU, no model config) instead of a guess."""

from __future__ import annotations

import dataclasses
import statistics

import pytest
from advise_standin import recorded_server_info
from make_traces import TRACES

from sglang_mixgraph.advise import evidence as ev
from sglang_mixgraph.advise import verdicts as V
from sglang_mixgraph.advise.server import PhaseGraph, ServerFacts
from sglang_mixgraph.advise.split_pricing import read_model_layers
from sglang_mixgraph.advise.steps import Gpu, read_steps
from sglang_mixgraph.core.kernel_classes import read_trace
from sglang_mixgraph.resolution.presets import DSV4_MODEL_DIR

DSV4 = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4"}
H200, B200 = Gpu("NVIDIA H200", 9, 0), Gpu("NVIDIA B200", 10, 0)
PRO = read_model_layers(str(DSV4_MODEL_DIR))
REPLAYED = PhaseGraph("breakable", (256, 512, 1024, 2048, 2560, 2816))


def inputs(scenario, model_info=DSV4, gpu=H200, model=PRO, **changes) -> V.Inputs:
    facts = ServerFacts.read("http://x", recorded_server_info(), model_info)
    facts = dataclasses.replace(facts, **changes)
    paths = sorted((TRACES / scenario).glob("*.trace.json.gz"))
    steps = [s for p in paths for s in read_steps(read_trace(str(p)), p.name).steps]
    return V.Inputs(facts, gpu, steps, model, None if model else "no config.json here")


def by_id(x: V.Inputs) -> dict[str, V.Verdict]:
    return {v.id: v for v in V.all_verdicts(x)}


def test_host_bound_eager_mixed_steps_switch_the_breakable_prefill_graph_on_first():
    x = inputs("dsv4_eager_h200")
    v = by_id(x)
    graph = v["prefill_graph"]
    assert graph.outcome == V.PAYS and graph.patch == "graph_config"
    assert graph.reason == (
        "host-bound: 212 ms of launch over 140 ms of kernels; a replayed step launches about 42 ms"
    )
    # eager wall 212 ms; replay GPU 140 ms padded 2584 -> 2592 rows, the band bucket `auto`
    # derives for this server (2816 where the band does not fit: the high end), times the
    # replay's GPU factor 1.00-1.25 of the H200 slice (the capture width; the middle at 1.00, the
    # width advised); replay host 30.6-54 ms: the replayed step is GPU-bound
    assert graph.low_ms == pytest.approx(140 * 2592 / 2584 - 212, abs=0.05)
    assert graph.high_ms == pytest.approx(140 * 2816 / 2584 * 963 / 773 - 212, abs=0.05)
    assert graph.delta_ms == pytest.approx(140 * 2592 / 2584 - 212, abs=0.05)
    assert graph.wall_ms == 212.0 and graph.low_ms <= graph.delta_ms < graph.high_ms < 0
    assert (
        "padded to the 17 prefill buckets auto derives for this server (up to 2816), the high "
        "end to the 10 left where the 7 mixed-band buckets' capture does not fit" in graph.basis
    )
    assert graph.flags[0] == "SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto"
    # the capture width cut to the longest context seen (4608: page aligned already)
    assert graph.flags[1:] == ("--cuda-graph-prefill-max-context 4608",)
    assert ev.DSV4_REPLAY_GPU_FACTOR.source.split(" ")[0] in graph.basis
    assert [w.id for w in V.switch_on_order(list(v.values()))] == ["prefill_graph"]


def test_the_split_keeps_small_eager_steps_unsplit_and_says_what_it_costs():
    v = by_id(inputs("dsv4_eager_h200"))
    split = v["mixed_split"]
    assert split.outcome == V.NO_GAIN and split.detail["steps_split"] == 0
    assert split.flags == ("SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN=1",)  # priced: how to switch it
    assert split.reason.startswith("adaptive keeps all 6 MIXED steps unsplit")
    assert "24 decode rows at ~2051 tokens" in split.reason
    assert split.detail["regimes"] == ["eager"] and split.high_ms > 0
    assert split.detail["calibration"]["file"].endswith("split_cost_sm90.json")
    assert split.detail["attention_ms_measured"] == pytest.approx(42.0)
    tail = v["split_tail_graphs"]
    assert tail.outcome == V.CANNOT_ACT and "splits none" in tail.reason and not tail.flags
    rd = v["replay_read_done"]
    assert rd.outcome == V.CANNOT_ACT and "prefill graph disabled" in rd.reason


def test_replayed_gpu_bound_steps_with_many_long_decode_rows_switch_the_split_on():
    v = by_id(inputs("dsv4_replay_h200", prefill_graph=REPLAYED))
    split = v["mixed_split"]
    assert split.outcome == V.PAYS and split.flags == ("SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN=1",)
    assert split.detail == split.detail | {"steps_priced": 4, "steps_split": 4}
    assert split.detail["regimes"] == ["replay"] and split.high_ms < 0
    assert "256 decode rows at ~32768 tokens" in split.reason
    assert "calibration may not fit" not in split.reason  # 90 ms measured, the model ~94
    assert v["prefill_graph"].outcome == V.ALREADY_ON
    # the tails add GPU time per split layer on GPU-bound steps: 61 x 0.022-0.073 ms
    tail = v["split_tail_graphs"]
    assert tail.outcome == V.NO_GAIN
    assert (tail.low_ms, tail.high_ms) == pytest.approx((61 * 0.022, 61 * 0.073))
    # the model's own error on a replay (4.4% of the unsplit attention) either way: identical
    # steps add no spread of their own
    width = 2 * ev.SPLIT_MODEL_CHANGE_ERROR["replay"] * split.detail["attention_ms_modelled"]
    assert split.high_ms - split.low_ms == pytest.approx(width)
    assert split.low_ms < split.delta_ms < split.high_ms
    # four replays, three followed by a step: too few GPU idle times for read-done
    rd = v["replay_read_done"]
    assert rd.outcome == V.UNKNOWN and rd.reason.startswith("only 3 replayed steps followed")
    assert [w.id for w in V.switch_on_order(list(v.values()))] == ["mixed_split"]


def test_read_done_is_bounded_by_the_gpus_idle_time_after_replays():
    x = inputs("dsv4_replay_h200", prefill_graph=REPLAYED)
    x = dataclasses.replace(x, steps=x.steps * 2)  # six replays followed by a step
    rd = by_id(x)["replay_read_done"]
    assert rd.outcome == V.MAY_PAY and rd.low_ms == pytest.approx(-0.4) and rd.high_ms == 0
    assert rd.delta_ms is None  # a bound, not a prediction


def test_a_model_far_from_the_profile_is_said_to_be_off():
    x = inputs("dsv4_replay_h200", prefill_graph=REPLAYED)
    for s in x.steps:
        s.class_ms["attention"], s.class_ms["dequant"] = 10.0, 5.0
    split = by_id(x)["mixed_split"]
    assert "the profile shows 15.0 ms" in split.reason
    assert "calibration may not fit" in split.reason


def test_a_gpu_without_calibration_is_said_so_and_not_priced():
    v = by_id(inputs("dsv4_eager_h200", gpu=B200))
    split = v["mixed_split"]
    assert split.outcome == V.UNKNOWN and split.low_ms is None and split.delta_ms is None
    assert "no calibration of the split's cost model for sm100 (NVIDIA B200)" in split.reason
    assert split.detail["calibration"]["arch"].startswith("sm100 (fallback")
    assert v["split_tail_graphs"].outcome == V.UNKNOWN
    assert v["prefill_graph"].outcome == V.PAYS  # measured here, not the split's model


def test_a_trace_that_names_no_gpu_and_a_missing_model_config_are_not_guessed():
    assert by_id(inputs("dsv4_eager_h200", gpu=None))["mixed_split"].outcome == V.UNKNOWN
    split = by_id(inputs("dsv4_eager_h200", model=None))["mixed_split"]
    assert split.outcome == V.UNKNOWN and split.reason == "no config.json here"


def test_glm5_gets_the_graph_verdict_only_and_no_borrowed_deepseek_figures():
    glm5 = {"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa"}
    v = by_id(inputs("dsv4_eager_h200", model_info=glm5, model=None))
    for key in ("mixed_split", "replay_read_done"):
        assert v[key].outcome == V.CANNOT_ACT and "not a DeepSeek-V4 model" in v[key].reason
    assert v["split_tail_graphs"].outcome == V.CANNOT_ACT
    # host-bound, but no replayed MIXED step here and no GLM-5 replay measured anywhere
    graph = v["prefill_graph"]
    assert graph.outcome == V.UNKNOWN and graph.low_ms is None
    assert graph.reason.startswith("host-bound (212 ms of launch over 140 ms of kernels)")


def test_another_model_gets_no_verdict_that_acts():
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    v = by_id(inputs("dsv4_eager_h200", model_info=llama, model=None))
    assert {w.outcome for w in v.values()} == {V.CANNOT_ACT}
    assert "not a DeepSeek-V4 or GLM-5 model (LlamaForCausalLM)" in v["prefill_graph"].reason


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"dsv4_attn_backend": "trtllm"}, "trtllm attention backend"),
        ({"dsv4_attn_backend": "flashmla_mega"}, "mega attention backend"),
        ({"speculative_algorithm": "NGRAM"}, "speculative decoding outside a mixed step"),
        ({"speculative_algorithm": "EAGLE3"}, "SGLang refuses EAGLE3 for DeepSeek-V4"),
        ({"context_parallel": True}, "context parallelism"),
        ({"hisparse": True}, "hisparse"),
    ],
)
def test_deployments_whose_every_step_falls_back_are_named(changes, words):
    split = by_id(inputs("dsv4_eager_h200", **changes))["mixed_split"]
    assert split.outcome == V.CANNOT_ACT and words in split.reason
    assert split.reason.startswith("every step falls back to upstream")


@pytest.mark.parametrize("algorithm", ["EAGLE", "NEXTN"])
def test_eager_mixed_steps_of_eagle_are_priced_as_splittable(algorithm):
    """The split takes an eager MIXED step of EAGLE/NEXTN (upstream's runner relabels it
    EXTEND; test_mixed_split_speculative runs it), so advise prices it like any other."""
    plain = by_id(inputs("dsv4_eager_h200"))["mixed_split"]
    split = by_id(inputs("dsv4_eager_h200", speculative_algorithm=algorithm))["mixed_split"]
    assert split.outcome == plain.outcome == V.NO_GAIN
    assert split.detail["regimes"] == ["eager"] and split.delta_ms == plain.delta_ms


def test_without_mixed_steps_nothing_acts_on_them_and_the_reason_says_why():
    x = inputs("dsv4_eager_h200", mixed_chunk=False)
    x = dataclasses.replace(x, steps=[s for s in x.steps if s.mode != "MIXED"])
    v = by_id(x)
    for key in ("mixed_split", "prefill_graph"):
        assert v[key].outcome == V.CANNOT_ACT and "mixed chunked prefill is off" in v[key].reason
    x = dataclasses.replace(inputs("dsv4_eager_h200"), steps=x.steps)
    assert "no MIXED step among the 10 profiled steps" in by_id(x)["mixed_split"].reason


def test_patches_already_running_are_seen_in_the_steps_frames():
    x = inputs("dsv4_replay_h200", prefill_graph=REPLAYED)
    for s in x.steps:
        s.patches_seen |= {"mixed_split", "replay_read_done"}
    v = by_id(x)
    assert v["mixed_split"].outcome == V.ALREADY_ON and not v["mixed_split"].flags
    assert v["replay_read_done"].outcome == V.ALREADY_ON
    assert v["split_tail_graphs"].outcome == V.UNKNOWN


def test_cuda_graphs_off_leave_the_graph_verdict_nothing_to_do():
    graph = by_id(inputs("dsv4_eager_h200", disable_cuda_graph=True))["prefill_graph"]
    assert graph.outcome == V.CANNOT_ACT and "--disable-cuda-graph" in graph.reason


def test_gpu_bound_eager_steps_gain_nothing_from_a_replay():
    x = inputs("dsv4_eager_h200")
    for s in x.steps:  # launched in 100 ms, their 140 ms of kernels back to back
        s.host_ms, s.gpu_end_us = 100.0, s.gpu_start_us + s.kernel_ms * 1e3
    graph = by_id(x)["prefill_graph"]
    assert graph.outcome == V.NO_GAIN and graph.reason.startswith("GPU-bound: 140 ms of kernels")
    assert graph.low_ms > 0  # padded GPU work, and nothing to hide it


def test_a_replayed_steps_host_measured_here_prices_the_eager_ones():
    """Some MIXED steps replayed and some ran eagerly: the replays' own host time (35 ms) is the
    replayed host, for GLM-5 too (no figure borrowed), with padding as the only GPU change."""
    glm5 = {"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa"}
    eager = inputs("dsv4_eager_h200", model_info=glm5, model=None, prefill_graph=REPLAYED)
    replayed = inputs("dsv4_replay_h200")
    x = dataclasses.replace(eager, steps=eager.steps + replayed.steps)
    graph = by_id(x)["prefill_graph"]
    assert graph.outcome == V.PAYS and graph.flags == ("SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto",)
    assert graph.reason == (
        "host-bound: 212 ms of launch over 140 ms of kernels; a replayed step launches about "
        "35 ms; 6 of 10 MIXED steps ran eagerly"
    )
    assert "measured here over 4 replayed MIXED steps" in graph.basis
    # 2584 rows pad to 2816 in this bucket list; no capture-width factor for GLM-5
    assert graph.low_ms == graph.high_ms == pytest.approx(140 * 2816 / 2584 - 212, abs=0.05)


def test_on_host_bound_split_steps_the_tail_graphs_save_their_host_time():
    x = inputs("dsv4_replay_h200", prefill_graph=REPLAYED)
    for s in x.steps:
        s.host_ms = 300.0  # the replays' launch now outlasts their 175 ms of kernels
    tail = by_id(x)["split_tail_graphs"]
    saved = 61 * (ev.SPLIT_HOST_PER_LAYER_MS.high - ev.TAIL_GRAPHS_HOST_PER_LAYER_MS.high)
    assert tail.outcome == V.PAYS and tail.low_ms == tail.high_ms == pytest.approx(-saved)
    assert tail.reason.startswith("the split steps are host-bound: the graphs save 1.8 ms")
    assert tail.flags == (
        "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN=1",
        "SGLANG_MIXGRAPH_SPLIT_TAIL_GRAPHS=1",
    )


def test_a_speculative_algorithm_only_the_servers_plugins_know_is_not_split():
    split = by_id(inputs("dsv4_eager_h200", speculative_algorithm="MYSPEC"))["mixed_split"]
    assert split.outcome == V.CANNOT_ACT and "speculative decoding outside" in split.reason


def _quantile(values, q):
    return statistics.quantiles(values, n=10, method="inclusive")[0 if q == 0.1 else -1]


def test_the_range_is_the_spread_of_the_profiled_steps():
    x = inputs("dsv4_eager_h200")
    mixed = [s for s in x.steps if s.mode == "MIXED"]
    for i, s in enumerate(mixed):  # host-bound steps of 200 to 300 ms
        s.host_ms = 200.0 + 20.0 * i
    graph = by_id(x)["prefill_graph"]
    # each step: its padded GPU work (above the replay's 30.6-54 ms of host) times the capture
    # width's 1.00-1.25, less its own wall
    gpu, gpu_hi = 140 * 2592 / 2584, 140 * 2816 / 2584  # auto's buckets, with the band and without
    lows = [gpu - s.wall_ms for s in mixed]
    highs = [gpu_hi * ev.DSV4_REPLAY_GPU_FACTOR.high - s.wall_ms for s in mixed]
    assert graph.low_ms == pytest.approx(_quantile(lows, 0.1))
    assert graph.high_ms == pytest.approx(_quantile(highs, 0.9))
    # wider than one step's own range (the capture width's factor alone)
    assert graph.high_ms - graph.low_ms > gpu * (ev.DSV4_REPLAY_GPU_FACTOR.high - 1)
    assert "10th percentile of the steps' lows to 90th of their highs" in graph.basis


def test_steps_that_straddle_zero_may_pay_rather_than_pay():
    x = inputs("dsv4_eager_h200")
    mixed = [s for s in x.steps if s.mode == "MIXED"]
    for s in mixed[:2]:  # two steps barely host-bound: a replay's padded GPU work is longer
        s.host_ms = 145.0
        s.gpu_end_us = s.gpu_start_us + 145.0e3
    graph = by_id(x)["prefill_graph"]
    assert graph.outcome == V.MAY_PAY and graph.low_ms < 0 < graph.high_ms


def test_too_few_mixed_steps_are_unknown_not_a_number():
    x = inputs("dsv4_eager_h200")
    mixed = [s for s in x.steps if s.mode == "MIXED"][:3]
    x = dataclasses.replace(x, steps=[s for s in x.steps if s.mode != "MIXED"] + mixed)
    v = by_id(x)
    for vid, words in (("mixed_split", "priced MIXED steps"), ("prefill_graph", "eager MIXED")):
        assert v[vid].outcome == V.UNKNOWN, vid
        assert v[vid].reason.startswith(f"only 3 {words}") and "--steps" in v[vid].reason
        assert v[vid].low_ms is None and v[vid].delta_ms is None and not v[vid].flags


@pytest.mark.parametrize(
    "regime, results, key",
    [
        ("replay", "mixed_split_inserver_fit_h200.json", "_layer_ms"),
        ("eager", "mixed_split_inserver_h200.json", "_layer_wall_ms"),
    ],
)
def test_the_models_own_error_is_what_its_calibration_points_show(regime, results, key):
    """The error the split's ranges carry, recomputed: the sm90 calibration's change of a layer
    call against the measured change, over the measured unsplit time, 90th percentile."""
    import json
    from pathlib import Path

    from sglang_mixgraph.core import split_cost_model as scm

    root = Path(__file__).resolve().parents[2] / "docs" / "results"
    coeffs = scm.load_coefficients("sm90")
    ratio = {"csa_c4_top1024": 4, "hca_c128": 128}
    errors = []
    for p in json.loads((root / results).read_text())["points"]:
        shape = scm.StepShape.uniform(
            ratio[p["layer"]], p["context"], p["decode_rows"], p["prefill_rows"]
        )
        pair = (
            scm.predict(shape, coeffs) if regime == "replay" else scm.predict_eager(shape, coeffs)
        )
        measured = p["always" + key] - p["off" + key]
        errors.append(abs((pair[1] - pair[0]) - measured) / p["off" + key])
    p90 = sorted(errors)[int(0.9 * len(errors))]
    assert ev.SPLIT_MODEL_CHANGE_ERROR[regime] == pytest.approx(p90, abs=0.0005)


def test_the_servers_log_prices_the_eager_host_unprofiled():
    """The profiler stretched the eager host: scaled by the log's factor (unprofiled over
    profiled gaps) the step's wall, and so the gain, shrink; never below its kernels."""
    from sglang_mixgraph.advise.server_log import HostScale

    plain = by_id(inputs("dsv4_eager_h200"))["prefill_graph"]
    scale = HostScale(159.0, 212.0, 16, 15)  # x0.75: 212 ms profiled is 159 unprofiled
    graph = by_id(dataclasses.replace(inputs("dsv4_eager_h200"), host_scale=scale))["prefill_graph"]
    assert graph.wall_ms == pytest.approx(159.0) and graph.detail["host_factor"] == 0.75
    assert graph.reason.startswith("host-bound: 159 ms of launch over 140 ms of kernels")
    # the replayed step's price is unchanged; the eager wall it is against is 53 ms less
    assert graph.low_ms == pytest.approx(plain.low_ms + 53.0, abs=0.05)
    assert graph.delta_ms == pytest.approx(plain.delta_ms + 53.0, abs=0.05)
    assert "scaled by 0.75 to its unprofiled host" in graph.basis
    assert "under the profiler" in plain.basis and "--server-log" in plain.basis
    # a factor that would put the wall under the kernels leaves the step at its kernels
    low = dataclasses.replace(inputs("dsv4_eager_h200"), host_scale=HostScale(50.0, 212.0, 16, 15))
    graph = by_id(low)["prefill_graph"]
    assert graph.wall_ms == pytest.approx(140.0, abs=0.5) and graph.outcome != V.PAYS
