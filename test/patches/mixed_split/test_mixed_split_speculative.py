"""The split under speculative decoding (CPU, upstream's DSV4 backend, its real spec objects and
its real ``EagerRunner``): a MIXED step of EAGLE or NEXTN (MTP), whose running requests are plain
1-token decodes, splits and equals the unsplit step, in an eager step (which upstream's runner
relabels EXTEND before the metadata is built) as when labelled MIXED (a breakable-graph replay's
live batch), with or without a draft input on the batch; the draft model's forwards of the same
step, verify steps, other algorithms and online c128 MTP keep upstream's path, each counted under
its own reason, the draft's steps apart from the target's; `plan` says which.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_mixgraph import counters, fallback
from sglang_mixgraph.kits import dsv4_cpu as K

K.import_upstream()

from sglang.srt.model_executor.forward_batch_info import (  # noqa: E402
    CaptureHiddenMode,
    ForwardMode,
)
from sglang.srt.speculative.eagle_info import EagleDraftInput, EagleVerifyInput  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

from sglang_mixgraph.patches import mixed_split as ms  # noqa: E402

ATOL, RTOL = 4e-3, 8e-3  # as test_mixed_split: bf16 outputs, summation order only
STEP = K.Step(prefill=[(200, 24), (0, 9)], decode=[300, 17, 140], padding=2, seed=81)


@pytest.fixture(autouse=True)
def _fresh():
    fallback._said.clear()
    counters.reset()
    yield
    fallback._said.clear()


def draft_input():
    """What a MIXED batch of EAGLE's v2 worker carries: the running batch's draft input."""
    return EagleDraftInput.create_idle_input(
        device="cpu",
        hidden_size=None,
        dtype=None,
        topk=1,
        capture_hidden_mode=CaptureHiddenMode.FULL,
    )


def speculative(world, fb, algorithm="EAGLE", spec_info=None):
    """The batch and backend as a speculative deployment has them (MTP: eagle top-k 1)."""
    world.backend.mtp_enabled = True
    fb.spec_algorithm = SpeculativeAlgorithm.from_string(algorithm)
    fb.spec_info = draft_input() if spec_info is None else spec_info
    fb.capture_hidden_mode = CaptureHiddenMode.FULL
    return fb


def target_mixed_step(world, algorithm="EAGLE", with_draft_input=False):
    """The target forward of a MIXED step as EAGLE's v2 worker runs it in 0.5.23: the scheduler's
    new prefill batch has no spec_info, so ``ScheduleBatch.merge_batch`` merges none and the
    mixed batch carries none (``_forward_prefill_batch`` hands it to the target as it is, with
    FULL hidden states); ``with_draft_input`` puts a draft input on it all the same."""
    fb = speculative(world, world.forward_batch(), algorithm)
    if not with_draft_input:
        fb.spec_info = None
    return fb


@pytest.mark.parametrize("policy", ["always", "adaptive"])
@pytest.mark.parametrize("with_draft_input", [False, True], ids=["no_spec_info", "draft_input"])
@pytest.mark.parametrize("algorithm", ["EAGLE", "NEXTN"])
def test_an_eager_mixed_step_of_eagle_splits_through_upstreams_eager_runner(
    algorithm, with_draft_input, policy, monkeypatch
):
    """Upstream's ``EagerRunner.execute`` relabels the MIXED step to EXTEND before
    ``init_forward_metadata``: the split still takes it (recognised as built MIXED)."""
    from sglang_mixgraph.core import split_cost_model as scm

    if policy == "adaptive":
        monkeypatch.setattr(scm, "decide_step", lambda *a, **k: True)
    d = len(STEP.decode)
    with K.reference_world("H200"):
        world = K.World(STEP)
        runner, model = K.eager_runner(world, spec_algorithm=algorithm)
        base = K.run_eager(runner, world, target_mixed_step(world, algorithm, with_draft_input))
        with K.patch_installed(policy=policy):
            K.CALLS.clear()
            fb = target_mixed_step(world, algorithm, with_draft_input)
            out = K.run_eager(runner, world, fb)
            ran = model.batches[-1]
            assert fb.forward_mode == ForwardMode.EXTEND and ran is not fb
            assert ran.forward_mode == ForwardMode.EXTEND
            plan = ms.get_plan(world.backend)
            assert plan is not None and plan.matches(ran) and plan.policy == policy
    assert (plan.boundary.b0, plan.boundary.num_decode_reqs) == (STEP.b0, d)
    assert [c["q"].shape[0] for c in K.CALLS.decode] == [d] * len(K.LAYER_RATIOS)
    for layer in out:
        torch.testing.assert_close(out[layer].float(), base[layer].float(), atol=ATOL, rtol=RTOL)
    snap = counters.snapshot()
    assert snap["events"][ms.PATCH_ID] == {
        "steps_seen.mixed_run_as_extend": 1,
        "steps_split": 1,
        "decode_rows_split": d,
        "layers_split.c0": 1,
        "layers_split.c4": 1,
        "layers_split.c128": 1,
    }
    assert snap["fallbacks"].get(ms.PATCH_ID, {}) == {}


def _draft_forward(world, algorithm="EAGLE"):
    """The draft model's extend over the same MIXED scheduler batch
    (``EagleDraftWorker._draft_extend_for_prefill``: ``ForwardBatch.init_new`` of the batch, still
    MIXED, for the draft runner, with an ``EagleDraftExtendInput``)."""
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput

    world.backend.is_draft_runner = True
    fb = speculative(world, world.forward_batch(), algorithm)
    fb.spec_info = EagleDraftExtendInput(
        hidden_states=None, num_tokens_per_req=1, num_tokens_for_logprob_per_req=1
    )
    fb.capture_hidden_mode = CaptureHiddenMode.LAST
    return fb


@pytest.mark.parametrize("steps", [1, 3])
def test_the_draft_models_forwards_of_a_mixed_step_fall_back_and_are_counted_apart(steps):
    """Each MIXED step runs the target, then the draft over the same scheduler batch, both
    through an eager runner: the target splits, the draft keeps upstream's path
    (``spec_draft``, once per step), and ``steps_seen`` counts each step once."""
    d = len(STEP.decode)
    with K.reference_world("H200"):
        target, draft = K.World(STEP), K.World(STEP)
        t_runner, _ = K.eager_runner(target, spec_algorithm="EAGLE")
        d_runner, d_model = K.eager_runner(draft, spec_algorithm="EAGLE")
        d_base = K.run_eager(d_runner, draft, _draft_forward(draft))
        with K.patch_installed(policy="always"):
            for _ in range(steps):
                K.run_eager(t_runner, target, target_mixed_step(target))
                assert ms.get_plan(target.backend) is not None
                K.CALLS.clear()
                d_out = K.run_eager(d_runner, draft, _draft_forward(draft))
                assert d_model.batches[-1].forward_mode == ForwardMode.EXTEND
                assert ms.get_plan(draft.backend) is None and not K.CALLS.decode
    for layer in d_out:
        assert torch.equal(d_out[layer], d_base[layer]), layer
    snap = counters.snapshot()
    assert snap["events"][ms.PATCH_ID] == {
        "steps_seen.mixed_run_as_extend": steps,
        "draft_steps_seen.mixed_run_as_extend": steps,
        "steps_split": steps,
        "decode_rows_split": steps * d,
        "layers_split.c0": steps,
        "layers_split.c4": steps,
        "layers_split.c128": steps,
    }
    assert snap["fallbacks"][ms.PATCH_ID] == {"spec_draft": steps}


@pytest.mark.parametrize("algorithm", ["EAGLE", "NEXTN"])
def test_a_mixed_step_of_eagle_splits_and_equals_the_unsplit_step(algorithm):
    """Labelled MIXED at the metadata build, as a breakable-graph replay's live batch is."""
    with K.reference_world("H200"):
        world = K.World(STEP)
        base = world.run_step(speculative(world, world.forward_batch(), algorithm))
        with K.patch_installed():
            K.CALLS.clear()
            out = world.run_step(speculative(world, world.forward_batch(), algorithm))
            plan = ms.get_plan(world.backend)
    assert plan is not None
    assert (plan.boundary.b0, plan.boundary.num_decode_reqs) == (STEP.b0, len(STEP.decode))
    assert K.CALLS.decode, "the decode rows took the decode kernel"
    for layer in out:
        torch.testing.assert_close(out[layer].float(), base[layer].float(), atol=ATOL, rtol=RTOL)
    assert counters.snapshot()["fallbacks"].get(ms.PATCH_ID, {}) == {}


