"""The end-to-end harness's speculative phases on CPU: the model, the phase table, the checks.

The GPU run is ``run_e2e.py spec`` (EAGLE over the tiny model's one next-n layer). Here: the
config with the next-n layer and SGLang's resolution of the phases' arguments with it; the
phases' names, baselines, Engine arguments and environments; the checks fed synthetic records
(tokens, accept lengths, step logs with the draft's lines, the split's counters) on which they
must fail as well as pass; and the driver with a stand-in phase process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import e2e_checks as C
import e2e_phases as P
import pytest
from test_e2e_harness import POLICY, SHORT_SHAPE, _detail, _failed

from sglang_mixgraph.core import split_cost_model as scm

E2E = Path(__file__).resolve().parent
TINY = json.loads((E2E / P.CONFIG).read_text())
MTP = json.loads((E2E / P.MTP_CONFIG).read_text())
SPEC = P.parse(["spec"])


# ---- the model with one next-n layer ------------------------------------------------------------


def test_mtp_config_is_the_tiny_model_with_one_next_n_layer():
    assert {k for k in TINY.keys() | MTP.keys() if TINY.get(k) != MTP.get(k)} == {
        "num_nextn_predict_layers"
    }
    # Exactly one: DeepseekV4ForCausalLM.load_weights(is_nextn=True) asserts it, and
    # layer_setup._compute_model_num_layers sizes the draft's pool from it.
    assert MTP["num_nextn_predict_layers"] == 1 and TINY["num_nextn_predict_layers"] == 0
    # ModelConfig._config_draft_model turns this architecture into DeepseekV4ForCausalLMNextN,
    # unless the config bundles a DSpark head (dspark_config.checkpoint_bundles_dspark_draft).
    assert MTP["architectures"] == ["DeepseekV4ForCausalLM"]
    assert not [k for k in MTP if k.startswith("dspark_")]
    # One compress ratio past the target's layers, 0 as upstream's next-n layer has it
    # (deepseek_v4_nextn.COMPRESS_RATIO_NEXTN_LAYER); the split's cost model reads the target's.
    assert len(MTP["compress_ratios"]) == MTP["num_hidden_layers"] + 1
    assert MTP["compress_ratios"][-1] == 0
    assert C.AdaptivePolicy.for_model(MTP).layers == C.AdaptivePolicy.for_model(TINY).layers


def _argv(kwargs: dict) -> list[str]:
    """``sglang.Engine`` keyword arguments as ``launch_server`` flags (the same fields)."""
    argv = []
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not False:
            argv += [flag, str(value)]
    return argv


@pytest.mark.parametrize(
    "name", ["spec-eager-always", "spec-bcg-always", "spec-eager-always-noovl"]
)
def test_sglang_resolves_the_speculative_phase_with_the_next_n_model(tmp_path, name):
    from sglang_mixgraph.resolution.resolve import resolve

    (phase,) = P.parse([name])
    model = tmp_path / "model_mtp"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(MTP))
    kwargs = phase.engine_kwargs(str(model), radix=True, slot=0)
    got = resolve(_argv(kwargs), gpu="H200").resolved
    assert {k: got[k] for k in P.SPEC_KWARGS} == P.SPEC_KWARGS
    # SGLang loads the draft (the next-n layer) from the target's path, keeps mixed chunked
    # prefill under EAGLE and the phase's graphs, and runs the draft on the kit's kernels.
    assert got["speculative_draft_model_path"] == str(model)
    assert got["enable_mixed_chunk"] is True and got["chunked_prefill_size"] == P.CHUNK
    assert got["speculative_moe_runner_backend"] == "triton"
    assert got["speculative_dsa_topk_backend"] == got["dsa_topk_backend"] == "torch"
    # The overlap scheduler stays on under EAGLE unless the phase turns it off (-noovl).
    assert got["disable_overlap_schedule"] is phase.no_overlap
    if phase.graph == "bcg":
        assert got["cuda_graph_backend_prefill"] == "breakable"
    else:
        assert got["disable_cuda_graph"] is True


# ---- the phase table ---------------------------------------------------------------------------


def test_spec_names_the_eight_phases_with_the_eager_references_first():
    assert [p.name for p in SPEC] == [
        "spec-eager-off",
        "spec-eager-off-noovl",
        "spec-bcg-off",
        "spec-eager-always",
        "spec-eager-always-noovl",
        "spec-eager-always-tail",
        "spec-bcg-always",
        "spec-bcg-adaptive",
    ]
    # Each is read against the eager reference of its scheduler (overlap on or off).
    assert {p.name: p.baseline for p in SPEC if p.no_overlap} == {
        "spec-eager-off-noovl": "spec-eager-off-noovl",
        "spec-eager-always-noovl": "spec-eager-off-noovl",
    }
    assert all(p.spec and p.baseline == P.SPEC_REFERENCE for p in SPEC if not p.no_overlap)
    # The breakable split-off arm is under test, never a reference.
    assert [p.name for p in SPEC if p.is_baseline] == [P.SPEC_REFERENCE, "spec-eager-off-noovl"]
    assert all(P.parse([p.name]) == [p] for p in SPEC)
    # The split-off arm of a split phase's graph mode and scheduler.
    assert {p.name: p.upstream_arm for p in SPEC if p.split != "off"} == {
        "spec-eager-always": "spec-eager-off",
        "spec-eager-always-noovl": "spec-eager-off-noovl",
        "spec-eager-always-tail": "spec-eager-off",
        "spec-bcg-always": "spec-bcg-off",
        "spec-bcg-adaptive": "spec-bcg-off",
    }
    # Beside the non-speculative phases: their baselines first, then the speculative ones.
    mixed = P.parse(["spec-bcg-always", "bcg-always", "bcg-off", "spec-eager-off"])
    assert [p.name for p in mixed] == [
        "bcg-off",
        "spec-eager-off",
        "bcg-always",
        "spec-bcg-always",
    ]
    bad_names = (
        "spec-bcg-off-rd",
        "spec-eager-always-des",
        "spec-fast-off",
        "spec-",
        "bcg-always-tail",  # -tail and -noovl are speculative variants only
        "eager-off-noovl",
        "spec-eager-off-tail",  # tail graphs act in split layers only
        "spec-eager-always-noovl-tail",  # suffixes in VARIANTS order
    )
    for bad in bad_names:
        with pytest.raises(ValueError, match="unknown phase"):
            P.parse([bad])
    assert P.parse(["spec-bcg-always-tail-noovl"])[0].engine_kwargs("/m", radix=False, slot=0)[
        "disable_overlap_schedule"
    ]


@pytest.mark.parametrize("kernels", ["standin", "faithful"])
def test_a_spec_phase_is_its_phase_plus_eagle_and_the_next_n_model(kernels):
    import run_e2e

    for p in SPEC:
        plain = P.Phase(p.graph, p.split)
        kw = p.engine_kwargs("/m", radix=True, slot=2, kernels=kernels)
        base = plain.engine_kwargs("/m", radix=True, slot=2, kernels=kernels)
        extra = {k: v for k, v in kw.items() if k not in base}
        assert {k: kw[k] for k in base} == base
        eagle = dict(P.SPEC_KWARGS, speculative_dsa_topk_backend=base["dsa_topk_backend"])
        # -noovl: SGLang's overlap scheduler off (on by default, as in the other phases).
        assert extra == (dict(eagle, disable_overlap_schedule=True) if p.no_overlap else eagle)
        # The environment (the split's flags, the kernels) is the plain phase's, but -tail's flag.
        env, plain_env = (
            x.env({"SGLANG_MIXGRAPH_SPLIT_TAIL_GRAPHS": "0"}, radix=True, kernels=kernels)
            for x in (p, plain)
        )
        tail = {"SGLANG_MIXGRAPH_SPLIT_TAIL_GRAPHS": "1" if p.tail_graphs else "0"}
        assert env == dict(plain_env, **tail)
        assert (p.config, plain.config) == (P.MTP_CONFIG, P.CONFIG)
        assert (run_e2e.model_dir(p), run_e2e.model_dir(plain)) == ("model_mtp", "model")


ONLINE = ["spec-eager-off-online", "spec-eager-always-online", "spec-bcg-always-online"]


def test_online_phases_run_after_their_own_reference_with_both_upstream_flags():
    phases = P.parse(list(reversed(ONLINE)))
    assert [p.name for p in phases] == ONLINE
    assert [p.is_baseline for p in phases] == [True, False, False]
    assert {p.baseline for p in phases} == {"spec-eager-off-online"}
    assert [p.upstream_arm for p in phases] == [
        "spec-eager-off-online",
        "spec-eager-off-online",
        "spec-bcg-off-online",
    ]
    for p in phases:
        plain = P.Phase(p.graph, p.split, spec=True)
        off = {"SGLANG_MIXGRAPH_SPLIT_TAIL_GRAPHS": "0"}
        env = p.env(off, radix=False)
        assert env == dict(
            plain.env(off, radix=False),
            SGLANG_OPT_USE_ONLINE_COMPRESS="1",
            SGLANG_EXPERIMENTAL_ONLINE_C128_MTP="1",
        )
        # Only the environment: the Engine's arguments are the plain speculative phase's.
        assert p.engine_kwargs("/m", radix=False, slot=1) == plain.engine_kwargs(
            "/m", radix=False, slot=1
        )
    # Not in the default speculative list; with -noovl, the reference has both.
    assert not any(p.online_c128 for p in SPEC)
    (both,) = P.parse(["spec-bcg-always-noovl-online"])
    assert (both.baseline, both.upstream_arm) == (
        "spec-eager-off-noovl-online",
        "spec-bcg-off-noovl-online",
    )
    assert P.parse([both.baseline])[0].is_baseline
    assert both.engine_kwargs("/m", radix=False, slot=0)["disable_overlap_schedule"]
    for bad, why in {
        "eager-always-online": "a phase without speculation takes no -online",
        "spec-eager-always-online-noovl": "unknown phase",  # suffixes in VARIANTS order
        "spec-eager-always-tail-online": "-tail with -online",
    }.items():
        with pytest.raises(ValueError, match=why):
            P.parse([bad])


SWING = ["spec-eager-off-acc", "spec-bcg-off-acc", "spec-eager-always-acc", "spec-bcg-always-acc"]


def test_swing_phases_force_upstreams_simulated_acceptance_against_their_own_reference():
    phases = P.parse(list(reversed(SWING)))
    assert [p.name for p in phases] == SWING
    assert {p.baseline for p in phases} == {"spec-eager-off-acc"}
    assert phases[3].upstream_arm == "spec-bcg-off-acc"
    off = {"SGLANG_MIXGRAPH_SPLIT_TAIL_GRAPHS": "0"}
    for p in phases:
        plain = P.Phase(p.graph, p.split, spec=True)
        assert p.env(off, radix=False) == dict(
            plain.env(off, radix=False),
            SGLANG_SIMULATE_ACC_LEN="2.5",
            SGLANG_SIMULATE_ACC_METHOD="match-expected",
            SGLANG_SIMULATE_ACC_TOKEN_MODE="real-draft-token",
        )
        assert p.engine_kwargs("/m", radix=False, slot=1) == plain.engine_kwargs(
            "/m", radix=False, slot=1
        )
    # Upstream's real-draft-token mode needs top-k 1, which every speculative phase has.
    assert P.SPEC_KWARGS["speculative_eagle_topk"] == 1
    assert not any(p.swing_accept for p in SPEC)
    (both,) = P.parse(["spec-eager-always-noovl-acc"])
    assert both.baseline == "spec-eager-off-noovl-acc"
    with pytest.raises(ValueError, match="a phase without speculation takes no -acc"):
        P.parse(["eager-always-acc"])


def test_upstream_reads_the_swing_settings_as_the_phase_sets_them(monkeypatch):
    from sglang.srt.environ import envs

    for key, value in P.SWING_ACCEPT_ENV.items():
        monkeypatch.setenv(key, value)
    assert envs.SGLANG_SIMULATE_ACC_LEN.get() == 2.5
    assert envs.SGLANG_SIMULATE_ACC_METHOD.get() == "match-expected"
    assert envs.SGLANG_SIMULATE_ACC_TOKEN_MODE.get() == "real-draft-token"


# ---- the checks --------------------------------------------------------------------------------

TOKENS = {"r0": [1, 2, 3], "r1": [4, 5]}
COUNTS = {
    "r0": {"verify_ct": 2, "correct_drafts": 2, "tokens": 3},
    "r1": {"verify_ct": 1, "correct_drafts": 1, "tokens": 2},
}
# Eager MIXED steps, each followed by the draft's extend over the same batch.
STEPS = [
    line
    for _ in range(4)
    for line in (
        dict(SHORT_SHAPE, mode="MIXED", graph=False),
        dict(SHORT_SHAPE, mode="MIXED", graph=False, draft=True),
    )
] + [{"mode": "TARGET_VERIFY", "graph": False}] * 3
SPLIT = {
    "steps_seen.mixed_run_as_extend": 4,
    "steps_split": 4,
    "layers_split.c0": 4,
    "layers_split.c4": 8,
    "layers_split.c128": 4,
    "draft_steps_seen.mixed_run_as_extend": 4,
}
DRAFT_FALLBACKS = {"spec_draft": 4}


def _spec(name, *, outputs=TOKENS, counts=COUNTS, events=None, fallbacks=None, steps=STEPS):
    (phase,) = P.parse([name])
    return C.PhaseRecord(
        name=name,
        split=phase.split,
        graph=phase.graph,
        spec=True,
        tail_graphs=phase.tail_graphs,
        no_overlap=phase.no_overlap,
        swing_accept=phase.swing_accept,
        online_c128=phase.online_c128,
        ran=True,
        outputs=outputs,
        expected_lens={"r0": 3, "r1": 2},
        steps=steps,
        spec_counts=counts,
        counters={
            "events": {"mixed_split": events} if events else {},
            "fallbacks": {"mixed_split": fallbacks} if fallbacks else {},
        },
    )


REF = _spec("spec-eager-off")


def _check(rec, upstream=None):
    return C.check_phase(rec, None if rec.is_baseline else REF, POLICY, upstream)


def test_the_reference_must_verify_drafts_and_count_only_target_mixed_steps():
    assert _failed(_check(REF)) == []
    assert "4 eager" in _detail(_check(REF), "the workload made MIXED steps")
    no_spec = _spec("spec-eager-off", counts={"r0": COUNTS["r0"]})
    assert _failed(_check(no_spec)) == ["speculative decoding verified drafts for every request"]
    assert "['r1']" in _detail(
        _check(no_spec), "speculative decoding verified drafts for every request"
    )
    assert C.steps_by_mode(STEPS) == {
        "MIXED/eager": 4,
        "TARGET_VERIFY/eager": 3,
        "draft MIXED/eager": 4,
    }


def test_an_eager_split_arm_passes_only_with_the_draft_counted_apart():
    good = _spec("spec-eager-always", events=SPLIT, fallbacks=DRAFT_FALLBACKS)
    checks = _check(good)
    assert _failed(checks) == []
    assert _detail(checks, "split acted in every eager MIXED step") == "split 4 of 4"
    bad = {
        "the draft's forward of every MIXED step kept upstream's path (spec_draft)": dict(
            fallbacks={"spec_draft": 3}
        ),
        "the draft's steps counted apart (draft_steps_seen, draft_replays_seen)": dict(
            events={k: v for k, v in SPLIT.items() if not k.startswith("draft_")}
        ),
        "no unexpected fallback": dict(fallbacks=dict(DRAFT_FALLBACKS, spec=1)),
        # The draft's SWA-only next-n layer split as well: 8 c0 layers in 4 steps.
        "layers split are the target's only (its layers per ratio x split steps)": dict(
            events=dict(SPLIT, **{"layers_split.c0": 8})
        ),
    }
    for name, change in bad.items():
        kw = {"events": SPLIT, "fallbacks": DRAFT_FALLBACKS, **change}
        assert _failed(_check(_spec("spec-eager-always", **kw))) == [name]


def test_split_steps_count_the_target_steps_not_the_drafts():
    # Counting the draft's lines as steps would ask for 8 splits; 8 counted is a failure.
    doubled = dict(SPLIT, steps_split=8, **{"steps_seen.mixed_run_as_extend": 8})
    failed = _failed(_check(_spec("spec-eager-always", events=doubled, fallbacks=DRAFT_FALLBACKS)))
    assert "split acted in every eager MIXED step" in failed
    assert "every eager MIXED step recognised (run as EXTEND)" in failed


ACCEPT = "accept length equals spec-eager-off's (within 1%)"


def test_accept_length_must_equal_the_references_within_the_tolerance():
    assert C.accept_length(REF) == pytest.approx(5 / 3)
    # One request's verify steps differ: the pooled accept length moves by more than 1%.
    slower = dict(COUNTS, r1={"verify_ct": 2, "correct_drafts": 0, "tokens": 2})
    checks = _check(
        _spec("spec-eager-always", counts=slower, events=SPLIT, fallbacks=DRAFT_FALLBACKS)
    )
    assert _failed(checks) == [ACCEPT]
    assert (
        _detail(checks, ACCEPT) == "1.2500 vs 1.6667; verify steps differ for 1 requests (['r1'])"
    )
    # Within the tolerance: 300 tokens in 100 verify steps against 301 in 100.
    ref = _spec(
        "spec-eager-off", counts={"r0": {"verify_ct": 100, "correct_drafts": 0, "tokens": 301}}
    )
    close = _spec(
        "spec-eager-always",
        counts={"r0": {"verify_ct": 100, "correct_drafts": 0, "tokens": 300}},
        events=SPLIT,
        fallbacks=DRAFT_FALLBACKS,
    )
    assert C._accept_length_equal(close, ref, "").ok
    assert not C._accept_length_equal(close, _spec("spec-eager-off", counts={}), "").ok


DIFFERS = {"r0": [1, 2, 9], "r1": [4, 5]}


def test_a_split_off_breakable_arm_that_differs_is_named_upstreams():
    off = _spec("spec-bcg-off", outputs=DIFFERS)
    checks = _check(off)
    assert _failed(checks) == ["tokens equal spec-eager-off"]
    detail = _detail(checks, "tokens equal spec-eager-off")
    assert "SGLang issue 29985" in detail and "the split is off in this phase" in detail
    assert detail.endswith("r0: first differs at 2 (3 vs 3 tokens)")
    assert _failed(_check(_spec("spec-bcg-off"))) == []


BCG_SPLIT = {
    "replays_seen": 4,
    "replays_split": 4,
    "layers_split.c0": 4,
    "layers_split.c4": 8,
    "layers_split.c128": 4,
    "draft_steps_seen.mixed_run_as_extend": 4,
}
BCG_STEPS = [
    dict(s, graph=True) if not s.get("draft") and s["mode"] == "MIXED" else s for s in STEPS
]


def test_a_breakable_split_arm_is_also_compared_with_upstreams_breakable_arm():
    upstream = _spec("spec-bcg-off", outputs=DIFFERS, steps=BCG_STEPS)
    split = _spec(
        "spec-bcg-always",
        outputs=DIFFERS,
        events=BCG_SPLIT,
        fallbacks=DRAFT_FALLBACKS,
        steps=BCG_STEPS,
    )
    checks = _check(split, upstream)
    # Upstream's difference, held fixed, is the split arm's too: only the reference check fails,
    # and it says whose the difference is; the split alone changed nothing.
    assert _failed(checks) == ["tokens equal spec-eager-off"]
    assert "spec-bcg-off differs from spec-eager-off as well" in _detail(
        checks, "tokens equal spec-eager-off"
    )
    assert _detail(checks, "tokens equal spec-bcg-off") == ""
    # A split that changes tokens of its own fails against both.
    own = _spec(
        "spec-bcg-always",
        outputs={"r0": [1, 2, 9], "r1": [4, 6]},
        events=BCG_SPLIT,
        fallbacks=DRAFT_FALLBACKS,
        steps=BCG_STEPS,
    )
    assert _failed(_check(own, upstream)) == [
        "tokens equal spec-eager-off",
        "tokens equal spec-bcg-off",
    ]
    # Where upstream's breakable arm equals the reference, there is one comparison.
    same = _spec("spec-bcg-always", events=BCG_SPLIT, fallbacks=DRAFT_FALLBACKS, steps=BCG_STEPS)
    names = [c.name for c in _check(same, _spec("spec-bcg-off", steps=BCG_STEPS))]
    assert "tokens equal spec-eager-off" in names and "tokens equal spec-bcg-off" not in names
    assert _failed(_check(same, _spec("spec-bcg-off", steps=BCG_STEPS))) == []


def test_a_no_overlap_split_arm_is_read_against_the_no_overlap_reference():
    ref = _spec("spec-eager-off-noovl", outputs=DIFFERS)
    assert ref.is_baseline and _failed(C.check_phase(ref, None, POLICY)) == []
    arm = _spec("spec-eager-always-noovl", events=SPLIT, fallbacks=DRAFT_FALLBACKS)
    names = [c.name for c in C.check_phase(arm, ref, POLICY)]
    assert "tokens equal spec-eager-off-noovl" in names
    assert "accept length equals spec-eager-off-noovl's (within 1%)" in names
    # Its tokens are those of the overlap-on reference, not of its own: it fails.
    assert _failed(C.check_phase(arm, ref, POLICY)) == ["tokens equal spec-eager-off-noovl"]
    same = _spec(
        "spec-eager-always-noovl", outputs=DIFFERS, events=SPLIT, fallbacks=DRAFT_FALLBACKS
    )
    assert _failed(C.check_phase(same, ref, POLICY)) == []


TAILS = C.TAILS_CHECK


def test_a_tail_graph_arm_must_run_every_split_layers_tail_from_the_graphs():
    # 4 split steps of the tiny model's layers c0, c4, c128, c4: per step the first layer of
    # each ratio makes the schedule (3), the second c4 layer replays (1)
    good = _spec(
        "spec-eager-always-tail",
        events=dict(SPLIT, tail_graph_replays=4, tail_graph_schedules=12),
        fallbacks=DRAFT_FALLBACKS,
    )
    assert not good.is_baseline and _failed(_check(good)) == []
    assert _detail(_check(good), TAILS) == (
        "tail_graph_replays 4, tail_graph_schedules 12 (expected 12: 4 split steps x ratios) "
        "of 16 layers split; eager calls none"
    )
    bad = {
        "flag without effect": {},
        "every layer replayed, no schedule made": {"tail_graph_replays": 16},
        "a schedule made for every layer": {"tail_graph_schedules": 16},
        "one tail called eagerly": {
            "tail_graph_replays": 3,
            "tail_graph_schedules": 12,
            "tail_graph_eager.capturing": 1,
        },
        "eager calls besides": {
            "tail_graph_replays": 4,
            "tail_graph_schedules": 12,
            "tail_graph_eager.too_many_rows": 1,
        },
    }
    for why, extra in bad.items():
        rec = _spec(
            "spec-eager-always-tail", events=dict(SPLIT, **extra), fallbacks=DRAFT_FALLBACKS
        )
        assert _failed(_check(rec)) == [TAILS], why
    # No split, no tail: zero replays of zero layers is a failure, not a pass.
    none = _spec("spec-eager-always-tail", events={}, fallbacks=DRAFT_FALLBACKS)
    assert TAILS in _failed(_check(none))
    # The phases without the variant make no such check.
    assert TAILS not in [c.name for c in _check(_spec("spec-eager-always", events=SPLIT))]


ONLINE_STEPS = {
    "steps_seen.mixed_run_as_extend": 4,
    "draft_steps_seen.mixed_run_as_extend": 4,
}
ONLINE_FALLBACKS = {"spec_draft": 4, "spec_online_c128": 4}
FELL_BACK = "the split fell back on every MIXED step for online c128 MTP (spec_online_c128)"
NOT_SPLIT = "no MIXED step split under online c128 MTP (steps_split, replays_split 0)"


def test_an_online_split_arm_passes_only_where_every_mixed_step_fell_back():
    ref = _spec("spec-eager-off-online")
    assert ref.is_baseline and _failed(C.check_phase(ref, None, POLICY)) == []
    # No split activity in the reference: a counted fallback there fails.
    busy_ref = _spec("spec-eager-off-online", fallbacks={"spec_online_c128": 4})
    assert _failed(C.check_phase(busy_ref, None, POLICY)) == ["mixed_split inactive (flag off)"]

    def check(**kw):
        kw = {"events": ONLINE_STEPS, "fallbacks": ONLINE_FALLBACKS, **kw}
        return C.check_phase(_spec("spec-eager-always-online", **kw), ref, POLICY, ref)

    good = check()
    assert _failed(good) == []
    names = [c.name for c in good]
    assert FELL_BACK in names and NOT_SPLIT in names
    assert "tokens equal spec-eager-off-online" in names
    assert "accept length equals spec-eager-off-online's (within 1%)" in names
    assert "split acted in every eager MIXED step" not in names
    assert _detail(good, FELL_BACK) == "spec_online_c128 4 of 4 MIXED steps"
    # One step split: it did not fall back there, and the split counters say so.
    one = dict(
        ONLINE_STEPS,
        steps_split=1,
        decode_rows_split=1,
        **{"layers_split.c0": 1, "layers_split.c4": 2, "layers_split.c128": 1},
    )
    split_one = check(events=one, fallbacks={"spec_draft": 4, "spec_online_c128": 3})
    assert _failed(split_one) == [FELL_BACK, NOT_SPLIT]
    assert _detail(split_one, FELL_BACK) == "spec_online_c128 3 of 4 MIXED steps"
    assert "steps_split: 1" in _detail(split_one, NOT_SPLIT)
    # Fell back, but for another reason: the online key is missing and the other is unexpected.
    other = check(fallbacks={"spec_draft": 4, "spec_verify": 4})
    assert _failed(other) == ["no unexpected fallback", FELL_BACK]
    assert _detail(other, "no unexpected fallback") == "{'spec_verify': 4}"
    # Read against the offline reference's tokens (not its own), it fails.
    assert _failed(check(outputs=DIFFERS)) == ["tokens equal spec-eager-off-online"]
    # Without -online the same counters are a split that never acted.
    plain = _spec("spec-eager-always", events=ONLINE_STEPS, fallbacks=ONLINE_FALLBACKS)
    failed = _failed(_check(plain))
    assert "no unexpected fallback" in failed and "split acted in every eager MIXED step" in failed


def test_an_online_breakable_arm_counts_its_replays():
    ref = _spec("spec-eager-off-online")
    events = {"replays_seen": 4, "draft_steps_seen.mixed_run_as_extend": 4}
    arm = _spec(
        "spec-bcg-always-online", events=events, fallbacks=ONLINE_FALLBACKS, steps=BCG_STEPS
    )
    assert _failed(C.check_phase(arm, ref, POLICY)) == []
    unseen = _spec(
        "spec-bcg-always-online",
        events={"draft_steps_seen.mixed_run_as_extend": 4},
        fallbacks=ONLINE_FALLBACKS,
        steps=BCG_STEPS,
    )
    assert _failed(C.check_phase(unseen, ref, POLICY)) == [
        "every MIXED step recognised (steps_seen, replays_seen)"
    ]
    # An adaptive decision means the step reached the policy: it did not fall back.
    decided = dict(events, replays_unsplit_adaptive=1)
    rec = _spec(
        "spec-bcg-adaptive-online", events=decided, fallbacks=ONLINE_FALLBACKS, steps=BCG_STEPS
    )
    assert _failed(C.check_phase(rec, ref, POLICY)) == [NOT_SPLIT]


SWUNG = (
    "acceptance swung between 2 and 3 tokens a verify step (tokens per verify step in [2.1, 2.9])"
)


def test_a_swing_phase_must_show_two_and_three_tokens_per_verify_step():
    # 12 verify steps that committed 30 drafts + 12 target tokens (2 and 3 alike), and 6 tokens
    # no verify step made (first tokens, MIXED steps): the accept length reads 48 / 12 = 4.0.
    mixed = {
        "r0": {"verify_ct": 10, "correct_drafts": 15, "tokens": 29},
        "r1": {"verify_ct": 2, "correct_drafts": 3, "tokens": 7},
    }
    ref = _spec("spec-eager-off-acc", counts=mixed)
    assert C.tokens_per_verify_step(ref) == pytest.approx(2.5)
    assert C.accept_length(ref) == pytest.approx(3.0)
    checks = C.check_phase(ref, None, POLICY, None)
    assert _failed(checks) == []
    assert _detail(checks, SWUNG) == "tokens per verify step 2.5000"
    # Every step committed 3, or no draft was ever accepted (the knob ignored): no swing.
    threes = {r: {"verify_ct": 2, "correct_drafts": 4, "tokens": 7} for r in ("r0", "r1")}
    for counts in (threes, COUNTS):
        rec = _spec("spec-eager-off-acc", counts=counts)
        assert _failed(C.check_phase(rec, None, POLICY, None)) == [SWUNG]
    arm = _spec("spec-eager-always-acc", counts=mixed, events=SPLIT, fallbacks=DRAFT_FALLBACKS)
    checks = C.check_phase(arm, ref, POLICY, ref)
    assert _failed(checks) == []
    assert "tokens equal spec-eager-off-acc" in [c.name for c in checks]
    assert SWUNG not in [c.name for c in _check(REF)]


def test_summary_shows_the_accept_length():
    assert "speculative: accept length 1.6667 over 3 verify steps of 2 requests" in C.summarize(REF)


# ---- the driver, with a stand-in phase process -------------------------------------------------

FAKE_SPEC_PHASE = """
import json, os, sys
kwargs_path, out = sys.argv[1], sys.argv[2]
kwargs = json.load(open(kwargs_path))
config = json.load(open(os.path.join(kwargs["model_path"], "config.json")))
assert kwargs["speculative_algorithm"] == "EAGLE" and config["num_nextn_predict_layers"] == 1
split = os.environ["SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN"] == "1"
adaptive = split and os.environ.get("SGLANG_MIXGRAPH_SPLIT_POLICY") == "adaptive"
graph = kwargs.get("cuda_graph_backend_prefill") == "breakable"
if split and os.environ.get("FAKE_SPLIT_OOM") == "1":  # dies as a phase that found no memory
    sys.stderr.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 488.00 MiB.\\n")
    sys.exit(1)
