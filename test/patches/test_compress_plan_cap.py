"""compress_plan_cap on CPU, on upstream's real classes: ``DeepseekV4AttnBackend`` (its
``CompressorBackendMixin._get_paged_compress_metadata`` and ``_forward_compress_all_in_one``),
``CompressorPrefillPlan`` / ``CompressorDecodePlan``, ``ReqToTokenPool``, the breakable-graph
context (``enable_breakable_cuda_graph``) and ``PrefillCudaGraphRunner``. Stand-ins: the plan
bytes (laid out as upstream's planner lays them: valid rows first, 0xFF rows after), the JIT
compressor kernels (recorders of the plan they are handed) and the runner's own eligibility
checks before the patch's (a switch)."""

from __future__ import annotations

import types

import pytest
import torch
from sglang.kernels.ops.attention.dsv4.compress import (
    CompressorDecodePlan,
    CompressorPrefillPlan,
)
from sglang.srt.layers.attention.deepseek_v4_backend import DeepseekV4AttnBackend
from sglang.srt.layers.attention.dsv4 import compressor_v2
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import PrefillCudaGraphRunner
from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
    enable_breakable_cuda_graph,
)
from sglang.srt.plugins.hook_registry import HookRegistry

from sglang_mixgraph import counters
from sglang_mixgraph import upstream_attrs as attrs
from sglang_mixgraph.core.compress_events import plan_cap
from sglang_mixgraph.kits.install import installed
from sglang_mixgraph.patches import compress_plan_cap as cap
from sglang_mixgraph.registry import evaluate, resolve_target

FLAG = cap.FLAG.name
BUCKET, SLOTS = 2816, 272  # the rank slice's bucket and request slots


def prefill_plan(ratio: int, rows: int, valid: int, seed: int = 0) -> CompressorPrefillPlan:
    """A plan of ``rows`` rows as the planner writes it: ``valid`` rows first, then invalid."""
    g = torch.Generator().manual_seed(seed)
    plan_c = torch.full((rows, 16), 0xFF, dtype=torch.uint8)
    plan_c[:valid] = torch.randint(0, 200, (valid, 16), generator=g, dtype=torch.uint8)
    plan_w = torch.randint(0, 200, (rows, 8), generator=g, dtype=torch.uint8)
    return CompressorPrefillPlan(ratio, plan_c, plan_w)


def backend(slots: int = SLOTS, plans: dict | None = None) -> DeepseekV4AttnBackend:
    """Upstream's backend class, built as upstream's test kits build it (object.__new__ plus the
    attributes the path reads): its request pool and its current metadata's plans."""
    b = object.__new__(DeepseekV4AttnBackend)
    pool = ReqToTokenPool(size=slots, max_context_len=8, device="cpu", enable_memory_saver=False)
    b.model_runner = types.SimpleNamespace(req_to_token_pool=pool)
    plans = plans or {4: prefill_plan(4, BUCKET, 700), 128: prefill_plan(128, BUCKET, 21, 1)}
    # The step's per-token output locations: one per query row, as the plan's rows.
    rows = {r: p.plan_c.shape[0] for r, p in plans.items() if isinstance(p, CompressorPrefillPlan)}
    b.forward_metadata = types.SimpleNamespace(
        c4_compress_metadata=plans.get(4),
        c128_compress_metadata=plans.get(128),
        core_attn_metadata=types.SimpleNamespace(
            **{f"c{r}_out_loc": torch.zeros(n, dtype=torch.int64) for r, n in rows.items()}
        ),
    )
    b.forward_metadata.core_metadata = b.forward_metadata.core_attn_metadata
    return b


@pytest.fixture(autouse=True)
def _counters():
    counters.reset()


