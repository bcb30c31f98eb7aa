"""The end-to-end harness's own logic on CPU: workload, phases, checks, and the driver's plumbing.

The GPU run itself is test/gpu_e2e/run_e2e.py (it needs the H200 and the kit); here the driver
runs with a stand-in phase process that writes what a phase writes (tokens, step log, counter
lines), so that what it reports and its exit status are checked without a GPU. Every check is
fed fake phase records and step logs on which it must fail, as well as ones it must pass.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import e2e_checks as C
import e2e_phases as P
import e2e_step_log as L
import e2e_workload as W
import pytest

from sglang_mixgraph.core import split_cost_model as scm
from sglang_mixgraph.kits import gpu_machine

E2E = Path(__file__).resolve().parent
CONFIG = json.loads((E2E / "tiny_dsv4_config.json").read_text())


def _threshold_coeffs(c4_decode_keys: int) -> scm.Coefficients:
    """Synthetic coefficients, so that the checks' tests do not move with a refit of the GPU's:
    only c4 layers split, and they do when the step's decode rows attend to at least
    ``c4_decode_keys`` keys (unsplit: 1 per key; split: the prefill keys plus a fixed
    ``c4_decode_keys`` for the decode kernel). SWA-only and c128 layers never gain."""
    zero = dict.fromkeys(scm.COEFF_NAMES, 0.0)
    never = dict(zero, c_dec=1.0)
    c4 = dict(zero, a_key=1.0, c_dec=float(c4_decode_keys))
    return scm.Coefficients(arch="synthetic", per_ratio={0: never, 4: c4, 128: never})


# Each decode row at 12k attends to 128 SWA + 512 (the tiny top-k) c4 keys.
POLICY = C.AdaptivePolicy(_threshold_coeffs(6000), CONFIG["index_topk"], {0: 1, 4: 2, 128: 1})


# ---- the tiny model and the workload ---------------------------------------------------------


def test_tiny_config_is_dsv4_shaped():
    assert CONFIG["model_type"] == "deepseek_v4" and CONFIG["num_attention_heads"] == 64
    ratios = CONFIG["compress_ratios"][: CONFIG["num_hidden_layers"]]
    assert {0, 4, 128} <= set(ratios)  # SWA-only, c4 (with the indexer), c128 layers
    assert CONFIG["window_size"] == 128 and CONFIG["index_topk"] == 512


def test_workload_is_fixed_and_makes_the_shapes_the_checks_need():
    segs = W.build()
    assert segs == W.build()  # fixed seed
    assert segs != W.build(seed=1)
    reqs = W.all_requests(segs)
    assert len({r.rid for r in reqs}) == len(reqs)
    assert all(10 <= t < W.VOCAB - 10 for r in reqs for t in r.prompt)
    lens = [len(r.prompt) for r in reqs]
    window, c128_page = CONFIG["window_size"], 128 * 64
    assert any(n > P.CHUNK for n in lens)  # prompts longer than the chunk
    assert (
        max(lens) > c128_page and max(lens) // 4 > CONFIG["index_topk"]
    )  # beyond the indexer's top-k
    # Requests that decode while later prompts arrive, with contexts beyond the SWA window.
    staggered = [s for s in segs if s.then]
    assert staggered and all(len(r.prompt) + 1 > window for s in staggered for r in s.then)
    assert W.peak_tokens(segs) <= P.MAX_TOTAL_TOKENS
    assert max(len(s.first) + len(s.then) for s in segs) <= P.MAX_RUNNING


def test_long_requests_still_decode_when_the_late_prompt_arrives():
    long = next(s for s in W.build() if s.name == "long")
    chunks = -(-W.LONG_PROMPT // P.CHUNK)
    ends = [chunks * (i + 1) + r.max_new for i, r in enumerate(long.first)]  # in chunk steps
    all_decoding_from = chunks * len(long.first)
    assert min(ends) - all_decoding_from >= W.LATE_MARGIN_STEPS


def test_long_mixed_steps_are_where_the_h200_cost_model_splits_c4():
    from sglang_mixgraph.core import split_cost_model as scm

    coeffs = scm.load_coefficients("sm90")
    d = W.LONG_REQUESTS
    seqs, exts = [W.LONG_PROMPT + P.CHUNK] + [W.LONG_PROMPT + 1] * d, [P.CHUNK] + [1] * d
    shape = lambda r: scm.StepShape.from_lists(r, seqs, exts, d, topk=CONFIG["index_topk"])  # noqa: E731
    assert scm.should_split(shape(4), coeffs) and not scm.should_split(shape(128), coeffs)
    short = scm.StepShape.from_lists(4, [900, 41], [256, 1], 1, topk=CONFIG["index_topk"])
    assert not scm.should_split(short, coeffs)  # the short segments stay unsplit under adaptive


# ---- phases ------------------------------------------------------------------------------------


def test_phases_parse_in_run_order_and_reject_unknown_names():
    assert [p.name for p in P.parse([])] == [
        "eager-off",
        "dgraph-off",
        "bcg-off",
        "bcg-off-rd",
        "eager-always",
        "dgraph-always",
        "bcg-always",
        "bcg-always-rd",
        "eager-adaptive",
        "dgraph-adaptive",
        "bcg-adaptive",
    ]
    assert [p.name for p in P.parse(["bcg-always", "eager-off"])] == ["eager-off", "bcg-always"]
    # A read-done phase is never a baseline: it runs after bcg-off, which it is compared with.
    rd = P.parse(["bcg-off-rd", "bcg-off"])
    assert [p.name for p in rd] == ["bcg-off", "bcg-off-rd"]
    assert [p.name for p in P.parse(["eager-off-rd", "dgraph-off", "eager-off"])] == [
        "eager-off",
        "dgraph-off",
        "eager-off-rd",
    ]
    assert [p.is_baseline for p in rd] == [True, False] and rd[1].baseline == "bcg-off"
    assert P.parse(["dgraph-adaptive-rd"]) == [P.Phase("dgraph", "adaptive", read_done=True)]
    for bad in ("eager-sometimes", "bcg-rd", "bcg-always-rd-rd", "bcg-always-RD"):
        with pytest.raises(ValueError, match="unknown phase"):
            P.parse([bad])


def test_phase_env_differs_from_its_baseline_by_the_split_alone():
    offs = {
        "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN": "0",
        "SGLANG_MIXGRAPH_SPLIT_POLICY": "always",
        "SGLANG_MIXGRAPH_PREFILL_BUCKETS": "upstream",
        "SGLANG_EXPERIMENTAL_FORCE_BCG": "0",
    }
    base = P.Phase("dgraph", "off").env(offs, radix=True)
    adaptive = P.Phase("dgraph", "adaptive").env(offs, radix=True)
    diff = {k for k in set(base) | set(adaptive) if base.get(k) != adaptive.get(k)}
    assert diff == {"SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN", "SGLANG_MIXGRAPH_SPLIT_POLICY"}
    assert (
        adaptive["SGLANG_MIXGRAPH_SPLIT_POLICY"] == "adaptive"
        and base["SGLANG_MIXGRAPH_PREFILL_BUCKETS"] == "upstream"
    )
    assert base[P.RADIX_CORE_ENV] == "python" and P.RADIX_CORE_ENV not in P.Phase(
        "eager", "off"
    ).env(offs, radix=False)


def test_faithful_phase_differs_from_standin_by_the_kernel_selection_alone():
    offs = {"SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN": "0"}
    phase = P.Phase("bcg", "always")
    standin, faithful = (phase.env(offs, radix=False, kernels=k) for k in ("standin", "faithful"))
    assert standin == phase.env(offs, radix=False)
    assert standin[gpu_machine.KIT_KERNELS_ENV] == "standin"
    assert faithful[gpu_machine.KIT_KERNELS_ENV] == "faithful"
    assert faithful["SGLANG_OPT_USE_TILELANG_MHC_POST"] == "1"
    assert faithful[P.SPLIT_FLAG] == standin[P.SPLIT_FLAG] == "1"
    kw = {
        k: phase.engine_kwargs("/m", radix=False, slot=0, kernels=k)
        for k in ("standin", "faithful")
    }
    assert kw["standin"]["dsa_topk_backend"] == "torch"
    assert kw["faithful"]["dsa_topk_backend"] == "sgl-kernel"
    diff = {
        k
        for k in set(kw["standin"]) | set(kw["faithful"])
        if kw["standin"].get(k) != kw["faithful"].get(k)
    }
    assert diff == {"dsa_topk_backend", "fp8_gemm_runner_backend"}


def test_read_done_phase_env_is_its_phase_plus_the_two_read_done_flags():
    offs = {
        "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN": "0",
        "SGLANG_OPT_DSV4_REPLAY_READ_DONE": "0",
        "SGLANG_DEBUG_WAR_SNAPSHOT": "0",
    }
    for split in P.SPLITS:
        plain = P.Phase("bcg", split).env(offs, radix=False)
        rd = P.Phase("bcg", split, read_done=True).env(offs, radix=False)
        diff = {k: rd[k] for k in set(plain) | set(rd) if plain.get(k) != rd.get(k)}
        assert diff == {"SGLANG_OPT_DSV4_REPLAY_READ_DONE": "1", "SGLANG_DEBUG_WAR_SNAPSHOT": "1"}
        assert P.Phase("bcg", split, read_done=True).engine_kwargs(
            "/m", radix=False, slot=0
        ) == P.Phase("bcg", split).engine_kwargs("/m", radix=False, slot=0)


def test_engine_kwargs_per_graph_mode():
    kw = {g: P.Phase(g, "off").engine_kwargs("/m", radix=False, slot=1) for g in P.GRAPHS}
    assert kw["eager"]["disable_cuda_graph"] is True
    assert (
        kw["dgraph"]["cuda_graph_backend_prefill"] == "disabled"
        and kw["dgraph"]["cuda_graph_backend_decode"] == "full"
    )
    assert kw["bcg"]["cuda_graph_backend_prefill"] == "breakable"
    assert all(
        k["enable_mixed_chunk"]
        and k["chunked_prefill_size"] == P.CHUNK
        and k["disable_radix_cache"]
        for k in kw.values()
    )
    assert (
        P.Phase("eager", "off").engine_kwargs("/m", radix=True, slot=0)["port"]
        != kw["eager"]["port"]
    )


# ---- checks ------------------------------------------------------------------------------------


def test_compare_tokens_reports_first_differing_position_per_request():
    base = {"a": [1, 2, 3], "b": [4, 5], "c": [6], "d": [7, 8]}
    other = {"a": [1, 2, 3], "b": [4, 9], "c": [6, 0], "e": [1]}
    assert C.compare_tokens(base, other) == [
        C.Mismatch("b", 1, 2, 2),
        C.Mismatch("c", 1, 1, 2),
        C.Mismatch("d", None, 2, 0),
        C.Mismatch("e", None, 0, 1),
    ]
    assert C.compare_tokens(base, dict(base)) == []


def test_merge_counters_takes_each_process_last_line_and_sums_processes():
    lines = [
        {"pid": 1, "events": {"mixed_split": {"steps_split": 1}}, "fallbacks": {}},
        {
            "pid": 1,
            "events": {"mixed_split": {"steps_split": 5}},
            "fallbacks": {"mixed_split": {"bcg": 2}},
        },
        {"pid": 2, "events": {"mixed_split": {"steps_split": 1, "x": 3}}, "fallbacks": {}},
    ]
    assert C.merge_counters(lines) == {
        "events": {"mixed_split": {"steps_split": 6, "x": 3}},
        "fallbacks": {"mixed_split": {"bcg": 2}},
    }


def _steps(eager_mixed=0, graph_mixed=0, graph_extend=0):
    return (
        [{"mode": "MIXED", "graph": False}] * eager_mixed
        + [{"mode": "MIXED", "graph": True}] * graph_mixed
        + [{"mode": "EXTEND", "graph": True}] * graph_extend
        + [{"mode": "DECODE", "graph": True}] * 3
    )


def _rec(
    name,
    split,
    *,
    steps,
    events=None,
    fallbacks=None,
    outputs=None,
    stubs=(),
    read_done=False,
    drop_empty=False,
    live_width=False,
    patches=None,
    patch_fallbacks=None,
    ran=True,
):
    """A phase record; ``events``/``fallbacks`` are mixed_split's, ``patches`` /
    ``patch_fallbacks`` other patches' (``{patch: {key: n}}``)."""
    outputs = {"r0": [1, 2, 3], "r1": [4, 5]} if outputs is None else outputs
    return C.PhaseRecord(
        name=name,
        split=split,
        ran=ran,
        read_done=read_done,
        drop_empty=drop_empty,
        live_width=live_width,
        outputs=outputs,
        expected_lens={"r0": 3, "r1": 2},
        steps=steps,
        counters={
            "events": dict({"mixed_split": events} if events else {}, **(patches or {})),
            "fallbacks": dict(
                {"mixed_split": fallbacks} if fallbacks else {}, **(patch_fallbacks or {})
            ),
        },
        stub_calls=list(stubs),
    )