shape = {"seq_lens": [900, 41], "extend_seq_lens": [256, 1], "num_decode": 1 if split else None}
steps = [dict(shape, mode="MIXED", bs=2, rows=257, graph=graph, ms=2.0)] * 2
steps += [dict(shape, mode="MIXED", bs=2, rows=257, graph=False, ms=1.0, draft=True)] * 2
steps += [{"mode": "TARGET_VERIFY", "bs": 2, "rows": 6, "graph": True, "ms": 1.0}]
# The logprob segment: its request's steps marked, the prompt beside it as EXTEND.
lp = {"mode": "TARGET_VERIFY", "bs": 1, "rows": 3, "graph": graph, "ms": 1.0, "logprob": True}
steps += [lp] + [{"mode": "EXTEND", "bs": 1, "rows": 511, "graph": graph, "ms": 1.0}] * 3 + [lp]
with open(os.path.join(os.environ["MIXGRAPH_E2E_STEP_LOG"], "steps_1.jsonl"), "w") as f:
    f.writelines(json.dumps(s) + "\\n" for s in steps)
layers = {"layers_split.c0": 2, "layers_split.c4": 4, "layers_split.c128": 2}
online = all(os.environ.get(f) == "1" for f in (
    "SGLANG_OPT_USE_ONLINE_COMPRESS", "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP"))
