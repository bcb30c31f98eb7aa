import dataclasses
import json
import os
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_mixgraph.core import split_cost_model as m
from sglang_mixgraph.kits import cost_fit as fitting  # fitting: offline, never in the server


def _coeffs(**over):
    c = dict(
        a_ws=4e-7,
        a_key=6e-7,
        a_row=1e-5,
        c_pre=0.01,
        d_key=1.1e-6,
        d_row=1e-5,
        c_dec=0.01,
        a_cat=6e-5,
    )
    c.update(over)
    return m.Coefficients(arch="test", per_ratio={4: c, 128: dict(c)})


def test_split_shrinks_workspace_by_the_decode_share():
    s = m.StepShape.uniform(4, 8192, 256, 1792)
    assert s.ws_all - s.ws_pre == 256 * (8192 // 4 + 128)
    assert s.keys_all - s.keys_pre == s.keys_dec == 256 * (128 + 1024)
    assert s.prefill_rows == 1792 and s.num_decode == 256


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([4, 128]),
    st.sampled_from([1024, 2048, 4096, 8192, 16384, 32768]),
    st.sampled_from([32, 128, 256, 512]),
    st.sampled_from([0, 512, 1792, 4096]),
)
def test_predictions_are_monotonic(ratio, ctx, d, p):
    c = _coeffs()
    u, s = m.predict(m.StepShape.uniform(ratio, ctx, d, p), c)
    u2, s2 = m.predict(m.StepShape.uniform(ratio, ctx * 2, d, p), c)
    u3, s3 = m.predict(m.StepShape.uniform(ratio, ctx, d * 2, p), c)
    assert u2 >= u and s2 >= s  # longer contexts never get cheaper
    assert u3 >= u and s3 >= s  # more decode rows never get cheaper
    # once the c4 top-k is saturated (context >= 4 * 1024) the decode kernel's work per row is
    # fixed while the removed dequant keeps growing with the history: the gain grows
    if ratio == 4 and ctx >= 4096:
        assert (u2 - s2) >= (u - s)


def test_should_split_follows_the_dequant_vs_decode_tradeoff():
    c = _coeffs()
    short = m.StepShape.uniform(4, 1024, 32, 4096)
    long = m.StepShape.uniform(4, 32768, 512, 512)
    assert not m.should_split(short, c)  # little dequant saved, join + penalty dominate
    assert m.should_split(long, c)  # 512 x 8192 compressed rows not dequantized
    # no decode rows: never split
    assert not m.should_split(m.StepShape.uniform(4, 8192, 0, 1792), c)
    # a free decode kernel and an expensive dequant always split; the reverse never does
    cheap = _coeffs(d_key=0.0, d_row=0.0, c_dec=0.0, a_cat=0.0)
    assert m.should_split(short, cheap)
    dear = _coeffs(d_key=1.0)
    assert not m.should_split(long, dear)
    # margin makes adaptive stricter
    u, s = m.predict(long, c)
    assert not m.should_split(long, c, margin=1 - s / u + 1e-6)


def test_fit_recovers_coefficients_from_exact_samples():
    truth = _coeffs()
    samples = []
    for ratio in (4, 128):
        for ctx in (1024, 4096, 16384, 32768):
            for d in (32, 128, 512):
                for p in (0, 512, 4096):
                    s = m.StepShape.uniform(ratio, ctx, d, p)
                    u, sp = m.predict(s, truth)
                    samples.append((s, u, sp))
    fit = fitting.fit_coefficients(samples, arch="test")
    errs = fitting.relative_errors(samples, fit)
    assert max(abs(e) for pair in errs for e in pair if e == e) < 1e-6
    for ratio in (4, 128):
        for k in ("a_ws", "d_key", "a_key", "a_cat"):
            assert fit.per_ratio[ratio][k] == pytest.approx(truth.per_ratio[ratio][k], rel=1e-4)