def _check(rec, base):
    return C.check_phase(rec, base, POLICY)


def _failed(checks):
    return [c.name for c in checks if not c.ok]


def _detail(checks, name):
    return next(c.detail for c in checks if c.name == name)


ACTED = {
    "steps_seen.mixed_run_as_extend": 4,
    "steps_split": 4,
    "layers_split.c0": 4,
    "layers_split.c4": 8,
    "layers_split.c128": 4,
}


REPLAYS = {
    "replays_seen": 5,
    "replays_split": 5,
    "layers_split.c0": 5,
    "layers_split.c4": 10,
    "layers_split.c128": 5,
}


def test_a_split_phase_passes_only_with_equal_tokens_and_the_split_acting():
    base = _rec("eager-off", "off", steps=_steps(4))
    assert _failed(_check(base, None)) == []
    assert (
        _failed(_check(_rec("eager-always", "always", steps=_steps(4), events=ACTED), base)) == []
    )
    # Equal tokens but the split never acted: failed, not a pass.
    vacuous = _check(
        _rec(
            "eager-always", "always", steps=_steps(4), events={"steps_seen.mixed_run_as_extend": 4}
        ),
        base,
    )
    assert _failed(vacuous) == [
        "split acted in every eager MIXED step",
        "layers of every compress ratio split",
    ]
    # Acted but different tokens: the mismatch is reported with its first position.
    differs = _check(
        _rec(
            "eager-always",
            "always",
            steps=_steps(4),
            events=ACTED,
            outputs={"r0": [1, 7, 3], "r1": [4, 5]},
        ),
        base,
    )
    bad = [c for c in differs if not c.ok]
    assert [c.name for c in bad] == ["tokens equal eager-off"] and "r0: first differs at 1" in bad[
        0
    ].detail


# ---- adaptive against the cost model -------------------------------------------------------------

# The long segment's late chunk with 16 decode rows at 12k: the sm90 model splits the c4 layers.
LONG_SHAPE = {
    "seq_lens": [W.LONG_PROMPT + P.CHUNK] + [W.LONG_PROMPT + 1] * W.LONG_REQUESTS,
    "extend_seq_lens": [P.CHUNK] + [1] * W.LONG_REQUESTS,
    "num_decode": W.LONG_REQUESTS,
}
# A chunk of the short segments with one decode row: no ratio splits.
SHORT_SHAPE = {"seq_lens": [900, 41], "extend_seq_lens": [256, 1], "num_decode": 1}


def _shaped(shapes, graph=False):
    return [dict(s, mode="MIXED", graph=graph) for s in shapes] + [
        {"mode": "DECODE", "graph": True}
    ]


def test_adaptive_policy_for_the_tiny_model_is_sm90_its_top_k_and_its_layers():
    policy = C.AdaptivePolicy.for_model(CONFIG)
    assert policy.coeffs == scm.load_coefficients("sm90")
    assert policy.topk == CONFIG["index_topk"] and policy.ratios == {0, 4, 128}
    # The layers the model has, per ratio (the pool's compression_ratios over its layers).
    assert policy.layers == {0: 1, 4: 2, 128: 1}
    two_layers = dict(CONFIG, compress_ratios=[4, 4, 128, 128], num_hidden_layers=2)
    assert C.AdaptivePolicy.for_model(two_layers).layers == {4: 2}