fallbacks = {"spec_draft": 2, **({"spec_online_c128": 2} if online else {})}
if split and online:
    events = {"replays_seen": 2} if graph else {"steps_seen.mixed_run_as_extend": 2}
elif adaptive:
    events = {"replays_seen": 2, "replays_unsplit_adaptive": 2} if graph else {
        "steps_seen.mixed_run_as_extend": 2, "steps_unsplit_adaptive": 2}
elif split:
    events = dict({"replays_seen": 2, "replays_split": 2} if graph else {
        "steps_seen.mixed_run_as_extend": 2, "steps_split": 2}, **layers)
if split:
    events["draft_steps_seen.mixed_run_as_extend"] = 2
    if os.environ.get("SGLANG_MIXGRAPH_SPLIT_TAIL_GRAPHS") == "1" and not adaptive:
        made = 2 * sum(1 for n in layers.values() if n)  # 2 split steps x ratios
        events["tail_graph_schedules"] = made
        events["tail_graph_replays"] = sum(layers.values()) - made
    snap = {"pid": 7, "events": {"mixed_split": events}, "fallbacks": {"mixed_split": fallbacks}}
    print("[x] sglang-mixgraph counters " + json.dumps(snap))
tokens = [1, 9] if graph and os.environ.get("FAKE_BCG_DIFFERS") == "1" else [1, 2]
spec = {"r0": {"verify_ct": 1, "correct_drafts": 1, "tokens": 2}}
json.dump({"ok": True, "outputs": {"r0": tokens}, "expected_lens": {"r0": 2}, "spec": spec,
           "logprobs": {"lp_req": 96}, "timings": {}}, open(out, "w"))
