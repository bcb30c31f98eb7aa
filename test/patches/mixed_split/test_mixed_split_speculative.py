"""The split under speculative decoding (CPU, upstream's DSV4 backend and its real spec
objects): a MIXED step of EAGLE or EAGLE3 (MTP), whose running requests are plain 1-token
decodes, splits and equals the unsplit step; verify, draft, other algorithms and online c128
MTP keep upstream's path, each counted under its own reason; `plan` says which.
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


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3", "NEXTN"])
def test_a_mixed_step_of_eagle_splits_and_equals_the_unsplit_step(algorithm):
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
    for algorithm in ("EAGLE", "NEXTN", "EAGLE3"):
        text = ms.explain_for_deployment(_deployment(algorithm))
        assert text.startswith("splits mixed steps") and "1-token decodes" in text, text
    for algorithm in ("DFLASH", "DSPARK"):
        text = ms.explain_for_deployment(_deployment(algorithm))
        assert text == f"falls back to upstream: {ms.FALLBACK_REASONS['spec']}"
    text = ms.explain_for_deployment(_deployment("EAGLE", mixed_chunk=False))
    assert "nothing to split" in text
    monkeypatch.setenv("SGLANG_OPT_USE_ONLINE_COMPRESS", "1")
    monkeypatch.setenv("SGLANG_EXPERIMENTAL_ONLINE_C128_MTP", "1")
    text = ms.explain_for_deployment(_deployment("EAGLE"))
    assert text == f"falls back to upstream: {ms.FALLBACK_REASONS['spec_online_c128']}"