def test_adaptive_policy_splits_a_step_where_its_layers_gain():
    # 16 decode rows x 640 keys pass the c4 threshold, one row at 41 tokens does not.
    assert POLICY.splits(LONG_SHAPE) is True and POLICY.splits(SHORT_SHAPE) is False
    # Only the c4 layers gain: without them nothing splits.
    no_c4 = C.AdaptivePolicy(POLICY.coeffs, POLICY.topk, {0: 1, 128: 1})
    assert no_c4.splits(LONG_SHAPE) is False
    # One decision per step: the c4 layers' gain must outweigh the others' loss.
    heavy = C.AdaptivePolicy(POLICY.coeffs, POLICY.topk, {0: 5000, 4: 2, 128: 5000})
    assert heavy.splits(LONG_SHAPE) is False
    # The model's top-k caps the c4 keys: 8 rows at 12k are 8 x 640 keys with 512 (kept
    # unsplit), 8 x 1152 with 1024 (split).
    eight = {
        "seq_lens": [W.LONG_PROMPT + P.CHUNK] + [W.LONG_PROMPT + 1] * 8,
        "extend_seq_lens": [P.CHUNK] + [1] * 8,
        "num_decode": 8,
    }
    assert POLICY.splits(eight) is False
    assert C.AdaptivePolicy(POLICY.coeffs, 1024, POLICY.layers).splits(eight) is True
    # The split sizes a step by its requests: seq_lens entries past them (padding) are ignored.
    padded = dict(LONG_SHAPE, seq_lens=LONG_SHAPE["seq_lens"] + [1, 1])
    assert POLICY.splits(padded) is True
    # No decode count recorded (a phase without the split), or a decode count the lists
    # contradict: no decision.
    assert POLICY.splits(dict(LONG_SHAPE, num_decode=None)) is None
    assert POLICY.splits({"seq_lens": [5], "extend_seq_lens": [1], "num_decode": 2}) is None


ADAPTIVE_CHECK = "adaptive split the eager MIXED steps the cost model splits"


def test_adaptive_split_count_must_equal_the_cost_models():
    base = _rec("dgraph-off", "off", steps=_steps(5))
    steps = _shaped([LONG_SHAPE] * 2 + [SHORT_SHAPE] * 3)

    def adaptive(split, kept):
        events = {"steps_seen.mixed_run_as_extend": 5, "steps_split": split}
        events["steps_unsplit_adaptive"] = kept
        return _check(_rec("dgraph-adaptive", "adaptive", steps=steps, events=events), base)

    ok = adaptive(2, 3)
    assert _failed(ok) == []
    assert _detail(ok, ADAPTIVE_CHECK) == (
        "the cost model splits 2 of 5, keeps 3; adaptive split 2, kept unsplit 3"
    )
    # Every step decided, but not as the cost model decides: too few, too many.
    assert _failed(adaptive(1, 4)) == [ADAPTIVE_CHECK]
    assert _failed(adaptive(3, 2)) == [ADAPTIVE_CHECK]
    # A step left undecided fails both.
    assert _failed(adaptive(2, 2)) == ["adaptive decided every eager MIXED step", ADAPTIVE_CHECK]


def test_adaptive_passes_with_no_split_only_where_the_cost_model_splits_none():
    base = _rec("eager-off", "off", steps=_steps(4))
    steps = _shaped([SHORT_SHAPE] * 4)
    kept = {"steps_seen.mixed_run_as_extend": 4, "steps_unsplit_adaptive": 4}
    checks = _check(_rec("eager-adaptive", "adaptive", steps=steps, events=kept), base)
    assert _failed(checks) == []
    assert _detail(checks, ADAPTIVE_CHECK).startswith(
        "the cost model keeps all 4 eager MIXED steps unsplit at these shapes; the split itself "
        "is shown by the always phases"
    )
    split_one = {"steps_seen.mixed_run_as_extend": 4, "steps_split": 1, "steps_unsplit_adaptive": 3}
    assert _failed(
        _check(_rec("eager-adaptive", "adaptive", steps=steps, events=split_one), base)
    ) == [ADAPTIVE_CHECK]
    # The long shapes where the model splits: keeping them unsplit is a failure.
    long_steps = _shaped([LONG_SHAPE] * 4)
    assert _failed(
        _check(_rec("eager-adaptive", "adaptive", steps=long_steps, events=kept), base)
    ) == [ADAPTIVE_CHECK]


def test_adaptive_without_a_logged_shape_fails_and_replays_are_checked_apart():
    base = _rec("bcg-off", "off", steps=_steps(0, 3))
    no_shape = _shaped([dict(SHORT_SHAPE, num_decode=None)] * 3, graph=True)
    kept = {"replays_seen": 3, "replays_unsplit_adaptive": 3}
    checks = _check(_rec("bcg-adaptive", "adaptive", steps=no_shape, events=kept), base)
    name = "adaptive split the replayed MIXED steps the cost model splits"
    assert _failed(checks) == [name] and "3 of 3 replayed MIXED steps have no shape" in _detail(
        checks, name
    )
    # Replays are decided by replays_split / replays_unsplit_adaptive, not the eager counters.
    replayed = _shaped([LONG_SHAPE] + [SHORT_SHAPE] * 2, graph=True)
    right = {"replays_seen": 3, "replays_split": 1, "replays_unsplit_adaptive": 2}
    assert (
        _failed(_check(_rec("bcg-adaptive", "adaptive", steps=replayed, events=right), base)) == []
    )
    eager_counters = {"replays_seen": 3, "steps_split": 1, "steps_unsplit_adaptive": 2}
    assert _failed(
        _check(_rec("bcg-adaptive", "adaptive", steps=replayed, events=eager_counters), base)
    ) == ["adaptive decided every replayed MIXED step", name]


# ---- the read-done phases --------------------------------------------------------------------

RD_EVENTS = {
    "replay_read_done": {
        "replays_snapshot.mixed": 5,
        "replays_snapshot.extend": 2,
        "replays_published.mixed": 5,
        "replays_published.extend": 2,
        "caches_prebuilt": 7,
    },
    "war_snapshot_check": {"forwards_marked": 9},
}
RD_STEPS = _steps(0, 5, 2)


def _rd(patches=RD_EVENTS, *, steps=RD_STEPS, **kw):
    return _rec("bcg-off-rd", "off", steps=steps, read_done=True, patches=patches, **kw)


def _without(patch, key):
    return dict(RD_EVENTS, **{patch: {k: n for k, n in RD_EVENTS[patch].items() if k != key}})


def test_read_done_off_phase_passes_only_with_its_baselines_tokens_and_publications():
    base = _rec("bcg-off", "off", steps=RD_STEPS)
    checks = _check(_rd(), base)
    assert _failed(checks) == []
    names = [c.name for c in checks]
    # split off, yet compared with bcg-off: the read-done patches must not change a token
    assert "tokens equal bcg-off" in names and "mixed_split inactive (flag off)" in names
    assert _detail(checks, "read-done published for replayed MIXED steps") == (
        "published 5 of 5 replayed MIXED steps"
    )
    assert _failed(_check(_rd(outputs={"r0": [1, 2, 9], "r1": [4, 5]}), base)) == [
        "tokens equal bcg-off"
    ]
    assert _failed(_check(_rd(), None)) == ["tokens equal the off phase"]
    mixed = _without("replay_read_done", "replays_published.mixed")
    assert _failed(_check(_rd(mixed), base)) == ["read-done published for replayed MIXED steps"]
    extend = _without("replay_read_done", "replays_published.extend")
    assert _failed(_check(_rd(extend), base)) == ["read-done published for replayed EXTEND steps"]
    # Without replayed EXTEND steps nothing is asked of the EXTEND publications.
    assert _failed(_check(_rd(extend, steps=_steps(0, 5)), base)) == []
    unmarked = _without("war_snapshot_check", "forwards_marked")
    assert _failed(_check(_rd(unmarked), base)) == [
        "the WAR snapshot check saw read-done published"
    ]


def test_read_done_fails_on_a_violation_or_a_fallback_and_names_the_reasons():
    base = _rec("bcg-off", "off", steps=RD_STEPS)
    violated = dict(RD_EVENTS, war_snapshot_check={"forwards_marked": 9, "violations": 1})
    assert _failed(_check(_rd(violated), base)) == [
        "no shared-table read after read-done (WarSnapshotViolation)"
    ]
    # The violation raises in the scheduler: a phase it ended still reports it.
    died = _check(_rd(violated, ran=False), base)
    assert _failed(died) == [
        "ran to the end",
        "no shared-table read after read-done (WarSnapshotViolation)",
    ]
    fell_back = _check(
        _rd(patch_fallbacks={"replay_read_done": {"late_tail": 3, "not_published": 1}}), base
    )
    assert _failed(fell_back) == ["no replay_read_done fallback"]
    assert _detail(fell_back, "no replay_read_done fallback") == "late_tail: 3, not_published: 1"


