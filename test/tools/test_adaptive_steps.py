"""tools/rank-slice/adaptive_steps.py: the burst's MIXED steps as SGLang 0.5.23's scheduler makes
them (checked against a served run's counts), each priced by the split's own decision."""

from __future__ import annotations

import pytest
from tool_scripts import load

from sglang_mixgraph.core import split_cost_model as scm
from sglang_mixgraph.core.mixed_step_counts import StepCounts

load("slice_arms")  # the script imports it by name, as when run from its folder
S = load("adaptive_steps")


def test_the_faithful_2k_runs_step_count_and_prefill_tokens():
    """docs/results/rank_slice_serving_h200.md: the faithful 2k run (272 prompts of 2048, 200 out)
    had 217 MIXED steps of 554,240 prefill tokens: 216 x 2560 and one last step of 1280."""
    steps = S.served_steps(272, 2048, 200)
    prefill = [s.rows - s.num_decode for s in steps]
    assert len(steps) == 217 and sum(prefill) == 554_240
    assert prefill[:-1] == [2560] * 216 and prefill[-1] == 1280


def test_rows_follow_the_page_floor_or_fill_the_chunk():
    """2k prompts: 2560 + d rows (the page floor of C - d); a prompt longer than C - d
    continuing: exactly C rows; never more than C, never more than R - 1 running when
    admitting."""
    for s in S.served_steps(96, 2048, 256)[:-1]:
        assert s.rows == 2560 + s.num_decode
    long = S.served_steps(4, 20_000, 64)
    assert any(s.rows == S.CHUNK for s in long)
    for s in S.served_steps(300, 2048, 512):
        assert s.rows <= S.CHUNK and s.num_decode < S.RUNNING


def test_a_shared_prefix_leaves_only_the_rest_to_prefill_at_the_whole_context():
    """Every request after the first prefills its last 512 tokens on top of the cached 7680
    (in page-floored chunks where the budget ends); its rows see the whole context."""
    steps = S.served_steps(8, 8192, 16, shared_prefix=7680)
    prefill = [
        (seq, ext)
        for s in steps
        for seq, ext in zip(
            s.seq_lens, s.extend_lens[: len(s.extend_lens) - s.num_decode], strict=False
        )
    ]
    assert prefill and all(7680 < seq <= 8192 and ext <= 512 for seq, ext in prefill)
    # The first prompt runs alone (2816 + 2816 + 2560 tokens, no decode rows yet: not MIXED); its
    # last step's page left admits 256 tokens of the second, so MIXED steps carry the rest.
    assert sum(ext for _, ext in prefill) == 7 * 512 - 256


def test_the_share_is_the_splits_own_decision_step_by_step():
    steps = S.served_steps(272, 8192, 200, shared_prefix=6144)
    mix = S.layer_mix()
    assert sum(mix.values()) == 61 and set(mix) == {0, 4, 128}
    coeffs = scm.load_coefficients("sm90")
    for regime in (scm.EAGER, scm.REPLAY):
        want = [
            scm.decide_step(
                StepCounts.from_lists(s.seq_lens, s.extend_lens, s.num_decode, ratios=(4, 128)),
                mix,
                coeffs,
                regime=regime,
            )
            for s in steps
        ]
        assert S.split_share(steps, regime, coeffs) == (sum(want), len(steps))
    # at 2k contexts the decision keeps every MIXED step unsplit, as every served run did
    assert S.split_share(S.served_steps(272, 2048, 200), scm.REPLAY)[0] == 0


def test_another_chunk_prefills_its_page_floor_next_to_the_decode_rows():
    """With the chunk's prefill part P (chunk P + 256), steady MIXED steps prefill P tokens when
    new requests are admitted, never more rows than the chunk; the default stays 2816."""
    assert S.served_steps(272, 2048, 200) == S.served_steps(272, 2048, 200, chunk=S.CHUNK)
    for prefill in (1024, 2048, 4096):
        chunk = prefill + S.RUNNING
        steps = S.served_steps(272, 2048, 200, chunk=chunk)
        assert all(s.rows <= chunk for s in steps)
        total = sum(s.rows - s.num_decode for s in steps)
        # every prompt token but those of the steps before the first request decodes
        assert 272 * 2048 - 2 * chunk <= total < 272 * 2048
        # the steps' count follows the prefill part: the same tokens in steps of about P
        assert len(steps) == pytest.approx(total / prefill, rel=0.02)