def test_fit_keeps_coefficients_non_negative():
    samples = []
    gen = torch.Generator().manual_seed(0)
    for ctx in (1024, 8192):
        for d in (32, 512):
            for p in (0, 1792):
                s = m.StepShape.uniform(4, ctx, d, p)
                samples.append(
                    (
                        s,
                        float(torch.rand(1, generator=gen)) + 0.1,
                        float(torch.rand(1, generator=gen)) + 0.1,
                    )
                )
    fit = fitting.fit_coefficients(samples, arch="noise")
    assert all(v >= 0 for v in fit.per_ratio[4].values())


def test_coefficients_json_round_trip_and_fallbacks(tmp_path):
    c = _coeffs()
    again = m.Coefficients.from_json(json.loads(json.dumps(c.to_json())))
    assert again.per_ratio == c.per_ratio
    unknown = m.load_coefficients("sm999")
    assert unknown.margin >= m.UNKNOWN_ARCH_MARGIN
    assert "fallback" in unknown.arch
    with pytest.raises(ValueError):
        m.Coefficients.from_json({"arch": "x", "coefficients": {"4": {"a_ws": 1.0}}})


def test_shipped_calibration_is_loadable_when_present():
    c = m.load_coefficients("sm90")
    assert set(c.per_ratio) <= {0, 4, 128}
    for ratio in c.per_ratio:
        assert all(v >= 0 for v in c.for_ratio(ratio).values())


def test_shipped_sm90_model_never_loses_to_upstream_in_server():
    """Against the in-server H200 sweep the shipped coefficients were fitted from
    (docs/results/mixed_split_inserver_fit_h200.json: upstream's forward with the patch off and
    ``always``), the model's choice is never more than 1 % slower than upstream and never more
    than 5 % slower than the faster path."""

    path = os.path.join(
        os.path.dirname(__file__),
        "..",
        "..",
        "docs",
        "results",
        "mixed_split_inserver_fit_h200.json",
    )
    points = json.load(open(path))["points"]
    c = m.load_coefficients("sm90")
    ratio = {"csa_c4_top1024": 4, "hca_c128": 128}
    assert len(points) == 72
    split = 0
    for r in points:
        shape = m.StepShape.uniform(
            ratio[r["layer"]], r["context"], r["decode_rows"], r["prefill_rows"]
        )
        off, always = r["off_layer_ms"], r["always_layer_ms"]
        chosen = always if m.should_split(shape, c) else off
        split += chosen is always
        assert chosen <= 1.01 * off, r
        assert chosen <= 1.05 * min(off, always), r
    assert 0 < split < len(points)


# --------------------------------------------------------------------------------------------
# regimes: replay (GPU model) and eager (host exposed)
# --------------------------------------------------------------------------------------------

RESULTS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "results")
RATIO_OF_LAYER = {"csa_c4_top1024": 4, "hca_c128": 128}


def _points(name):
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)["points"]


def _shape(p):
    return m.StepShape.uniform(
        RATIO_OF_LAYER[p["layer"]], p["context"], p["decode_rows"], p["prefill_rows"]
    )


def _shipped_json():
    path = os.path.join(os.path.dirname(m.__file__), "..", "data", "split_cost_sm90.json")
    with open(path) as f:
        return json.load(f)


def _without_eager(data):
    """The same file as written before the eager terms existed."""
    return {k: v for k, v in data.items() if k != "eager"}


def test_eager_decision_avoids_the_slow_arm_where_adaptive_lost_in_eager_steps():
    """c4 8k D 32 P 512 in the eager in-server run (docs/results/mixed_split_inserver_h200.json):
    the recorded ``adaptive`` split there and lost to ``off``; the eager model keeps it off."""
    p = next(
        x
        for x in _points("mixed_split_inserver_h200.json")
        if (x["layer"], x["context"], x["decode_rows"], x["prefill_rows"])
        == ("csa_c4_top1024", 8192, 32, 512)
    )
    assert p["adaptive_split"] and p["always_layer_wall_ms"] > p["off_layer_wall_ms"]
    c = m.load_coefficients("sm90")
    assert not m.should_split(_shape(p), c, regime="eager")
    u, s = m.predict_eager(_shape(p), c)
    assert s > u  # predicted slower, not a tie broken by luck