def test_read_done_split_phase_is_checked_as_split_phase_and_as_read_done():
    base = _rec("bcg-off", "off", steps=RD_STEPS)
    rd_always = dict(patches=RD_EVENTS, steps=RD_STEPS, read_done=True)
    ok = _rec("bcg-always-rd", "always", events=REPLAYS, **rd_always)
    assert _failed(_check(ok, base)) == []
    unsplit = _rec("bcg-always-rd", "always", events=dict(REPLAYS, replays_split=0), **rd_always)
    assert _failed(_check(unsplit, base)) == ["split acted in every replayed MIXED step"]


def test_the_read_done_patches_must_be_inactive_outside_rd_phases():
    name = "replay_read_done and war_snapshot_check inactive (flags off)"
    base = _rec("bcg-off", "off", steps=RD_STEPS, patches={"war_snapshot_check": {"x": 1}})
    assert _failed(_check(base, None)) == [name]
    fell_back = _rec(
        "bcg-always",
        "always",
        steps=_steps(0, 5),
        events=REPLAYS,
        patch_fallbacks={"replay_read_done": {"late_tail": 1}},
    )
    assert _failed(_check(fell_back, _rec("bcg-off", "off", steps=_steps(0, 5)))) == [name]


def test_summary_shows_the_read_done_counters():
    lines = C.summarize(_rd(patches=dict(RD_EVENTS, other_patch={"n": 1})))
    assert "war_snapshot_check counters: {'forwards_marked': 9}" in lines
    assert any(
        line.startswith("replay_read_done counters: {") and "caches_prebuilt" in line
        for line in lines
    )
    assert "other patches: {'other_patch': {'n': 1}}" in lines


def test_replayed_mixed_steps_must_split_and_stubs_fail_a_phase():
    base = _rec("bcg-off", "off", steps=_steps(0, 5))
    assert (
        _failed(_check(_rec("bcg-always", "always", steps=_steps(0, 5), events=REPLAYS), base))
        == []
    )
    partly = dict(REPLAYS, replays_split=2)
    assert _failed(
        _check(_rec("bcg-always", "always", steps=_steps(0, 5), events=partly), base)
    ) == ["split acted in every replayed MIXED step"]
    at_import = "cutlass.cute.jit (pid 1) from utils.py:331 < <frozen importlib._bootstrap>:488"
    serving = "sgl_kernel.x (pid 1) from layernorm.py:631 < deepseek_v4.py:900"
    stubbed = _rec(
        "bcg-always", "always", steps=_steps(0, 5), events=REPLAYS, stubs=[at_import, serving]
    )
    assert _failed(_check(stubbed, base)) == ["no stub was called while serving"]
    assert C.split_stub_calls([at_import, serving]) == ([serving], [at_import])
    only_import = _rec(
        "bcg-always", "always", steps=_steps(0, 5), events=REPLAYS, stubs=[at_import]
    )
    assert _failed(_check(only_import, base)) == []


def test_a_baseline_without_mixed_steps_or_with_split_activity_fails():
    assert _failed(_check(_rec("eager-off", "off", steps=_steps(0)), None)) == [
        "the workload made MIXED steps"
    ]
    assert _failed(
        _check(_rec("eager-off", "off", steps=_steps(2), events={"steps_split": 1}), None)
    ) == ["mixed_split inactive (flag off)"]


def test_missing_tokens_and_a_failed_run_are_failed_checks():
    short = _rec("eager-off", "off", steps=_steps(1), outputs={"r0": [1, 2], "r1": [4, 5]})
    assert _failed(_check(short, None)) == ["every request got all its tokens"]
    died = C.PhaseRecord(name="eager-always", split="always", ran=False, error="boom")
    assert _failed(_check(died, None)) == ["ran to the end"]


# ---- the step log ----------------------------------------------------------------------------


class _Mode:
    def __init__(self, name):
        self.name = name


def cpu_step_log(monkeypatch, tmp_path) -> None:
    """The step log on a CPU: lines written under `tmp_path`, no device to synchronize and no
    graph being captured."""
    import torch

    monkeypatch.setenv("MIXGRAPH_E2E_STEP_LOG", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)


def _batch(mode, **kw):
    import torch

    from sglang_mixgraph.upstream_attrs import FORWARD_BATCH_NUM_DECODE

    fields = dict(
        forward_mode=_Mode(mode),
        input_ids=torch.zeros(259, dtype=torch.long),
        batch_size=4,
        seq_lens_cpu=torch.tensor([700, 300, 51, 90]),
        extend_seq_lens_cpu=[256, 1, 1, 1],
    )
    fields.update(kw)
    batch = SimpleNamespace(**fields)
    setattr(batch, FORWARD_BATCH_NUM_DECODE, 3)
    return batch


def test_step_log_records_the_split_inputs_of_mixed_steps_at_entry(tmp_path, monkeypatch):
    cpu_step_log(monkeypatch, tmp_path)

    class ModelRunner:
        def forward(self, forward_batch):
            # As EagerRunner does: the MIXED batch runs relabelled as EXTEND.
            forward_batch.forward_mode = _Mode("EXTEND")
            forward_batch.extend_seq_lens_cpu = [259]
            return SimpleNamespace(can_run_graph=False)

    L._wrap_forward(SimpleNamespace(ModelRunner=ModelRunner))
    runner = ModelRunner()
    runner.forward(_batch("MIXED"))
    runner.forward(_batch("DECODE", extend_seq_lens_cpu=None))
    no_split = _batch("MIXED")
    delattr(no_split, "_mixgraph_num_decode")
    runner.forward(no_split)
    (log,) = tmp_path.glob("steps_*.jsonl")
    mixed, decode, unsplit = [json.loads(line) for line in log.read_text().splitlines()]
    assert {k: mixed[k] for k in ("mode", "bs", "rows", "graph")} == {
        "mode": "MIXED",
        "bs": 4,
        "rows": 259,
        "graph": False,
    }
    assert (mixed["seq_lens"], mixed["extend_seq_lens"], mixed["num_decode"]) == (
        [700, 300, 51, 90],
        [256, 1, 1, 1],
        3,
    )
    assert "seq_lens" not in decode and "num_decode" not in decode
    assert unsplit["num_decode"] is None and POLICY.splits(unsplit) is None
    assert POLICY.splits(mixed) is False  # what the checks run on it


# ---- the driver, with a stand-in phase process -------------------------------------------------

FAKE_PHASE = """
import json, os, sys
kwargs, out = sys.argv[1], sys.argv[2]
split = os.environ["SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN"] == "1"
adaptive = split and os.environ.get("SGLANG_MIXGRAPH_SPLIT_POLICY") == "adaptive"
read_done = os.environ["SGLANG_OPT_DSV4_REPLAY_READ_DONE"] == "1"
radix_serializes = os.environ.get("FAKE_RADIX_SERIALIZES") == "1" and "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND" in os.environ
acts = os.environ.get("FAKE_SPLIT_ACTS") == "1"
graph = json.load(open(kwargs)).get("cuda_graph_backend_prefill") == "breakable"
# A short-segment shape (the cost model keeps it unsplit); the decode count is the split's record.
shape = {"seq_lens": [900, 41], "extend_seq_lens": [256, 1], "num_decode": 1 if split else None}
steps = [dict(shape, mode="EXTEND" if radix_serializes else "MIXED", bs=2, rows=257, graph=graph, ms=2.0)] * 2
steps += [{"mode": "DECODE", "bs": 3, "rows": 3, "graph": True, "ms": 1.0}]
with open(os.path.join(os.environ["MIXGRAPH_E2E_STEP_LOG"], "steps_1.jsonl"), "w") as f:
    f.writelines(json.dumps(s) + "\\n" for s in steps)
events = {}
if adaptive:
    events = {"replays_seen": 2, "replays_unsplit_adaptive": 2} if graph else {
        "steps_seen.mixed_run_as_extend": 2, "steps_unsplit_adaptive": 2}
elif split and graph and acts:
    events = {"replays_seen": 2, "replays_split": 2, "layers_split.c0": 2, "layers_split.c4": 4,
              "layers_split.c128": 2}
elif split and graph:
    events = {"replays_seen": 2}
elif split and acts:
    events = {"steps_seen.mixed_run_as_extend": 2, "steps_split": 2, "layers_split.c0": 2,
              "layers_split.c4": 4, "layers_split.c128": 2}
elif split:
    events = {"steps_seen.mixed_run_as_extend": 2}
patches = {"mixed_split": events} if events else {}
if read_done:
    patches["replay_read_done"] = {"replays_published.mixed": 2 if graph else 0}
    patches["war_snapshot_check"] = {"forwards_marked": 2}
if patches:
    snap = {"pid": 7, "events": patches, "fallbacks": {}}
    print("[x] sglang-mixgraph counters " + json.dumps(snap))
print("[gpu-upstream] stand-in first use: sgl_kernel.rmsnorm -> torch (pid 7)")
if graph:
    print("[t] Capture target prefill CUDA graph end. elapsed=1.0 s, mem usage=0.50 GB, avail mem=9 GB.")
json.dump({"ok": True, "outputs": {"r0": [1, 2]}, "expected_lens": {"r0": 2}, "timings": {}}, open(out, "w"))
"""