def _verify(world, fb):
    verify = EagleVerifyInput.create_idle_input(
        topk=1, spec_steps=1, num_verify_tokens=2, device="cpu"
    )
    return speculative(world, fb, spec_info=verify)


def _draft_runner(world, fb):
    world.backend.is_draft_runner = True
    return speculative(world, fb)


def _online_c128(world, fb):
    world.backend.online_c128_mtp = SimpleNamespace(enabled=lambda: True)
    return speculative(world, fb)


STAYS_UPSTREAM = {
    "spec_verify": _verify,
    "spec_draft": _draft_runner,
    "spec_online_c128": _online_c128,
    "spec": lambda world, fb: speculative(world, fb, "DFLASH"),
    # Unreachable with DeepSeek-V4 (SGLang refuses EAGLE3 at model init); kept off the split.
    "spec_eagle3": lambda world, fb: speculative(world, fb, "EAGLE3"),
}


@pytest.mark.parametrize("reason", sorted(STAYS_UPSTREAM))
def test_speculative_steps_the_split_does_not_take_stay_upstreams(reason):
    with K.reference_world("H200"):
        world = K.World(STEP)
        base = world.run_step(STAYS_UPSTREAM[reason](world, world.forward_batch()))
        with K.patch_installed():
            K.CALLS.clear()
            out = world.run_step(STAYS_UPSTREAM[reason](world, world.forward_batch()))
            assert ms.get_plan(world.backend) is None and not K.CALLS.decode
    for layer in out:
        assert torch.equal(out[layer], base[layer])
    assert counters.snapshot()["fallbacks"][ms.PATCH_ID] == {reason: 1}