def test_eager_decisions_follow_the_eager_timings():
    """At every eager point where one arm's wall is more than 10 % below the other's (well past
    the run's ~2 % median spread between two measurements of the same code) the eager decision
    picks it; nowhere is it more than 5 % slower than the faster arm."""
    c = m.load_coefficients("sm90")
    points = _points("mixed_split_inserver_h200.json")
    assert len(points) == 24
    resolved = 0
    for p in points:
        off, always = p["off_layer_wall_ms"], p["always_layer_wall_ms"]
        split = m.should_split(_shape(p), c, regime="eager")
        chosen = always if split else off
        assert chosen <= 1.05 * min(off, always), p
        if max(off, always) > 1.10 * min(off, always):
            resolved += 1
            assert chosen == min(off, always), p
    assert resolved >= len(points) // 2


def test_replay_decision_unchanged_at_every_queue_ahead_point():
    """Adding the eager terms changes nothing in replays: the default regime is replay and
    its decision and predictions are those of the same coefficients without eager terms."""
    data = _shipped_json()
    assert "eager" in data
    new = m.Coefficients.from_json(data)
    old = m.Coefficients.from_json(_without_eager(data))
    points = _points("mixed_split_inserver_fit_h200.json")
    assert len(points) == 72
    for p in points:
        s = _shape(p)
        decided = m.should_split(s, old)
        assert m.should_split(s, new, regime="replay") == decided
        assert m.should_split(s, new) == decided
        assert m.predict(s, new) == m.predict(s, old)


def test_coefficients_load_with_and_without_eager_terms(monkeypatch, caplog):
    data = _shipped_json()
    new = m.Coefficients.from_json(data)
    again = m.Coefficients.from_json(json.loads(json.dumps(new.to_json())))
    assert again.eager == new.eager and again.eager_source == new.eager_source
    assert set(new.eager) == set(new.per_ratio)
    for terms in new.eager.values():
        assert 0.0 <= terms["kappa"] <= 1.0
        assert all(terms[k] > 0 for k in m.EAGER_NAMES if k != "kappa")
    assert new.eager_source and new.source and new.eager_source != new.source
    # SWA-only layers borrow the c4 terms, as for the GPU model
    assert new.eager_for_ratio(0) == new.eager_for_ratio(4)
    # an unknown GPU keeps the eager terms (and the larger margin)
    assert m.load_coefficients("sm999").eager == new.eager

    old = m.Coefficients.from_json(_without_eager(data))
    assert old.eager is None and "eager" not in old.to_json()
    assert m.predict_eager(m.StepShape.uniform(4, 8192, 32, 512), old) is None
    monkeypatch.setattr(m, "_warned_no_eager", set())
    shapes = [_shape(p) for p in _points("mixed_split_inserver_h200.json")]
    with caplog.at_level("WARNING", logger=m.__name__):
        for s in shapes:  # eager steps fall back to today's (GPU model) decision
            assert m.should_split(s, old, regime="eager") == m.should_split(s, old)
    notes = [r for r in caplog.records if "no eager" in r.getMessage()]
    assert len(notes) == 1
    with pytest.raises(ValueError):
        m.should_split(shapes[0], new, regime="graph")
    bad = dict(data, eager=dict(data["eager"], coefficients={"4": {"kappa": 0.5}}))
    with pytest.raises(ValueError):
        m.Coefficients.from_json(bad)