def _run_driver(tmp_path, monkeypatch, acts, radix_serializes=False, radix=None):
    import run_e2e

    fake = tmp_path / "fake_phase.py"
    fake.write_text(FAKE_PHASE)
    # The driver's cost model: what the GPU's coefficients are asked for, the synthetic answer.
    asked = []
    monkeypatch.setattr(scm, "load_coefficients", lambda arch: asked.append(arch) or POLICY.coeffs)
    monkeypatch.setattr(run_e2e, "PHASE_SCRIPT", str(fake))
    monkeypatch.setenv("FAKE_SPLIT_ACTS", "1" if acts else "0")
    monkeypatch.setenv("FAKE_RADIX_SERIALIZES", "1" if radix_serializes else "0")
    out = tmp_path / "out"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "run_e2e.py",
            "eager-off",
            "eager-always",
            "eager-adaptive",
            "bcg-off",
            "bcg-always",
            "bcg-off-rd",
            "bcg-always-rd",
            "--out",
            str(out),
            "--work",
            str(tmp_path / "work"),
            "--budget-s",
            "120",
            *(["--radix", radix] if radix else []),
        ],
    )
    rc = run_e2e.main()
    assert asked == ["sm90"]
    return (
        rc,
        json.loads((out / "e2e_results.json").read_text()),
        (out / "e2e_tiny_dsv4.log").read_text(),
    )


def test_driver_reports_phases_and_exits_zero_when_every_check_holds(tmp_path, monkeypatch):
    rc, report, log = _run_driver(tmp_path, monkeypatch, acts=True)
    assert rc == 0 and report["checks_failed"] == 0 and report["radix_cache"] is True
    eager = report["phases"]["eager-always"]
    assert eager["steps_by_mode"] == {"DECODE/graph": 1, "MIXED/eager": 2}
    assert eager["counters"]["events"]["mixed_split"]["steps_split"] == 2
    assert eager["standins"] == ["sgl_kernel.rmsnorm -> torch"]
    assert report["phases"]["bcg-always"]["counters"]["events"]["mixed_split"]["replays_split"] == 2
    assert "[ok] split acted in every eager MIXED step: split 2 of 2" in log
    # adaptive: the cost model run on the logged shapes, which it keeps unsplit
    assert (
        "[ok] adaptive split the eager MIXED steps the cost model splits: the cost model keeps "
        "all 2 eager MIXED steps unsplit at these shapes" in log
    )
    # the read-done phase: the flags reached it (its counters), compared with bcg-off, after it
    rd = report["phases"]["bcg-always-rd"]
    assert rd["counters"]["events"]["war_snapshot_check"] == {"forwards_marked": 2}
    assert {c["name"] for c in rd["checks"] if c["ok"]} >= {
        "tokens equal bcg-off",
        "read-done published for replayed MIXED steps",
        "split acted in every replayed MIXED step",
    }
    assert "replay_read_done counters: {'replays_published.mixed': 2}" in log
    # The default: the radix cache on in every phase, all phases in one wave.
    assert "radix cache ON (--radix on)" in log
    assert [c["name"] for c in report["phases"]["bcg-off-rd"]["checks"] if not c["ok"]] == []
    assert (tmp_path / "out" / "phase_logs.tgz").exists()
    # SGLang's capture line, per phase: only the breakable phases capture a prefill graph
    assert report["phases"]["bcg-off"]["capture_mem_gb"] == {"prefill": 0.5}
    assert eager["capture_mem_gb"] == {} and report["phases"]["bcg-off"]["capture_alone"] is False
    assert "graph capture memory, SGLang's log (other phases beside it): {'prefill': 0.5} GB" in log


def test_capture_memory_sums_each_kind_over_the_logs_schedulers():
    import run_e2e

    log = "\n".join(
        [
            "[a] Capture target prefill CUDA graph begin. backend=breakable, avail mem=70.80 GB",
            "[a] Capture target prefill CUDA graph end. elapsed=4.88 s, mem usage=7.37 GB, x",
            "[b] Capture target prefill CUDA graph end. elapsed=4.10 s, mem usage=1.03 GB, x",
            "[a] Capture target decode CUDA graph end. bs=[1, 2], elapsed=2.89 s, mem usage=-2.61 GB",
        ]
    )
    assert run_e2e.capture_memory(log) == {"prefill": 8.4, "decode": -2.61}
    assert run_e2e.capture_memory("no capture here") == {}


def test_auto_radix_runs_the_baselines_first(tmp_path, monkeypatch):
    rc, report, log = _run_driver(tmp_path, monkeypatch, acts=True, radix="auto")
    assert rc == 0 and report["radix_cache"] is True
    assert "radix cache ON (SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python) for every phase" in log
    # Read-done phases run after the baselines' wave (whose outcome sets the radix cache).
    assert log.index("== bcg-off: ok") < log.index("== bcg-off-rd: started")
    assert log.index("== bcg-off: ok") < log.index("== bcg-always-rd: started")


def test_driver_exits_nonzero_when_the_split_never_acted(tmp_path, monkeypatch):
    rc, report, log = _run_driver(tmp_path, monkeypatch, acts=False)
    # eager, replayed and replayed with read-done: the split did not act, no layer split
    assert rc == 1 and report["checks_failed"] == 6
    assert "FAILED eager-always: split acted in every eager MIXED step: split 0 of 2" in log
    assert "FAILED bcg-always: split acted in every replayed MIXED step: split 0 of 2" in log
    assert "FAILED bcg-always-rd: split acted in every replayed MIXED step: split 0 of 2" in log


# ---- the Engine-only stand-ins (tools/gpu-upstream/engine) -------------------------------------

ENGINE = gpu_machine.ENGINE_DIR
SHIM = ENGINE.parent / "shim"


@pytest.fixture
def standins(monkeypatch):
    monkeypatch.syspath_prepend(str(SHIM))
    monkeypatch.syspath_prepend(str(ENGINE))
    import engine_standins

    return engine_standins


def test_rmsnorm_standin_equals_upstream_native_rmsnorm(standins, capsys):
    import torch
    from sglang.srt.layers.layernorm import RMSNorm

    torch.manual_seed(0)
    norm = RMSNorm(64, eps=1e-6).to(torch.bfloat16)
    norm.weight.data.uniform_(0.5, 1.5)
    x = torch.randn(5, 64, dtype=torch.bfloat16) * 3
    expected = norm.forward_native(x.clone())
    torch.testing.assert_close(
        standins.rmsnorm(x, norm.weight.data, 1e-6), expected, atol=2e-2, rtol=2e-2
    )
    out = torch.empty_like(x)
    assert standins.rmsnorm(x, norm.weight.data, 1e-6, out=out) is out
    assert (
        capsys.readouterr().err.count(standins.STANDIN_MARK + "sgl_kernel.rmsnorm") == 1
    )  # first use only


def test_moe_sum_reduce_standin_sums_topk_and_scales(standins):
    import torch

    x = torch.randn(3, 2, 8, dtype=torch.bfloat16)
    out = torch.empty(3, 8, dtype=torch.bfloat16)
    standins.moe_sum_reduce(x, out, 1.5)
    torch.testing.assert_close(out, (x.float().sum(1) * 1.5).to(torch.bfloat16))