"""


def _run_spec_driver(tmp_path, monkeypatch, bcg_differs, phases=("spec",), oom=False):
    import run_e2e

    fake = tmp_path / "fake_phase.py"
    fake.write_text(FAKE_SPEC_PHASE)
    monkeypatch.setattr(scm, "load_coefficients", lambda arch: POLICY.coeffs)
    monkeypatch.setattr(run_e2e, "PHASE_SCRIPT", str(fake))
    monkeypatch.setenv("FAKE_BCG_DIFFERS", "1" if bcg_differs else "0")
    monkeypatch.setenv("FAKE_SPLIT_OOM", "1" if oom else "0")
    out = tmp_path / "out"
    argv = ["run_e2e.py", *phases, "--out", str(out), "--work", str(tmp_path / "work")]
    monkeypatch.setattr(sys, "argv", [*argv, "--budget-s", "120"])
    rc = run_e2e.main()
    return (
        rc,
        json.loads((out / "e2e_results.json").read_text()),
        (out / "e2e_tiny_dsv4.log").read_text(),
    )


def test_driver_runs_the_spec_phases_on_the_next_n_model(tmp_path, monkeypatch):
    rc, report, log = _run_spec_driver(tmp_path, monkeypatch, bcg_differs=False)
    assert rc == 0 and report["checks_failed"] == 0
    assert list(report["phases"]) == [p.name for p in SPEC]
    assert all(r["accept_length"] == 2.0 for r in report["phases"].values())
    assert "[ok] the draft's steps counted apart (draft_steps_seen, draft_replays_seen)" in log
    assert "[ok] accept length equals spec-eager-off's (within 1%)" in log
    assert "[ok] accept length equals spec-eager-off-noovl's (within 1%)" in log
    assert f"[ok] {C.TAILS_CHECK}" in log
    assert log.count("[ok] no MIXED step while a return_logprob request ran") == len(SPEC)
    assert '"speculative_algorithm": "EAGLE"' in log
    kwargs = {
        n: json.loads((tmp_path / "work" / n / "kwargs.json").read_text()) for n in report["phases"]
    }
    assert [n for n, kw in kwargs.items() if kw.get("disable_overlap_schedule")] == [
        "spec-eager-off-noovl",
        "spec-eager-always-noovl",
    ]


def test_driver_says_a_phase_died_out_of_gpu_memory(tmp_path, monkeypatch):
    phases = ("spec-eager-off", "spec-eager-always")
    rc, report, log = _run_spec_driver(tmp_path, monkeypatch, False, phases=phases, oom=True)
    assert rc != 0
    died = report["phases"]["spec-eager-always"]
    assert not died["ran"]
    assert died["error"] == (
        "no result written (the phase process died: CUDA out of memory (the phases side by side "
        "share one GPU: a lower --parallel fits)); see its log"
    )
    assert report["phases"]["spec-eager-off"]["ran"]
    import run_e2e

    assert run_e2e.death_cause("a phase that logged nothing useful") is None


def test_driver_runs_the_online_phases_after_their_reference(tmp_path, monkeypatch):
    # The stand-in falls back only where both upstream flags reach it: without them the split
    # counters it writes would fail the online checks.
    rc, report, log = _run_spec_driver(tmp_path, monkeypatch, False, phases=reversed(ONLINE))
    assert rc == 0 and report["checks_failed"] == 0
    assert list(report["phases"]) == ONLINE
    assert log.count(f"[ok] {FELL_BACK}") == 2
    assert log.count("[ok] accept length equals spec-eager-off-online's (within 1%)") == 2


def test_driver_names_upstreams_breakable_arm_when_it_differs(tmp_path, monkeypatch):
    rc, report, log = _run_spec_driver(tmp_path, monkeypatch, bcg_differs=True)
    failed = {
        n: [c["name"] for c in r["checks"] if not c["ok"]] for n, r in report["phases"].items()
    }
    assert rc == 1 and {n: f for n, f in failed.items() if f} == {
        n: ["tokens equal spec-eager-off"]
        for n in ("spec-bcg-off", "spec-bcg-always", "spec-bcg-adaptive")
    }
    assert (
        "FAILED spec-bcg-off: tokens equal spec-eager-off: upstream's breakable prefill replay under EAGLE (SGLang issue 29985)"
        in log
    )


def test_step_log_marks_the_draft_runners_forwards(tmp_path, monkeypatch):
    import e2e_step_log as L
    from test_e2e_harness import _batch, cpu_step_log

    cpu_step_log(monkeypatch, tmp_path)

    class ModelRunner:
        def __init__(self, is_draft_worker):
            self.is_draft_worker = is_draft_worker

        def forward(self, forward_batch):
            return SimpleNamespace(can_run_graph=False)

    L._wrap_forward(SimpleNamespace(ModelRunner=ModelRunner))
    ModelRunner(False).forward(_batch("MIXED"))
    ModelRunner(True).forward(_batch("MIXED"))
    (log,) = tmp_path.glob("steps_*.jsonl")
    target, draft = [json.loads(line) for line in log.read_text().splitlines()]
    assert "draft" not in target and draft["draft"] is True
    assert C.steps_by_mode([target, draft]) == {"MIXED/eager": 1, "draft MIXED/eager": 1}


class _SpecEngine:
    """What e2e_phase asks of ``sglang.Engine`` under speculation: every finished output
    carries upstream's speculative counts in ``meta_info`` (one verify step per two tokens
    here), streamed chunks only at the finish, as ``TokenizerManager`` sets them."""

    def __init__(self, **kwargs):
        import asyncio

        self.loop = asyncio.new_event_loop()

    @staticmethod
    def _out(n, finished=True, logprob=False):
        meta = {
            "completion_tokens": n,
            "spec_verify_ct": -(-n // 2),
            "spec_num_correct_drafts": n // 2,
        }
        if logprob:  # cumulative in every chunk (upstream's default streaming)
            meta = dict(meta if finished else {}, output_token_logprobs=[(-0.5, 3, None)] * n)
        return {"output_ids": [3] * n, "meta_info": meta if finished or logprob else {}}

    def generate(self, input_ids, sampling_params):
        return [self._out(p["max_new_tokens"]) for p in sampling_params]

    async def async_generate(self, input_ids, sampling_params, stream=False, return_logprob=False):
        n = sampling_params["max_new_tokens"]
        if not stream:
            return self._out(n, logprob=return_logprob)

        async def chunks():
            for i in range(1, n + 1):
                yield self._out(i, finished=i == n, logprob=return_logprob)

        return chunks()

    def shutdown(self):
        self.loop.close()


def test_phase_records_each_requests_speculative_counts(monkeypatch):
    import e2e_phase
    import e2e_workload as W

    monkeypatch.setitem(sys.modules, "sglang", SimpleNamespace(Engine=_SpecEngine))
    monkeypatch.setenv("MIXGRAPH_E2E_WORKLOAD", "short")
    monkeypatch.setenv("SGLANG_MIXGRAPH_COUNTERS_LOG_INTERVAL", "0")
    res = e2e_phase.run({"chunked_prefill_size": P.CHUNK, "speculative_algorithm": "EAGLE"})
    reqs = W.all_requests(W.build(chunk=P.CHUNK, workload="short", spec=True))
    assert res["ok"] and set(res["spec"]) == {r.rid for r in reqs}
    # The speculative workload's return_logprob request asked for them and got one per token.
    assert [r.rid for r in reqs if r.logprob] == list(W.logprob_rids("short", spec=True))
    assert res["logprobs"] == {"lp_req": W.LOGPROB_NEW}
    # Streamed requests (the staggered segment's first) report at their last chunk.
    for r in reqs:
        n = r.max_new
        assert res["spec"][r.rid] == {
            "verify_ct": -(-n // 2),
            "correct_drafts": n // 2,
            "tokens": n,
        }
    assert e2e_phase.spec_counts({"output_ids": [1], "meta_info": {}}) is None


LP_STEPS = [
    {"mode": "MIXED", "graph": False, "seq_lens": [600, 41], "extend_seq_lens": [512, 1]},
    {"mode": "EXTEND", "graph": False, "logprob": True},  # the logprob request's prefill
    {"mode": "TARGET_VERIFY", "graph": False, "logprob": True},
    *[{"mode": "EXTEND", "graph": False}] * 3,  # the prompt beside it, unmixed
    {"mode": "MIXED", "graph": False, "draft": True},  # the draft's lines are no steps
    {"mode": "TARGET_VERIFY", "graph": False, "logprob": True},
    {"mode": "DECODE", "graph": False},
]
LP_GOT = "the return_logprob requests got their logprobs"
LP_UNMIXED = "no MIXED step while a return_logprob request ran (the prompt beside it as EXTEND)"


def _lp(steps=LP_STEPS, logprobs=None):
    rec = _spec("spec-eager-off", steps=steps)
    rec.logprob_rids = ("lp_req",)
    rec.logprobs = {"lp_req": 96} if logprobs is None else logprobs
    return rec


def test_a_return_logprob_request_must_run_without_mixed_steps():
    checks = _check(_lp())
    assert _failed(checks) == []
    assert _detail(checks, LP_UNMIXED) == (
        "steps from its prefill to its last: {'EXTEND': 4, 'TARGET_VERIFY': 2}"
    )
    mixed = [*LP_STEPS[:4], LP_STEPS[0], *LP_STEPS[4:]]
    assert _failed(_check(_lp(mixed))) == [LP_UNMIXED]
    # The prompt beside it never came while it ran: nothing shows the rule.
    alone = [s for s in LP_STEPS if not (s["mode"] == "EXTEND" and "logprob" not in s)]
    assert _failed(_check(_lp(alone))) == [LP_UNMIXED]
    unmarked = [{k: v for k, v in s.items() if k != "logprob"} for s in LP_STEPS]
    assert _detail(_check(_lp(unmarked)), LP_UNMIXED) == "no step returned logprobs"
    assert _failed(_check(_lp(logprobs={}))) == [LP_GOT]
    # Without a logprob request in the workload, neither check is made.
    assert LP_GOT not in [c.name for c in _check(_spec("spec-eager-off"))]


def test_step_log_marks_batches_that_return_logprobs(tmp_path, monkeypatch):
    import e2e_step_log as L
    from test_e2e_harness import _batch, cpu_step_log

    cpu_step_log(monkeypatch, tmp_path)

    class ModelRunner:
        def forward(self, forward_batch):
            return SimpleNamespace(can_run_graph=False)

    L._wrap_forward(SimpleNamespace(ModelRunner=ModelRunner))
    ModelRunner().forward(_batch("EXTEND", return_logprob=True))
    ModelRunner().forward(_batch("EXTEND", return_logprob=False))
    (log,) = tmp_path.glob("steps_*.jsonl")
    assert [json.loads(line).get("logprob") for line in log.read_text().splitlines()] == [
        True,
        None,
    ]


def test_step_log_passes_a_forward_under_graph_capture_through_unsynchronized(
    tmp_path, monkeypatch
):
    """EAGLE's draft decode graph capture calls ModelRunner.forward inside the capture: a
    synchronize there invalidates it (cudaErrorStreamCaptureUnsupported), so none may run."""
    import e2e_step_log as L
    import torch
    from test_e2e_harness import _batch

    def no_sync():
        raise AssertionError("synchronize under capture")

    monkeypatch.setenv("MIXGRAPH_E2E_STEP_LOG", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    ran = []

    class ModelRunner:
        is_draft_worker = True

        def forward(self, forward_batch):
            ran.append(forward_batch.forward_mode.name)
            return SimpleNamespace(can_run_graph=False)

    L._wrap_forward(SimpleNamespace(ModelRunner=ModelRunner))
    out = ModelRunner().forward(_batch("DECODE"))
    assert ran == ["DECODE"] and out.can_run_graph is False
    assert list(tmp_path.glob("steps_*.jsonl")) == []