def test_a_breakable_capture_gets_the_capped_view_of_the_same_storage():
    b = backend()
    with installed((cap.PATCH,), {FLAG: "1"}) as (status,):
        assert status.state == "active"
        with enable_breakable_cuda_graph():
            c128 = b._get_paged_compress_metadata(128)
            c4 = b._get_paged_compress_metadata(4)
            again = b._get_paged_compress_metadata(128)  # the next layer: the same cap
        outside = b._get_paged_compress_metadata(128)
    full128, full4 = (
        b.forward_metadata.c128_compress_metadata,
        b.forward_metadata.c4_compress_metadata,
    )
    assert c128.plan_c.shape == (291, 16) and c4.plan_c.shape == (908, 16)
    assert again.plan_c.shape == c128.plan_c.shape
    for capped, full in ((c128, full128), (c4, full4)):
        assert capped.plan_c.data_ptr() == full.plan_c.data_ptr()
        assert torch.equal(capped.plan_c, full.plan_c[: capped.plan_c.shape[0]])
        assert capped.plan_w is full.plan_w  # the write plan stays whole
        assert capped.compress_ratio == full.compress_ratio
    assert outside is full128  # no breakable graph: upstream's plan
    # Upstream's replay refresh (a full-size copy_) reaches the view: it is the same storage.
    fresh = prefill_plan(128, BUCKET, 250, seed=9)
    full128.copy_(fresh)
    assert torch.equal(c128.plan_c, fresh.plan_c[:291])
    assert b.__dict__[attrs.BACKEND_COMPRESS_PLAN_CAPS] == {4: SLOTS, 128: SLOTS}
    assert counters.get(cap.PATCH_ID, "plans_capped.c128") == 2
    assert counters.get(cap.PATCH_ID, "plans_capped.c4") == 1


def test_the_compressor_kernels_are_handed_the_capped_plan(monkeypatch):
    """Upstream's ``_forward_compress_all_in_one`` passes the hook's plan to both kernels."""
    seen = []

    def compress_forward(*, plan, kv_score_input, head_dim, **kw):
        seen.append(("compress", plan.plan_c.shape[0], plan.plan_w.shape[0]))
        return kv_score_input.new_empty((plan.plan_c.shape[0], head_dim))

    def norm_rope_store(kv, plan, **kw):
        seen.append(("store", kv.shape[0], plan.plan_c.shape[0]))

    monkeypatch.setattr(compressor_v2, "compress_forward", compress_forward)
    monkeypatch.setattr(compressor_v2, "compress_norm_rope_store", norm_rope_store)
    b = backend()
    args = dict(
        kv_score_buffer=torch.zeros(2 * 128, 1024),
        kv_score_input=torch.zeros(BUCKET, 1024),
        ape=torch.zeros(128, 512),
        head_dim=512,
        norm=types.SimpleNamespace(weight=torch.ones(512), variance_epsilon=1e-6),
        freqs_cis_cache=torch.zeros(8, 256),
        kv_cache=torch.zeros(4, 8, dtype=torch.uint8),
        is_indexer=False,
        rotate=False,
        compress_ratio=128,
        page_size=64,
        out_loc=torch.zeros(BUCKET, dtype=torch.int64),
    )
    with installed((cap.PATCH,), {FLAG: "1"}):
        with enable_breakable_cuda_graph():
            b._forward_compress_all_in_one(**args)
        b._forward_compress_all_in_one(**args)
    assert seen == [
        ("compress", 291, BUCKET),
        ("store", 291, 291),
        ("compress", BUCKET, BUCKET),
        ("store", BUCKET, BUCKET),
    ]