def _fp8_blocks(w, block=128):
    """`w` (N, K) as e4m3 with one scale per 128 x 128 block, as an FP8 checkpoint stores it."""
    import torch

    n, k = w.shape
    blocks = w.float().view(n // block, block, k // block, block)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-10) / 448
    q = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn).view(n, k)
    return q, scale


def _group_quant(x, group, column_major_scales, output_q=None, output_s=None):
    """SGLang's activation quant on the CPU: e4m3 per 128 columns, scales column-major, written
    into the caller's buffers when given (as ``sglang_per_token_group_quant_fp8`` does)."""
    import torch

    assert column_major_scales
    m, k = x.shape
    g = x.float().view(m, k // group, group)
    scale = g.abs().amax(-1).clamp(min=1e-10) / 448
    q = (g / scale[..., None]).to(torch.float8_e4m3fn).view(m, k)
    if output_q is None:
        return q, scale.t().contiguous().t()
    assert output_q.shape == (m, k) and output_s.shape == (m, k // group)
    output_q.copy_(q)
    output_s.copy_(scale)
    return output_q, output_s


class _BlockScaledMM:
    """What cuBLAS's block-scaled GEMM computes, checking the layout it is given."""

    def __init__(self):
        self.calls = []

    def __call__(self, a, b, scale_a, recipe_a, scale_b, recipe_b, output_dtype):
        import torch.nn.functional as F

        self.calls.append((a.shape, scale_a.stride(), scale_b.shape))
        assert (recipe_a, recipe_b) == (
            F.ScalingType.BlockWise1x128,
            F.ScalingType.BlockWise128x128,
        )
        # torch: 1x128 scales (M, K/128) with strides (1, M); cuBLAS: that stride 16-byte aligned
        assert scale_a.shape == (a.shape[0], a.shape[1] // 128)
        assert scale_a.stride() == (1, a.shape[0]) and a.shape[0] % 4 == 0
        m, k = a.shape
        a_deq = (a.float().view(m, k // 128, 128) * scale_a[..., None]).view(m, k)
        b_deq = b.float() * scale_b.repeat_interleave(128, 0).repeat_interleave(128, 1)
        return (a_deq @ b_deq).to(output_dtype)


def test_block_fp8_linear_on_torch_scaled_mm_computes_the_linear(standins, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(standins, "_torch_fp8_refused", [])
    monkeypatch.setattr(standins, "_announced", set())

    torch.manual_seed(0)
    w = torch.randn(256, 512, dtype=torch.bfloat16) * 0.05
    q, scale = _fp8_blocks(w)
    x = torch.randn(2, 3, 512, dtype=torch.bfloat16)  # 6 rows: padded to 8 for cuBLAS
    bias = torch.randn(256, dtype=torch.bfloat16)
    mm = _BlockScaledMM()
    out = standins.torch_block_fp8_linear(
        x, q, [128, 128], scale, bias=bias, fallback=None, scaled_mm=mm, quant=_group_quant
    )
    assert out.shape == (2, 3, 256) and out.dtype == torch.bfloat16
    assert mm.calls == [((8, 512), (1, 8), (4, 2))]  # the weight's scales transposed with it
    w_deq = q.float() * scale.repeat_interleave(128, 0).repeat_interleave(128, 1)
    want = x.float() @ w_deq.t() + bias.float()
    err = (out.float() - want).norm() / want.norm()
    assert err < 0.05, err  # e4m3 activations against bf16
    assert "block-FP8 linear -> torch scaled_mm" in capsys.readouterr().err


@pytest.mark.parametrize("rows", [1, 6, 8, 2791])
def test_padded_fp8_quant_equals_quantizing_the_padded_activation(standins, rows):
    """The live rows are what quantizing the zero-padded bf16 activation gave (the earlier
    stand-in), in the same layout; only the tail rows are set, to zero."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(rows)
    x = torch.randn(rows, 512, dtype=torch.bfloat16) * 4
    q, scale = standins.padded_fp8_quant(x, _group_quant)
    padded = -(-rows // 4) * 4
    assert q.shape == (padded, 512) and q.dtype == torch.float8_e4m3fn and q.is_contiguous()
    assert scale.shape == (padded, 4) and scale.stride() == (1, padded)
    q_ref, scale_ref = _group_quant(F.pad(x, (0, 0, 0, padded - rows)), 128, True)
    assert torch.equal(q[:rows].view(torch.uint8), q_ref[:rows].view(torch.uint8))
    assert torch.equal(scale[:rows], scale_ref[:rows])
    assert not q[rows:].view(torch.uint8).any() and not scale[rows:].any()


def test_block_fp8_linear_live_rows_equal_the_padded_activations(standins, monkeypatch):
    """Through the reference block-scaled GEMM, the linear's rows equal those of the earlier
    stand-in's (the bf16 activation padded, then quantized) bit for bit."""
    import torch
    import torch.nn.functional as F

    monkeypatch.setattr(standins, "_torch_fp8_refused", [])
    torch.manual_seed(1)
    q_w, scale_w = _fp8_blocks(torch.randn(256, 512) * 0.05)
    x = torch.randn(7, 512, dtype=torch.bfloat16)
    mm = _BlockScaledMM()
    out = standins.torch_block_fp8_linear(
        x, q_w, [128, 128], scale_w, fallback=None, scaled_mm=mm, quant=_group_quant
    )
    q, scale = _group_quant(F.pad(x, (0, 0, 0, 1)), 128, True)
    want = mm(
        q,
        q_w.t(),
        scale,
        F.ScalingType.BlockWise1x128,
        scale_w.t(),
        F.ScalingType.BlockWise128x128,
        output_dtype=torch.bfloat16,
    )[:7]
    assert torch.equal(out, want)


def test_block_fp8_linear_leaves_what_it_does_not_handle_to_sglangs_choice(standins, monkeypatch):
    import torch

    monkeypatch.setattr(standins, "_torch_fp8_refused", [])
    calls = []

    def fallback(**kw):
        calls.append(kw)
        return "upstream"

    q, scale = _fp8_blocks(torch.randn(256, 512))
    x = torch.randn(4, 512, dtype=torch.bfloat16)
    args = dict(fallback=fallback, quant=_group_quant, scaled_mm=_BlockScaledMM())
    # a pre-quantized input, another block size, K blocks not a multiple of 4
    assert (
        standins.torch_block_fp8_linear(x, q, [128, 128], scale, input_scale=scale, **args)
        == "upstream"
    )
    assert standins.torch_block_fp8_linear(x, q, [1, 128], scale, **args) == "upstream"
    q3, scale3 = _fp8_blocks(torch.randn(256, 384))
    x3 = torch.randn(4, 384, dtype=torch.bfloat16)
    assert standins.torch_block_fp8_linear(x3, q3, [128, 128], scale3, **args) == "upstream"
    assert len(calls) == 3 and calls[0]["input_scale"] is scale

    def refusing(*a, **k):
        raise RuntimeError("scale_a must be outer-dim-major")

    args["scaled_mm"] = refusing
    assert standins.torch_block_fp8_linear(x, q, [128, 128], scale, **args) == "upstream"
    args["scaled_mm"] = _BlockScaledMM()  # once refused, SGLang's choice for good
    assert standins.torch_block_fp8_linear(x, q, [128, 128], scale, **args) == "upstream"
    assert len(calls) == 5


def test_block_fp8_dispatch_routes_128_blocks_only(standins):
    from types import SimpleNamespace

    def choose(weight_block_size=None, act_scale_ue8m0=False):
        return ("triton", tuple(weight_block_size or ()), act_scale_ue8m0)

    fp8 = SimpleNamespace(dispatch_w8a8_block_fp8_linear=choose)
    standins._block_fp8_on_torch(fp8)
    routed = fp8.dispatch_w8a8_block_fp8_linear(weight_block_size=[128, 128])
    assert routed.func is standins.torch_block_fp8_linear
    assert routed.keywords["fallback"] == ("triton", (128, 128), False)
    assert fp8.dispatch_w8a8_block_fp8_linear(weight_block_size=[32, 32])[0] == "triton"
    ue8m0 = fp8.dispatch_w8a8_block_fp8_linear(weight_block_size=[128, 128], act_scale_ue8m0=True)
    assert ue8m0 == ("triton", (128, 128), True)


def test_stub_calls_are_loud_and_still_raise(standins, capsys):
    import stubs

    standins._make_stub_calls_loud(stubs)
    with pytest.raises(stubs.StubCalled):
        stubs._stub_class("sgl_kernel.some_kernel")(1)
    assert standins.STUB_MARK + "sgl_kernel.some_kernel" in capsys.readouterr().err


def test_short_workload_is_the_full_one_without_the_long_segment():
    full, short = W.build(), W.build(workload="short")
    assert [s.name for s in short] == ["batch", "staggered"] and short == full[:2]
    with pytest.raises(ValueError, match="workload"):
        W.build(workload="tiny")


def test_driver_turns_the_radix_cache_off_when_it_leaves_no_mixed_step(tmp_path, monkeypatch):
    rc, report, log = _run_driver(
        tmp_path, monkeypatch, acts=True, radix_serializes=True, radix="auto"
    )
    assert "radix cache (SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python) OFF for this run" in log
    assert "made no MIXED step" in log
    assert rc == 0 and report["radix_cache"] is False
    assert report["phases"]["eager-off"]["steps_by_mode"]["MIXED/eager"] == 2


# ---- the drop-empty-segments phases ----------------------------------------------------------


def test_drop_empty_phase_name_env_and_baseline():
    assert P.parse(["bcg-off-des"]) == [P.Phase("bcg", "off", drop_empty=True)]
    assert P.parse(["bcg-always-rd-des"]) == [P.Phase("bcg", "always", True, True)]
    phase = P.Phase("bcg", "off", drop_empty=True)
    assert phase.name == "bcg-off-des" and phase.baseline == "bcg-off" and not phase.is_baseline
    env = phase.env({"SGLANG_OPT_BCG_DROP_EMPTY_SEGMENTS": "0"}, radix=False)
    assert env["SGLANG_OPT_BCG_DROP_EMPTY_SEGMENTS"] == "1"
    with pytest.raises(ValueError, match="-des"):
        P.parse(["bcg-off-dse"])


def _variant(suffix, patch, events, fallbacks=None, **kw):
    """A ``bcg-off<suffix>`` phase record whose one extra patch counted ``events``."""
    return _rec(
        f"bcg-off{suffix}",
        "off",
        steps=RD_STEPS,
        patches={patch: events},
        patch_fallbacks={patch: fallbacks} if fallbacks else None,
        **kw,
    )


def _des(events, fallbacks=None, **kw):
    return _variant("-des", "drop_empty_segments", events, fallbacks, drop_empty=True, **kw)


@pytest.mark.parametrize(
    "events, fallbacks, ok",
    [
        ({"captures_checked": 12}, None, True),  # no empty segment anywhere: information
        ({"captures_checked": 12, "segments_dropped": 4, "launches_skipped": 40}, None, True),
        ({}, None, False),  # the patch never looked at a capture
        ({"captures_checked": 12, "segments_dropped": 4}, None, False),  # dropped, never skipped
        ({"captures_checked": 12}, {"no_node_count": 1}, False),
    ],
)
def test_drop_empty_phase_checks_every_capture_was_examined(events, fallbacks, ok):
    base = _rec("bcg-off", "off", steps=RD_STEPS)
    checks = _check(_des(events, fallbacks), base)
    name = "drop_empty_segments examined every capture"
    assert (name in _failed(checks)) is not ok
    assert "tokens equal bcg-off" in [c.name for c in checks]
    assert _detail(checks, name).startswith(f"{events.get('captures_checked', 0)} captures checked")


# ---- the live-width indexer phases -----------------------------------------------------------


def test_live_width_phase_name_env_and_baseline():
    assert P.parse(["bcg-off-lw"]) == [P.Phase("bcg", "off", live_width=True)]
    assert P.parse(["bcg-always-rd-lw"]) == [P.Phase("bcg", "always", True, live_width=True)]
    phase = P.Phase("bcg", "always", live_width=True)
    assert phase.name == "bcg-always-lw" and phase.baseline == "bcg-off"
    assert not phase.is_baseline
    env = phase.env({"SGLANG_OPT_DSV4_BCG_LIVE_WIDTH_INDEXER": "0"}, radix=False)
    assert env["SGLANG_OPT_DSV4_BCG_LIVE_WIDTH_INDEXER"] == "1"
    assert env["SGLANG_OPT_USE_MULTI_STREAM_OVERLAP"] == "0"  # the indexer on the main stream
    assert not C.PhaseRecord("bcg-off-lw", "off", True, live_width=True).is_baseline


@pytest.mark.parametrize(
    "events, fallbacks, ok",
    [
        ({"layers_wrapped": 4, "breaks_run": 90, "breaks_narrowed": 80}, None, True),
        ({}, None, False),  # the patch never acted
        ({"layers_wrapped": 4}, None, False),  # captured as breaks, never run at replay
        ({"layers_wrapped": 4, "breaks_run": 90}, None, False),  # ran, never narrowed
        ({"layers_wrapped": 4, "breaks_run": 1, "breaks_narrowed": 1}, None, False),  # too few
        (
            {"layers_wrapped": 4, "breaks_run": 90, "breaks_narrowed": 80},
            {"multi_stream": 1},
            False,
        ),
        (  # the long segment's steps keep the capture width by design
            {"layers_wrapped": 4, "breaks_run": 90, "breaks_narrowed": 40},
            {"long_rows": 50},
            True,
        ),
        (
            {"layers_wrapped": 4, "breaks_run": 90, "breaks_narrowed": 40},
            {"long_rows": 50, "replay_tail": 1},
            False,
        ),
    ],
)
def test_live_width_phase_checks_the_breaks_ran_narrowed_in_replays(events, fallbacks, ok):
    base = _rec("bcg-off", "off", steps=RD_STEPS)
    rec = _variant("-lw", "live_width_indexer", events, fallbacks, live_width=True)
    checks = _check(rec, base)
    name = "live_width_indexer ran the c4 indexer at the live width in replays"
    assert (name in _failed(checks)) is not ok
    assert "tokens equal bcg-off" in [c.name for c in checks]


def test_every_variant_combination_parses_back_to_its_name_and_env():
    import itertools

    for spec, graph, split in itertools.product((False, True), P.GRAPHS, P.SPLITS):
        # The speculative phases take -tail (with the split on, without -online), -noovl and
        # -online, the others the rest.
        variants = [v for v in P.VARIANTS if v.spec == spec]
        for on in itertools.product((False, True), repeat=len(variants)):
            names = [v.suffix for v, b in zip(variants, on, strict=True) if b]
            name = (P.SPEC_PREFIX if spec else "") + f"{graph}-{split}" + "".join(names)
            if "-tail" in names and (split == "off" or "-online" in names):
                with pytest.raises(ValueError, match="-tail"):
                    P.parse([name])
                continue
            (phase,) = P.parse([name])
            assert phase.name == name
            env = phase.env({}, radix=False)
            kwargs = phase.engine_kwargs("/m", radix=False, slot=0)
            for v, b in zip(variants, on, strict=True):
                settings = [env.get(k) == val for k, val in v.env.items()]
                settings += [kwargs.get(k) == val for k, val in v.engine.items()]
                assert settings and all(settings) == b, (name, v.suffix)
    with pytest.raises(ValueError, match=r"\[-rd\]\[-des\]\[-lw\]"):
        P.parse(["bcg-always-lw-rd"])  # suffixes in their one order


# ---- the lean phases (wo_a_in_break + compress_plan_cap) -------------------------------------

WO_A, CAP = "wo_a_in_break", "compress_plan_cap"
WO_A_LINE = "wo_a_in_break ran attention, inverse RoPE and wo_a in one break per layer"
CAP_LINE = "compress_plan_cap checked every replayed batch against the capped plans"
LEAN_IDLE = "wo_a_in_break and compress_plan_cap inactive without a breakable prefill graph"
# RD_STEPS replays 5 MIXED and 2 EXTEND steps; POLICY's model has 4 layers. Twelve captures of
# four layers each, every break run once at capture and once per layer in each of the 7 replays.
LEAN_ACTING = {
    WO_A: {"breaks_deferred": 48, "layers_through_wo_a": 48, "breaks_run": 48 + 4 * 7},
    CAP: {"plans_capped.c4": 24, "plans_capped.c128": 12, "batches_checked": 7},
}


def test_lean_phase_name_env_and_baseline():
    from sglang_mixgraph.patches import compress_plan_cap, wo_a_in_break

    (phase,) = P.parse(["bcg-always-lean"])
    assert phase == P.Phase("bcg", "always", lean=True)
    assert phase.name == "bcg-always-lean" and phase.baseline == "bcg-off"
    assert not phase.is_baseline
    assert [
        p.name for p in P.parse(["bcg-always-lean", "bcg-off-lean", "bcg-always", "bcg-off"])
    ] == [
        "bcg-off",
        "bcg-off-lean",
        "bcg-always",
        "bcg-always-lean",
    ]
    flags = (wo_a_in_break.FLAG.name, compress_plan_cap.FLAG.name)
    offs = dict.fromkeys(flags, "0") | {P.SPLIT_FLAG: "0"}
    plain = P.Phase("bcg", "always").env(offs, radix=False)
    lean = phase.env(offs, radix=False)
    assert {k: lean[k] for k in lean if plain.get(k) != lean[k]} == dict.fromkeys(flags, "1")
    assert phase.engine_kwargs("/m", radix=False, slot=0) == P.Phase("bcg", "always").engine_kwargs(
        "/m", radix=False, slot=0
    )
    assert not C.PhaseRecord("bcg-off-lean", "off", True, lean=True).is_baseline
    # The speculative phases take -tail and -noovl only (their checks assume no other patch).
    with pytest.raises(ValueError, match="a speculative phase takes no -lean"):
        P.parse(["spec-bcg-always-lean"])
    with pytest.raises(ValueError, match=r"\[-lw\]\[-lean\]"):
        P.parse(["bcg-always-lean-lw"])  # -lean after -lw


def _lean_rec(graph="bcg", split="off", *, patches=LEAN_ACTING, fallbacks=None, **kw):
    """A ``<graph>-<split>-lean`` record; bcg replays RD_STEPS, the others run them eagerly."""
    steps = RD_STEPS if graph == "bcg" else _steps(5, 0)
    rec = _rec(
        f"{graph}-{split}-lean",
        split,
        steps=steps,
        patches=patches,
        patch_fallbacks=fallbacks,
        **kw,
    )
    return replace(rec, graph=graph, lean=True)


def _with(patch, **counts):
    return dict(LEAN_ACTING, **{patch: dict(LEAN_ACTING[patch], **counts)})


def test_lean_bcg_phase_passes_with_both_patches_acting():
    base = _rec("bcg-off", "off", steps=RD_STEPS)
    checks = _check(_lean_rec(), base)
    assert _failed(checks) == []
    names = [c.name for c in checks]
    assert WO_A_LINE in names and CAP_LINE in names and LEAN_IDLE not in names
    assert "tokens equal bcg-off" in names
    assert _detail(checks, WO_A_LINE) == (
        "layers_through_wo_a 48 (4 layers a capture), breaks_run 76 (at least 4 x 7 replayed "
        "prefill steps); fallbacks none"
    )
    # A plan left uncapped (online c128 compression) is listed, not failed: the rest is capped.
    online = _check(_lean_rec(fallbacks={CAP: {"online": 12}}), base)
    assert _failed(online) == [] and "other fallbacks online: 12" in _detail(online, CAP_LINE)
    # Plain phases carry no lean check.
    assert not {WO_A_LINE, CAP_LINE, LEAN_IDLE} & {c.name for c in _check(base, None)}


@pytest.mark.parametrize(
    "patches, fallbacks, failed, said",
    [
        ({}, None, [WO_A_LINE, CAP_LINE], "layers_through_wo_a 0"),  # neither patch acted
        (_with(WO_A, layers_through_wo_a=46), None, [WO_A_LINE], "layers_through_wo_a 46"),
        # fewer break runs than 4 layers x 7 replays: some replay never ran the break
        (_with(WO_A, breaks_run=27), None, [WO_A_LINE], "breaks_run 27 (at least 4 x 7"),
        (_with(WO_A, breaks_run=0), None, [WO_A_LINE], "breaks_run 0"),
        (LEAN_ACTING, {WO_A: {"wo_a_fp8": 4}}, [WO_A_LINE], "fallbacks wo_a_fp8: 4"),
        (LEAN_ACTING, {WO_A: {"call_site": 1}}, [WO_A_LINE], "fallbacks call_site: 1"),
        (_with(CAP, batches_checked=0), None, [CAP_LINE], "batches_checked 0 over 7"),
        (_with(CAP, batches_checked=5), None, [CAP_LINE], "batches_checked 5 over 7"),
        (LEAN_ACTING, {CAP: {"over_cap": 1}}, [CAP_LINE], "over_cap 1"),
    ],
)
def test_lean_bcg_phase_fails_where_a_patch_did_not_act_or_fell_back(
    patches, fallbacks, failed, said
):
    base = _rec("bcg-off", "off", steps=RD_STEPS)
    checks = _check(_lean_rec(patches=patches, fallbacks=fallbacks), base)
    assert _failed(checks) == failed
    assert said in _detail(checks, failed[0])


def test_lean_split_phase_is_checked_as_split_phase_as_lean_and_against_bcg_off():
    base = _rec("bcg-off", "off", steps=RD_STEPS)
    ok = _lean_rec(split="always", events=REPLAYS)
    assert _failed(_check(ok, base)) == []
    differs = _lean_rec(split="always", events=REPLAYS, outputs={"r0": [1, 2, 9], "r1": [4, 5]})
    assert _failed(_check(differs, base)) == ["tokens equal bcg-off"]
    unsplit = _lean_rec(split="always", events=dict(REPLAYS, replays_split=0))
    assert _failed(_check(unsplit, base)) == ["split acted in every replayed MIXED step"]


@pytest.mark.parametrize("graph", ["eager", "dgraph"])
def test_lean_phase_without_a_breakable_graph_fails_on_any_activity(graph):
    base = _rec(f"{graph}-off", "off", steps=_steps(5, 0))
    quiet = _check(_lean_rec(graph, patches={}), base)
    assert _failed(quiet) == [] and LEAN_IDLE in [c.name for c in quiet]
    assert not {WO_A_LINE, CAP_LINE} & {c.name for c in quiet}
    zeros = {WO_A: {"breaks_run": 0}, CAP: {"batches_checked": 0}}  # keys at 0 are no activity
    assert _failed(_check(_lean_rec(graph, patches=zeros), base)) == []
    checked = _check(_lean_rec(graph, patches={CAP: {"batches_checked": 3}}), base)
    assert _failed(checked) == [LEAN_IDLE]
    assert _detail(checked, LEAN_IDLE) == (
        "active: {'compress_plan_cap events': {'batches_checked': 3}}"
    )
    fell_back = _check(_lean_rec(graph, patches={}, fallbacks={WO_A: {"outside_layer": 4}}), base)
    assert _failed(fell_back) == [LEAN_IDLE]
    assert "wo_a_in_break fallbacks" in _detail(fell_back, LEAN_IDLE)


def test_the_driver_reads_a_lean_phase_counters_line_into_its_checks(tmp_path):
    import run_e2e

    from sglang_mixgraph import counters

    def collected(snap):
        phase = P.Phase("bcg", "off", lean=True)
        (tmp_path / "logs").mkdir(exist_ok=True)
        line = f"[2026-12-06 10:00:00] {counters.LOG_PREFIX}{json.dumps(snap)}"
        (tmp_path / "logs" / f"{phase.name}.log").write_text(line + "\n")
        steps = tmp_path / phase.name / "steps"
        steps.mkdir(parents=True, exist_ok=True)
        (steps / "steps_7.jsonl").write_text("".join(json.dumps(s) + "\n" for s in RD_STEPS))
        out = {"ok": True, "outputs": {"r0": [1, 2, 3]}, "expected_lens": {"r0": 3}}
        (tmp_path / phase.name / "out.json").write_text(json.dumps(out))
        args = (phase, str(tmp_path), str(tmp_path / "logs"), 1.0, False, "short")
        rec = run_e2e.collect(*args)["record"]
        assert rec.lean and rec.graph == "bcg" and not rec.is_baseline
        base = _rec("bcg-off", "off", steps=RD_STEPS, outputs={"r0": [1, 2, 3]})
        base.expected_lens = {"r0": 3}
        return C.check_phase(rec, base, POLICY)

    assert _failed(collected({"pid": 7, "events": LEAN_ACTING, "fallbacks": {}})) == []
    over = collected({"pid": 7, "events": LEAN_ACTING, "fallbacks": {CAP: {"over_cap": 2}}})
    assert _failed(over) == [CAP_LINE] and "over_cap 2" in _detail(over, CAP_LINE)