def test_eager_wall_is_bounded_below_by_host_time():
    c = _coeffs()
    eager = {
        4: dict(host_unsplit=0.2, host_split=0.5, host_split_decode_only=0.25, kappa=0.5),
    }
    c = dataclasses.replace(c, eager=eager)
    tiny = m.StepShape.uniform(4, 1024, 1, 16)
    u, s = m.predict_eager(tiny, c)
    gu, gs = m.predict(tiny, c)
    assert u == pytest.approx(max(0.2, gu + 0.1)) and s == pytest.approx(max(0.5, gs + 0.25))
    assert u >= 0.2 and s >= 0.5
    # the GPU model alone would split this long-context step; exposed host time may not
    long = m.StepShape.uniform(4, 32768, 512, 512)
    assert m.should_split(long, c) == m.should_split(long, c, regime="replay")
    free_host = dataclasses.replace(
        c, eager={4: dict(host_unsplit=0.0, host_split=0.0, host_split_decode_only=0.0, kappa=0)}
    )
    assert m.predict_eager(long, free_host) == pytest.approx(m.predict(long, c))
    # no decode rows: never split, in either regime
    assert not m.should_split(m.StepShape.uniform(4, 8192, 0, 1792), c, regime="eager")


def test_fit_eager_terms_recovers_host_and_kappa():
    truth = dataclasses.replace(
        _coeffs(),
        eager={
            r: dict(
                host_unsplit=0.2 + r / 1e3, host_split=0.45, host_split_decode_only=0.22, kappa=0.7
            )
            for r in (4, 128)
        },
    )
    samples = []
    for ratio in (4, 128):
        for ctx in (8192, 32768):
            for d in (32, 256):
                for p in (0, 512, 1792):
                    s = m.StepShape.uniform(ratio, ctx, d, p)
                    e = truth.eager[ratio]
                    hs = e["host_split"] if p else e["host_split_decode_only"]
                    gu, gs = m.predict(s, truth)
                    samples.append(
                        (s, e["host_unsplit"], hs, gu + 0.7 * e["host_unsplit"], gs + 0.7 * hs)
                    )
    gpu_only = dataclasses.replace(truth, eager=None)
    fitted = fitting.fit_eager_terms(samples, gpu_only, source="synthetic")
    assert fitted.per_ratio == truth.per_ratio and fitted.eager_source == "synthetic"
    for ratio in (4, 128):
        for k in m.EAGER_NAMES:
            assert fitted.eager[ratio][k] == pytest.approx(truth.eager[ratio][k], rel=1e-9)


# --------------------------------------------------------------------------------------------
# whole steps: StepCounts, predict_step, decide_step
# --------------------------------------------------------------------------------------------

DSV4_PRO_LAYERS = {0: 2, 4: 30, 128: 29}  # docs/results/mixed_steady_state_h200.md


def _python_lines(fn):
    """Python lines executed by ``fn()`` (every frame): a count that grows with any Python loop."""
    n = [0]

    def tracer(frame, event, arg):
        if event == "line":
            n[0] += 1
        return tracer

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return n[0]


def test_a_steps_decision_takes_the_same_python_work_for_16_or_4096_decode_rows():
    """O(1) per step: from the decode lengths as a tensor (``ForwardBatch.seq_lens_cpu``), the
    counts and the decision run the same Python lines whatever the decode batch size (the
    reductions run in numpy); ``StepShape.from_lists``, three times, walks every request."""
    c = m.load_coefficients("sm90")

    def decide(d):
        seqs = torch.tensor([8192 + 2560] + [8192] * d, dtype=torch.int32)
        exts = [2560] + [1] * d
        return lambda: m.decide_step(
            m.StepCounts.from_lists(seqs, exts, d, topk=1024), DSV4_PRO_LAYERS, c, regime="eager"
        )

    small, large = _python_lines(decide(16)), _python_lines(decide(4096))
    assert small == large

    def per_ratio(d):
        seqs, exts = [8192 + 2560] + [8192] * d, [2560] + [1] * d
        return lambda: [m.StepShape.from_lists(r, seqs, exts, d, topk=1024) for r in (0, 4, 128)]

    assert _python_lines(per_ratio(4096)) > 10 * _python_lines(per_ratio(16))


def _step(ctx, d, p):
    seqs = ([max(ctx, p)] if p else []) + [ctx] * d
    exts = ([p] if p else []) + [1] * d
    return m.StepCounts.from_lists(seqs, exts, d, topk=1024)