def test_plans_it_does_not_cap(monkeypatch):
    decode = CompressorDecodePlan(128, torch.zeros(5, 16, dtype=torch.uint8))
    small = prefill_plan(4, 16, 3)  # (16 + 3*16)//4 = 16: the cap keeps every row
    b = backend(plans={128: decode, 4: small})
    with installed((cap.PATCH,), {FLAG: "1"}), enable_breakable_cuda_graph():
        assert b._get_paged_compress_metadata(128) is decode
        assert b._get_paged_compress_metadata(4) is small
    assert counters.snapshot().get("fallbacks", {}).get(cap.PATCH_ID) is None

    # Online c128 builds its own (compact) plan: left alone and said once.
    monkeypatch.setenv("SGLANG_OPT_USE_ONLINE_COMPRESS", "1")
    b = backend()
    with installed((cap.PATCH,), {FLAG: "1"}), enable_breakable_cuda_graph():
        assert b._get_paged_compress_metadata(128) is b.forward_metadata.c128_compress_metadata
        assert b._get_paged_compress_metadata(4).plan_c.shape[0] == 908
    assert counters.get_fallback(cap.PATCH_ID, "online") == 1

    # An exact host plan (its rows are the batch's events, not its query rows): left whole.
    exact = CompressorPrefillPlan(4, torch.zeros(21, 16, dtype=torch.uint8), torch.zeros(9, 8))
    b = backend(plans={4: prefill_plan(4, BUCKET, 21)})
    b.forward_metadata.c4_compress_metadata = exact
    with installed((cap.PATCH,), {FLAG: "1"}), enable_breakable_cuda_graph():
        assert b._get_paged_compress_metadata(4) is exact
    assert counters.get_fallback(cap.PATCH_ID, "exact_plan") == 1

    # No request pool to bound the batch: upstream's plan.
    b = backend()
    b.model_runner = types.SimpleNamespace()
    with installed((cap.PATCH,), {FLAG: "1"}), enable_breakable_cuda_graph():
        assert b._get_paged_compress_metadata(4) is b.forward_metadata.c4_compress_metadata
    assert counters.get_fallback(cap.PATCH_ID, "no_pool") == 1


def test_the_backend_graph_batch_limit_tightens_the_cap():
    b = backend()
    b.prefill_cuda_graph_max_batch_size = 64
    with installed((cap.PATCH,), {FLAG: "1"}), enable_breakable_cuda_graph():
        assert b._get_paged_compress_metadata(128).plan_c.shape[0] == plan_cap(BUCKET, 128, 64)
    assert b.__dict__[attrs.BACKEND_COMPRESS_PLAN_CAPS] == {128: 64}


def test_flag_off_never_touches_upstream():
    before = {h.target: resolve_target(h.target)[2] for h in cap.HOOKS}
    b = backend()
    with installed((cap.PATCH,), {FLAG: "0"}) as (status,):
        assert status.state == "off" and status.checks == []
        assert {h.target: resolve_target(h.target)[2] for h in cap.HOOKS} == before
        assert not any(h.target in HookRegistry._hooks for h in cap.HOOKS)
        with enable_breakable_cuda_graph():
            assert b._get_paged_compress_metadata(128) is b.forward_metadata.c128_compress_metadata
    assert attrs.BACKEND_COMPRESS_PLAN_CAPS not in b.__dict__
    assert cap.FLAG.default is False
    with installed((cap.PATCH,), {FLAG: "1"}):
        assert all(resolve_target(h.target)[2] is not before[h.target] for h in cap.HOOKS)
    assert {h.target: resolve_target(h.target)[2] for h in cap.HOOKS} == before


# --- the replay check -------------------------------------------------------------------------


class Upstream:
    """The runner's own verdict before the patch's check (its DP, context and bucket rules)."""

    verdict = True

    def can_run_graph(self, forward_batch) -> bool:
        return Upstream.verdict


@pytest.fixture
def runner(monkeypatch):
    monkeypatch.setattr(PrefillCudaGraphRunner, "can_run_graph", Upstream.can_run_graph)
    monkeypatch.setattr(Upstream, "verdict", True)
    r = object.__new__(PrefillCudaGraphRunner)
    b = backend(slots=8)
    r.model_runner = types.SimpleNamespace(attn_backend=b)
    return r


