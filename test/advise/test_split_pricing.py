"""The split's cost model on profiled MIXED steps (advise/split_pricing.py): the counts built
from a step label's aggregates, the layer mix from config.json, the regime a step is priced
in, and its predicted wall change."""

from __future__ import annotations

import json

import pytest

from sglang_mixgraph.advise.evidence import SPLIT_HOST_PER_LAYER_MS
from sglang_mixgraph.advise.split_pricing import price_step, read_model_layers, step_counts
from sglang_mixgraph.advise.steps import Step, StepLabel
from sglang_mixgraph.core import split_cost_model as scm
from sglang_mixgraph.resolution.presets import DSV4_MODEL_DIR

PRO = read_model_layers(str(DSV4_MODEL_DIR))
SM90 = scm.load_coefficients("sm90")


def label(c: int, g: int, c_sq: int, c_sk: int, g_sk: int) -> StepLabel:
    return StepLabel.parse(
        f"step[MIXED bs={c + g} c={c} g={g} c_sq={c_sq} c_sk={c_sk} g_sq={g} g_sk={g_sk}]"
    )


def test_the_layer_mix_and_indexer_of_deepseek_v4_pro():
    assert PRO.layers == {0: 2, 4: 30, 128: 29} and PRO.count == 61
    assert (PRO.index_topk, PRO.swa) == (1024, 128)
    assert read_model_layers(str(DSV4_MODEL_DIR / "config.json")).layers == PRO.layers


def test_a_config_without_compress_ratios_or_a_missing_one_is_an_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 4}))
    with pytest.raises(ValueError, match="compress_ratios"):
        read_model_layers(str(tmp_path))
    with pytest.raises(OSError):
        read_model_layers(str(tmp_path / "missing"))


def test_one_prefill_request_and_decode_rows_at_their_mean_context():
    counts = step_counts(label(1, 24, 2560, 4608, 24 * 2050), PRO)
    seqs, exts = [4608] + [2050] * 24, [2560] + [1] * 24
    assert counts == scm.StepCounts.from_lists(seqs, exts, 24, topk=1024, swa=128)


def test_several_prefill_requests_share_their_rows_and_lengths_evenly():
    counts = step_counts(label(2, 3, 1001, 5001, 300), PRO)
    seqs, exts = [2501, 2500, 100, 100, 100], [501, 500, 1, 1, 1]
    assert counts == scm.StepCounts.from_lists(seqs, exts, 3, topk=1024, swa=128)


def test_a_label_without_the_aggregates_cannot_be_priced():
    assert step_counts(StepLabel.parse("step[MIXED bs=12]"), PRO) is None
    step = Step(rank="TP-0", label=StepLabel.parse("step[MIXED bs=12]"), start_us=0, host_ms=1)
    assert price_step(step, PRO, SM90) is None


def _step(host_ms: float, kernel_ms: float, graphs: int) -> Step:
    lb = label(1, 256, 2560, 32768, 256 * 32768)
    return Step("TP-0", lb, 0.0, host_ms, kernel_ms=kernel_ms, graph_launches=graphs)


def test_eager_steps_are_priced_as_walls_and_replays_as_gpu_time():
    counts = step_counts(_step(0, 0, 0).label, PRO)
    eager = price_step(_step(300.0, 200.0, 0), PRO, SM90)
    assert eager.regime == scm.EAGER
    p = scm.predict_step(counts, PRO.layers, SM90, regime=scm.EAGER)
    splits = scm.decide_step(counts, PRO.layers, SM90, regime=scm.EAGER)
    assert eager.splits == splits
    assert eager.wall_delta_ms == pytest.approx(p.adaptive_ms(splits) - p.unsplit_ms)

    replay = price_step(_step(30.0, 200.0, 2), PRO, SM90)
    p = scm.predict_step(counts, PRO.layers, SM90, regime=scm.REPLAY)
    assert replay.regime == scm.REPLAY and replay.splits  # 256 decode rows at 32k: it gains
    # GPU-bound: the wall follows the model's change; the split's host stays hidden
    assert replay.wall_delta_ms == pytest.approx(p.adaptive_ms(True) - p.unsplit_ms)
    assert replay.wall_delta_ms < 0


def test_a_host_bound_replay_pays_the_splits_host_per_layer():
    replay = price_step(_step(150.0, 100.0, 2), PRO, SM90)
    assert replay.splits
    assert replay.wall_delta_ms == pytest.approx(SPLIT_HOST_PER_LAYER_MS.high * 61)