@pytest.mark.parametrize("regime", ["replay", "eager"])
def test_a_step_is_priced_as_its_layers_plus_one_chunk_cache_each_way(regime):
    c = dataclasses.replace(
        m.load_coefficients("sm90"),
        step={"cache_build_ms": 0.4, "split_plan_ms": 0.1, "eval_ms": 0.03},
    )
    for p in (0, 2560):
        counts = _step(8192, 256, p)
        pred = m.predict_step(counts, DSV4_PRO_LAYERS, c, regime=regime)
        walls = {r: m.layer_walls(counts.shape(r), c, regime) for r in DSV4_PRO_LAYERS}
        layers_u = sum(n * walls[r][0] for r, n in DSV4_PRO_LAYERS.items())
        layers_s = sum(n * walls[r][1] for r, n in DSV4_PRO_LAYERS.items())
        assert pred.unsplit_ms == pytest.approx(layers_u + 0.4)  # upstream's one cache
        # the split's one cache (none without prefill rows) and its plan
        assert pred.split_ms == pytest.approx(layers_s + (0.4 if p else 0.0) + 0.1)
        assert pred.eval_ms == 0.03
        assert pred.adaptive_ms(True) == pytest.approx(pred.split_ms + 0.03)
        decided = m.decide_step(counts, DSV4_PRO_LAYERS, c, regime=regime)
        assert decided == (pred.split_ms <= pred.unsplit_ms)
    # nothing to split without decode rows
    none = _step(8192, 0, 2560)
    p0 = m.predict_step(none, DSV4_PRO_LAYERS, c, regime=regime)
    assert p0.split_ms == p0.unsplit_ms and not m.decide_step(none, DSV4_PRO_LAYERS, c)


def test_the_plans_cost_keeps_a_step_unsplit_where_the_layers_gain_less():
    """A small step whose layers gain less than the plan costs stays unsplit; with a free plan
    the same step splits (the step terms are counted, not only the layers)."""
    c = m.load_coefficients("sm90")
    counts = _step(2048, 8, 0)
    layers = {4: 1}
    u, s = m.layer_walls(counts.shape(4), c, "replay")
    gain = u - s
    assert gain > 0  # the layer alone would split
    plan_cost = dict(c.step_terms(), split_plan_ms=gain + c.step_terms()["cache_build_ms"] + 0.01)
    assert not m.decide_step(counts, layers, dataclasses.replace(c, step=plan_cost))
    free = dict.fromkeys(m.STEP_NAMES, 0.0)
    assert m.decide_step(counts, layers, dataclasses.replace(c, step=free))


def test_whole_step_decisions_pick_the_faster_recorded_step_counting_prepare():
    """docs/results/mixed_steady_state_h200.json: 61 DSV4-Pro layers replayed, 256 decode rows
    and a 2560-token chunk; counting the prepare, ``always`` (every layer split) was the faster
    whole step at every point, and the per-step decision of the shipped model splits there."""
    data = json.load(open(os.path.join(RESULTS, "mixed_steady_state_h200.json")))
    layers = {int(r): n for r, n in data["environment"]["layers"].items()}
    assert layers == DSV4_PRO_LAYERS
    c = m.load_coefficients("sm90")
    for p in data["points"]:
        whole = {a: p[a]["replay_ms"] + p[a]["prepare_ms"] for a in ("off", "always")}
        counts = _step(p["context"], p["decode_rows"], p["prefill_rows"])
        split = m.decide_step(counts, layers, c, regime="replay")
        assert whole["always"] < whole["off"] and split, p["context"]


def test_step_terms_load_default_and_round_trip():
    data = {k: v for k, v in _shipped_json().items() if k != "step"}  # a file without the block
    c = m.Coefficients.from_json(data)
    assert c.step is None and c.step_terms() == m.DEFAULT_STEP_TERMS
    assert c.step_terms_source() == m.DEFAULT_STEP_SOURCE and "fallback" in m.DEFAULT_STEP_SOURCE
    assert set(m.DEFAULT_STEP_TERMS) == set(m.STEP_NAMES)
    terms = {"cache_build_ms": 0.25, "split_plan_ms": 0.2, "eval_ms": 0.01}
    with_step = dataclasses.replace(c, step=terms, step_source="test")
    again = m.Coefficients.from_json(json.loads(json.dumps(with_step.to_json())))
    assert again.step == terms and again.step_source == "test" and again.step_terms() == terms
    assert "step" not in c.to_json()
    bad = dict(with_step.to_json(), step={"terms": {"cache_build_ms": 1.0}})
    with pytest.raises(ValueError):
        m.Coefficients.from_json(bad)
    with pytest.raises(ValueError):
        m.decide_step(_step(8192, 8, 0), {4: 1}, c, regime="graph")