def test_speculative_steps_that_are_not_mixed_steps_stay_upstreams():
    """A 1-token EXTEND of decode rows (what DP attention relabels a decode batch to) under
    speculative state: decode steps of a speculative deployment are verify steps, not this."""
    step = K.Step(prefill=[], decode=[40, 257, 600], padding=5, seed=82)
    kw = dict(mode=ForwardMode.EXTEND, num_decode_attr=len(step.decode))
    with K.reference_world("H200"):
        world = K.World(step)
        with K.patch_installed():
            K.CALLS.clear()
            world.run_step(speculative(world, world.forward_batch(**kw)))
            assert ms.get_plan(world.backend) is None and not K.CALLS.decode
    assert counters.snapshot()["fallbacks"][ms.PATCH_ID] == {"spec": 1}


def _deployment(algorithm, mixed_chunk=True):
    facts = SimpleNamespace(
        deepseek_v4=True,
        model_type="deepseek_v4",
        dsv4_attn_backend="flashmla",
        speculative_algorithm=algorithm,
        context_parallel=False,
        hisparse=False,
        mixed_chunk=mixed_chunk,
        attn_dp_size=8,
    )
    return SimpleNamespace(
        facts=facts, gpu_sm_major=9, prefill=SimpleNamespace(backend="eager", buckets=[])
    )


def test_plan_says_whether_a_speculative_deployments_mixed_steps_split(monkeypatch):
    monkeypatch.delenv("SGLANG_EXPERIMENTAL_ONLINE_C128_MTP", raising=False)
    for algorithm in ("EAGLE", "NEXTN"):
        text = ms.explain_for_deployment(_deployment(algorithm))
        assert text.startswith("splits mixed steps") and "1-token decodes" in text, text
        assert "in eager steps" in text and "draft model's forwards keep upstream's" in text
    text = ms.explain_for_deployment(_deployment("EAGLE3"))
    assert text.startswith("nothing to split: SGLang refuses EAGLE3 for DeepSeek-V4"), text
    assert "set_eagle3_layers_to_capture" in text
    for algorithm in ("DFLASH", "DSPARK"):
        text = ms.explain_for_deployment(_deployment(algorithm))
        assert text == f"falls back to upstream: {ms.FALLBACK_REASONS['spec']}"
    text = ms.explain_for_deployment(_deployment("EAGLE", mixed_chunk=False))
    assert "nothing to split" in text
    monkeypatch.setenv("SGLANG_OPT_USE_ONLINE_COMPRESS", "1")
    monkeypatch.setenv("SGLANG_EXPERIMENTAL_ONLINE_C128_MTP", "1")
    text = ms.explain_for_deployment(_deployment("EAGLE"))
    assert text == f"falls back to upstream: {ms.FALLBACK_REASONS['spec_online_c128']}"