def batch(seq_lens, extend_lens, dp=False):
    return types.SimpleNamespace(
        seq_lens_cpu=torch.tensor(seq_lens),
        extend_seq_lens_cpu=list(extend_lens),
        global_num_tokens_cpu=[sum(extend_lens)] * 2 if dp else None,
    )


def capture(runner, *ratios):
    with enable_breakable_cuda_graph():
        for r in ratios:
            runner.model_runner.attn_backend._get_paged_compress_metadata(r)


def worst(n, ratio=4, long=200):
    """n requests on a window's last position: n - 1 one-token rows and one long extend."""
    ext = [1] * (n - 1) + [long]
    return [ratio - 1 + e for e in ext], ext


def test_replays_within_the_bound_run_and_over_it_run_eagerly(runner):
    with installed((cap.PATCH,), {FLAG: "1"}):
        assert runner.can_run_graph(batch(*worst(20))) is True  # nothing capped yet: upstream
        capture(runner, 4, 128)
        assert runner.can_run_graph(batch(*worst(8))) is True  # the bound: 8 request slots
        assert runner.can_run_graph(batch([4096, 700, 9], [2000, 1, 9])) is True
        assert counters.get(cap.PATCH_ID, "batches_checked") == 2
        # More requests than the pool holds (an upstream invariant broken): eager, said once.
        assert runner.can_run_graph(batch(*worst(12))) is False
        assert runner.can_run_graph(batch(*worst(12))) is False
        assert counters.get_fallback(cap.PATCH_ID, "over_cap") == 2
        assert (
            runner.can_run_graph(
                types.SimpleNamespace(
                    seq_lens_cpu=None, extend_seq_lens_cpu=None, global_num_tokens_cpu=None
                )
            )
            is False
        )
        assert counters.get_fallback(cap.PATCH_ID, "no_lens") == 1
        # Upstream's own refusal stands, unchecked.
        Upstream.verdict = False
        assert runner.can_run_graph(batch(*worst(12))) is False
        assert counters.get_fallback(cap.PATCH_ID, "over_cap") == 2


def test_an_over_cap_batch_after_the_dp_vote_stops_with_the_reason(runner):
    with installed((cap.PATCH,), {FLAG: "1"}):
        capture(runner, 4)
        assert runner.can_run_graph(batch(*worst(8), dp=True)) is True
        with pytest.raises(RuntimeError, match="SGLANG_MIXGRAPH_BCG_COMPRESS_PLAN_CAP=0"):
            runner.can_run_graph(batch(*worst(12), dp=True))


def test_flag_off_replays_are_upstream(runner):
    runner.model_runner.attn_backend.__dict__[attrs.BACKEND_COMPRESS_PLAN_CAPS] = {4: 1}
    with installed((cap.PATCH,), {FLAG: "0"}):
        assert runner.can_run_graph(batch(*worst(12))) is True
    assert counters.snapshot().get("fallbacks", {}).get(cap.PATCH_ID) is None


def test_a_moved_target_fails_the_check(monkeypatch):
    monkeypatch.delattr(compressor_v2, "_use_online_compress")
    monkeypatch.setenv(FLAG, "1")
    status = evaluate(cap.PATCH)
    assert status.state == "cannot apply"
    assert f"{cap.COMPRESSOR_MODULE}._use_online_compress" in status.error


@pytest.mark.parametrize(
    "v4, backend_name, buckets, says",
    [
        (False, "breakable", (64,), "not a DeepSeek-V4 model"),
        (True, "disabled", (), "no breakable prefill graph"),
        (True, "breakable", (2816,), "breakable prefill captures launch"),
    ],
)
def test_plan_note(v4, backend_name, buckets, says):
    plan = types.SimpleNamespace(
        facts=types.SimpleNamespace(deepseek_v4=v4),
        prefill=types.SimpleNamespace(backend=backend_name, buckets=buckets),
    )
    assert cap.explain_for_deployment(plan).startswith(says)