# --------------------------------------------------------------------------------------------
# step terms fitted from recorded whole steps (benchmark/mixed_steady_state.py results)
# --------------------------------------------------------------------------------------------


def _parts(plan=0.0, decision=0.0, tail=0.0, cache=0.0, replay_cache=0.0):
    zero = {"plan": 0.0, "decision": 0.0, "tail_inputs": 0.0, "chunk_cache": 0.0}
    return {
        "prepare": dict(zero, plan=plan, decision=decision, tail_inputs=tail, chunk_cache=cache),
        "replay": dict(zero, chunk_cache=replay_cache),
    }


def _steady_run(points):
    env = {"gpu": "GPU-X", "date": "2026-01-02", "command": "bench --x", "arms": ["off"]}
    return {"environment": env, "points": points}


def test_step_terms_fit_from_a_small_recorded_run():
    """Two contexts, medians per arm only (as runs 4 and 5 recorded them): each term is the
    median of its per-arm values, mapped from the parts as the fit's docstring says."""
    run = _steady_run(
        [
            {
                "context": 8192,
                "off": {"host_parts_ms": _parts(replay_cache=0.6)},
                "adaptive": {"host_parts_ms": _parts(1.1, 0.3, 0.1, 0.5)},
                "always": {"host_parts_ms": _parts(1.0, 0.0, 0.15, 0.7)},
            },
            {
                "context": 32768,
                "off": {"host_parts_ms": _parts(replay_cache=0.9)},
                "adaptive": {"host_parts_ms": _parts(1.5, 0.4, 0.14, 0.72)},
                "always": {"host_parts_ms": _parts(1.1, 0.0, 0.16, 0.71)},
            },
        ]
    )
    terms, per_context = fitting.fit_step_terms([run])
    builds = sorted([0.6, 0.5, 0.7, 0.9, 0.72, 0.71])  # off's replay + the patch arms' prepare
    plans = sorted([1.1 - 0.3 - 0.5, 1.0 - 0.7, 1.5 - 0.4 - 0.72, 1.1 - 0.71])
    expected = {
        "cache_build_ms": (builds[2] + builds[3]) / 2,
        "split_plan_ms": (plans[1] + plans[2]) / 2,
        "eval_ms": (0.3 + 0.4) / 2,
    }
    assert set(terms) == set(m.STEP_NAMES)
    for k, v in expected.items():
        assert terms[k] == pytest.approx(v, abs=1e-4), k
    assert per_context["eval_ms"] == {8192: 0.3, 32768: 0.4}
    assert per_context["cache_build_ms"][8192] == pytest.approx(0.6)  # median of 0.6, 0.5, 0.7


def test_step_terms_fit_per_step_where_the_run_kept_the_steps():
    """``host_parts_samples`` (what the benchmark records now): per arm the median over its steps
    of each step's figure, not the figure of the per-part medians; an unsplit adaptive step
    (no tail inputs) gives no plan value, and a part not called (0) is no build."""
    adaptive = [_parts(1.0, 0.3, 0.1, 0.5), _parts(1.4, 0.2, 0.1, 0.6), _parts(0.35, 0.35)]
    always = [_parts(0.9, 0.0, 0.1, 0.4), _parts(1.3, 0.0, 0.1, 0.8)]
    run = _steady_run(
        [
            {
                "context": 2048,
                "off": {"host_parts_samples": [_parts(replay_cache=0.5)] * 3},
                "adaptive": {"host_parts_samples": adaptive},
                "always": {"host_parts_samples": always},
            }
        ]
    )
    terms, _ = fitting.fit_step_terms([run])
    adaptive_plan = ((1.0 - 0.3 - 0.5) + (1.4 - 0.2 - 0.6)) / 2  # the unsplit step has no plan
    always_plan = ((0.9 - 0.4) + (1.3 - 0.8)) / 2
    assert terms["split_plan_ms"] == pytest.approx((adaptive_plan + always_plan) / 2, abs=1e-4)
    # builds per arm: off 0.5; adaptive median(0.5, 0.6) (the unsplit step built none); always 0.6
    assert terms["cache_build_ms"] == pytest.approx(sorted([0.5, 0.55, 0.6])[1], abs=1e-4)
    assert terms["eval_ms"] == pytest.approx(0.3, abs=1e-4)  # median of 0.3, 0.2, 0.35
    with pytest.raises(ValueError):
        fitting.fit_step_terms([_steady_run([])])


def test_the_shipped_step_block_is_the_fit_of_the_recorded_runs_and_the_model_uses_it():
    runs = [
        json.load(open(os.path.join(RESULTS, f"mixed_steady_state_h200_run{i}", "steady.json")))
        for i in (4, 5)
    ]
    terms, _ = fitting.fit_step_terms(runs)
    shipped = _shipped_json()["step"]
    assert shipped["terms"] == pytest.approx(terms)
    assert "mixed_steady_state_h200_run4" in shipped["source"]
    assert "mixed_steady_state_h200_run5" in shipped["source"]
    c = m.load_coefficients("sm90")
    assert c.step_terms() == pytest.approx(terms) and c.step_terms_source() == shipped["source"]
    assert c.file == "split_cost_sm90.json"
    # predict_step prices the step with the block's terms, not the defaults.
    counts = _step(8192, 256, 0)
    layers = {4: 3}
    pred = m.predict_step(counts, layers, c)
    u, s = m.layer_walls(counts.shape(4), c)
    assert pred.unsplit_ms == pytest.approx(3 * u + terms["cache_build_ms"])
    assert pred.split_ms == pytest.approx(3 * s + terms["split_plan_ms"])  # no prefill: no build
    assert pred.eval_ms == terms["eval_ms"]
    without = dataclasses.replace(c, step=None, step_source="")
    assert m.predict_step(counts, layers, without).eval_ms == m.DEFAULT_STEP_TERMS["eval_ms"]


def test_calibration_info_names_each_coefficients_source():
    c = m.load_coefficients("sm90")
    info = m.calibration_info(c)
    assert info["arch"] == "sm90" and info["file"].endswith("data/split_cost_sm90.json")
    assert info["per_layer"]["source"] == c.source and info["eager"]["source"] == c.eager_source
    assert info["step"] == {
        "fitted": True,
        "terms": dict(c.step_terms()),
        "source": c.step_source,
    }
    other = m.calibration_info(m.load_coefficients("sm100"))
    assert "fallback: sm90" in other["arch"] and other["margin"] == m.UNKNOWN_ARCH_MARGIN
    bare = m.calibration_info(dataclasses.replace(c, step=None, eager=None, file=""))
    assert bare["file"] is None and bare["eager"] is None
    assert bare["step"]["source"] == m.DEFAULT_STEP_SOURCE and not bare["step"]["fitted"]
    text = "\n".join(m.calibration_lines(bare))
    assert "NOT fitted" in text and "no calibration file" in text
    # one line for plan's default text: the GPU the sources name, the borrowing, no paths
    assert m.calibration_summary(info) == "calibrated on the NVIDIA H200 (sm90)"
    assert m.calibration_summary(other) == (
        "calibrated on the NVIDIA H200 (sm90), borrowed: sm100 has no calibration of its own; "
        "splits only for a predicted gain of at least 10%"
    )
    builtin = m.calibration_info(m.builtin_coefficients())
    assert m.calibration_summary(builtin).startswith("not calibrated (a built-in estimate)")
    assert "step terms not fitted" in m.calibration_summary(builtin)
