"""Read-done for DSV4 prefill and mixed breakable-graph replays, and the WAR snapshot check (CPU).

Upstream's real ``PrefillCudaGraphRunner._prepare_forward_metadata_for_replay`` runs on a runner
stand-in that holds only what that method reads (the backend, the captured metadata per shape,
the two mode switches); the backend, its replay prepare, the chunk-cache builder and upstream's
publisher ``maybe_publish_prefill_shared_read_done`` are upstream's own, on the CPU kit. Real
graphs are replayed on the GPU (test/gpu_upstream, test/gpu_e2e).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_mixgraph import counters
from sglang_mixgraph.kits import dsv4_cpu as K
from sglang_mixgraph.kits.install import installed

K.import_upstream()

from sglang.srt.layers.attention.base_attn_backend import SharedReadEnds  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import (  # noqa: E402
    PrefillCudaGraphRunner,
)
from sglang.srt.model_executor.runner.shape_key import ShapeKey  # noqa: E402
from sglang.srt.model_executor.runner_utils import shared_read_event  # noqa: E402

from sglang_mixgraph.patches import mixed_split as ms  # noqa: E402
from sglang_mixgraph.patches import replay_read_done as rd  # noqa: E402
from sglang_mixgraph.patches import war_snapshot_check as wc  # noqa: E402

ATOL, RTOL = 4e-3, 8e-3
MIXED = K.Step(prefill=[(60, 11)], decode=[30, 290], seed=5)  # 13 rows
EXTEND = K.Step(prefill=[(58, 13)], decode=[], seed=5)
OFF = {
    "SGLANG_OPT_DSV4_REPLAY_READ_DONE": "0",
    "SGLANG_DEBUG_WAR_SNAPSHOT": "0",
    "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN": "0",
    "SGLANG_FORCE_COARSE_WAR_BARRIER": None,
    "SGLANG_ENABLE_PREFILL_WAR_READ_DONE": None,
}
PATCHES = (ms.PATCH, rd.PATCH, wc.PATCH)


def env(**on):
    e = dict(OFF)
    e.update(on)
    return e


# Read-done, the snapshot check and the split (always) on.
SPLIT_READ_DONE = env(
    SGLANG_OPT_DSV4_REPLAY_READ_DONE="1",
    SGLANG_DEBUG_WAR_SNAPSHOT="1",
    SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN="1",
    SGLANG_MIXGRAPH_SPLIT_POLICY="always",
)


class _Event:
    def record(self):
        pass


class _Spec:
    def __init__(self, publishes=True):
        self.publishes = publishes

    def supports_prefill_shared_read_done(self):
        return self.publishes


def _replay_runner(w, step):
    """Capture metadata of ``step``'s rows and the stand-ins of the model runner and the
    prefill graph runner a breakable replay reads: (capture, model_runner, runner, bucket key)."""
    capture = w.build_metadata(w.forward_batch())
    capture.core_attn_metadata.swa_out_cache_loc = torch.zeros(step.num_rows, dtype=torch.int32)
    model_runner = SimpleNamespace(
        attn_backend=w.backend,
        spec_algorithm=_Spec(),
        shared_read_done_event=None,
        forward_pass_id=0,
    )
    key = ShapeKey(size=step.num_rows)
    runner = SimpleNamespace(
        model_runner=model_runner,
        use_captured_attn_metadata=True,
        _is_full_backend=False,
        attn_metadata_buffers={key: capture},
    )
    return capture, model_runner, runner, key


@pytest.fixture
def world():
    """(world, capture metadata, runner stand-in, replay(step, mode, rows) -> (static, ends))."""
    with K.reference_world():
        w = K.World(MIXED)
        capture, model_runner, runner, key = _replay_runner(w, MIXED)

        def replay(step, mode, rows=None, barrier=True):
            w.step = step
            if barrier:
                model_runner.shared_read_done_event = None  # the scheduler's barrier took it
            model_runner.forward_pass_id += 1
            live = w.forward_batch(mode=mode)
            static = K.replay_static_batch(live, step.num_rows, live_rows=rows)
            # Looked up at call time: the hooked method while a patch is installed.
            ends = PrefillCudaGraphRunner._prepare_forward_metadata_for_replay(
                runner, live, static, key
            )
            shared_read_event.maybe_publish_prefill_shared_read_done(
                model_runner, ends, SimpleNamespace(Event=_Event)
            )
            return static, ends

        wc.PUBLISHED.clear()  # another test's runner may have published last
        yield w, capture, runner, replay
        wc.PUBLISHED.clear()


def _layers(w, static):
    return {layer: w.run_layer(static, layer) for layer in (0, 1, 2)}


def _events(patch):
    return dict(counters.snapshot()["events"].get(patch, {}))


def _builds(w):
    """Count calls of the chunk-cache builder from here on (through every installed hook)."""
    calls = []
    cls = type(w.backend)
    hooked = cls._build_sparse_prefill_chunk_cache

    def counting(self, *a, **kw):
        calls.append(kw.get("num_qo_tokens"))
        return hooked(self, *a, **kw)

    w.backend._build_sparse_prefill_chunk_cache = counting.__get__(w.backend)
    return calls


def test_upstream_replays_never_publish(world):
    w, capture, runner, replay = world
    with installed(PATCHES, env()):
        for step, mode in ((EXTEND, ForwardMode.EXTEND), (MIXED, ForwardMode.MIXED)):
            static, ends = replay(step, mode)
            assert ends is SharedReadEnds.UNKNOWN
            assert capture.sparse_prefill_cache is None  # built lazily in the first break
            assert runner.model_runner.shared_read_done_event is None


@pytest.mark.parametrize(
    "step, mode",
    [(EXTEND, ForwardMode.EXTEND), (MIXED, ForwardMode.MIXED)],
    ids=["extend", "mixed"],
)
def test_replay_prebuilds_the_lazy_cache_and_publishes(world, step, mode):
    w, capture, runner, replay = world
    with installed(PATCHES, env()):
        base = _layers(w, replay(step, mode)[0])  # upstream: lazy build in layer 0
    label = "mixed" if mode is ForwardMode.MIXED else "extend"
    before = _events(rd.PATCH_ID)
    with installed(
        PATCHES, env(SGLANG_OPT_DSV4_REPLAY_READ_DONE="1", SGLANG_DEBUG_WAR_SNAPSHOT="1")
    ):
        builds = _builds(w)
        static, ends = replay(step, mode)
        assert ends is SharedReadEnds.PRE_REPLAY
        assert runner.model_runner.shared_read_done_event is not None
        # Built at prepare, for the rows the attention break sees (the lazy build's count).
        assert builds == [step.num_rows]
        cache = capture.sparse_prefill_cache
        out = _layers(w, static)  # the snapshot check is on: a build here would raise
        assert builds == [step.num_rows] and capture.sparse_prefill_cache is cache
    after = _events(rd.PATCH_ID)
    published = f"replays_published.{label}"
    assert after.get(published, 0) == before.get(published, 0) + 1
    assert after.get("caches_prebuilt", 0) == before.get("caches_prebuilt", 0) + 1
    for layer in out:
        assert torch.equal(out[layer], base[layer])


def test_split_replay_publishes_with_the_plans_cache(world):
    w, capture, runner, replay = world
    with installed(PATCHES, env()):
        base = _layers(w, replay(MIXED, ForwardMode.MIXED)[0])
    with installed(PATCHES, SPLIT_READ_DONE):
        builds = _builds(w)
        static, ends = replay(MIXED, ForwardMode.MIXED)
        plan = ms.get_plan(w.backend)
        assert ends is SharedReadEnds.PRE_REPLAY and plan is not None and plan.matches(static)
        # The step's one chunk cache, the plan's prefill-only one; the read-done patch adds
        # none, the layers none.
        assert builds == [MIXED.num_rows] and capture.sparse_prefill_cache is plan.prefill_cache
        assert plan.prefill_cache.num_reqs == len(MIXED.prefill)
        out = _layers(w, static)
        assert len(builds) == 1
    assert plan.decode_calls == {0: 1, 4: 1, 128: 1}
    for layer in out:
        torch.testing.assert_close(out[layer].float(), base[layer].float(), atol=ATOL, rtol=RTOL)


def test_heads_the_plan_refuses_leave_the_replay_to_upstream_with_one_cache(world):
    """A model whose queries have 32 heads (not a decode-kernel head count): the replay's plan
    sees it in the model's config and falls back before anything is built, so the read-done
    patch pre-builds upstream's own cache before the publish, the layers build nothing (the
    snapshot check is on) and the output is upstream's, bit for bit."""
    w, capture, runner, replay = world
    w.backend.model_runner.model_config.hf_text_config.num_attention_heads = 32

    def layers(static):
        q = w.q(heads=32)
        return {layer: w.run_layer(static, layer, q=q) for layer in (0, 1, 2)}

    with installed(PATCHES, env()):
        base = layers(replay(MIXED, ForwardMode.MIXED)[0])  # upstream: lazy build, no publish
    heads = counters.get_fallback(ms.PATCH_ID, "heads")
    with installed(PATCHES, SPLIT_READ_DONE):
        builds = _builds(w)
        static, ends = replay(MIXED, ForwardMode.MIXED)
        assert ends is SharedReadEnds.PRE_REPLAY and ms.get_plan(w.backend) is None
        assert wc.PUBLISHED.active() is not None
        assert builds == [MIXED.num_rows]  # the read-done patch's, before the publish
        out = layers(static)  # raises WarSnapshotViolation on a build after the publish
        assert builds == [MIXED.num_rows]
    assert counters.get_fallback(ms.PATCH_ID, "heads") == heads + 1
    for layer in out:
        assert torch.equal(out[layer], base[layer]), layer


def test_a_layer_contradicting_the_plan_after_the_publish_raises_and_reads_no_table(world):
    """Were a replayed layer to differ from what the plan checked (queries of 32 heads where
    the model's config says 64: the installed SGLang changed under the patch), going back to
    upstream would make its lazy build read the shared tables after the publish. No fallback
    cache is built for that: the layer raises before it builds or launches anything."""
    w, capture, runner, replay = world
    violations = _events(wc.PATCH_ID).get("violations", 0)
    with installed(PATCHES, SPLIT_READ_DONE):
        static, ends = replay(MIXED, ForwardMode.MIXED)
        plan = ms.get_plan(w.backend)
        assert ends is SharedReadEnds.PRE_REPLAY and plan is not None and plan.may_publish
        assert wc.PUBLISHED.active() is not None
        builds = _builds(w)
        K.CALLS.clear()
        with pytest.raises(ms.SplitPlanError):
            w.run_layer(static, 0, q=w.q(heads=32))
        assert builds == [] and not K.CALLS.sparse_rows and not K.CALLS.decode
    assert _events(wc.PATCH_ID).get("violations", 0) == violations


def test_without_read_done_an_abandoned_plan_keeps_upstreams_lazy_build(world):
    """Where nothing can be published (the coarse barrier), a layer that contradicts the plan
    abandons it and upstream's lazy build covers every row: upstream's output, bit for bit."""
    w, capture, runner, replay = world

    def layers(static):
        q = w.q(heads=32)
        return {layer: w.run_layer(static, layer, q=q) for layer in (0, 1, 2)}

    with installed(PATCHES, env()):
        base = layers(replay(MIXED, ForwardMode.MIXED)[0])
    on = env(
        SGLANG_OPT_DSV4_REPLAY_READ_DONE="1",
        SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN="1",
        SGLANG_MIXGRAPH_SPLIT_POLICY="always",
        SGLANG_FORCE_COARSE_WAR_BARRIER="1",
    )
    with installed(PATCHES, on):
        static, ends = replay(MIXED, ForwardMode.MIXED)
        plan = ms.get_plan(w.backend)
        assert ends is SharedReadEnds.UNKNOWN and plan is not None and not plan.may_publish
        builds = _builds(w)
        out = layers(static)
        assert ms.get_plan(w.backend) is None and builds == [MIXED.num_rows]
    for layer in out:
        assert torch.equal(out[layer], base[layer]), layer


def test_idle_rank_publishes_without_building(world):
    w, capture, runner, replay = world
    with installed(PATCHES, env(SGLANG_OPT_DSV4_REPLAY_READ_DONE="1")):
        builds = _builds(w)
        _, ends = replay(MIXED, ForwardMode.MIXED, rows=0)
    assert ends is SharedReadEnds.PRE_REPLAY and builds == []
    assert capture.sparse_prefill_cache is None


@pytest.mark.parametrize(
    "gate, reason",
    [
        ({"SGLANG_FORCE_COARSE_WAR_BARRIER": "1"}, "coarse"),
        ({"SGLANG_ENABLE_PREFILL_WAR_READ_DONE": "0"}, "upstream_off"),
    ],
)
def test_upstream_gates_keep_the_coarse_barrier(world, gate, reason):
    w, capture, runner, replay = world
    before = counters.get_fallback(rd.PATCH_ID, reason)
    with installed(PATCHES, env(SGLANG_OPT_DSV4_REPLAY_READ_DONE="1", **gate)):
        _, ends = replay(MIXED, ForwardMode.MIXED)
    assert ends is SharedReadEnds.UNKNOWN and capture.sparse_prefill_cache is None
    assert runner.model_runner.shared_read_done_event is None
    assert counters.get_fallback(rd.PATCH_ID, reason) == before + 1


def test_unpublished_read_done_is_reported(world):
    """Upstream's publisher declines (a speculative algorithm without prefill read-done): the
    replay is counted as a fallback, not as published."""
    w, capture, runner, replay = world
    runner.model_runner.spec_algorithm = _Spec(publishes=False)
    before = counters.get_fallback(rd.PATCH_ID, "not_published")
    published = _events(rd.PATCH_ID).get("replays_published.mixed", 0)
    with installed(PATCHES, env(SGLANG_OPT_DSV4_REPLAY_READ_DONE="1")):
        _, ends = replay(MIXED, ForwardMode.MIXED)
    assert ends is SharedReadEnds.PRE_REPLAY
    assert counters.get_fallback(rd.PATCH_ID, "not_published") == before + 1
    assert _events(rd.PATCH_ID).get("replays_published.mixed", 0) == published


def test_flags_off_leave_upstream_untouched():
    targets = {h.target for p in (rd.PATCH, wc.PATCH) for h in p.hooks}
    from sglang_mixgraph.registry import resolve_target

    raw = {t: resolve_target(t)[2] for t in targets}
    with installed((rd.PATCH, wc.PATCH), env()) as statuses:
        assert [s.enabled for s in statuses] == [False, False]
        assert {t: resolve_target(t)[2] for t in targets} == raw


@pytest.mark.parametrize("name", ["SGLANG_OPT_DSV4_REPLAY_READ_DONE", "SGLANG_DEBUG_WAR_SNAPSHOT"])
def test_flags_are_strict(name):
    from sglang_mixgraph.registry import PatchCheckError

    with pytest.raises(PatchCheckError, match=name):
        with installed((rd.PATCH, wc.PATCH), env(**{name: "yes please"})):
            pass


# --------------------------------------------------------------------------------------------
# the WAR snapshot check
# --------------------------------------------------------------------------------------------


def test_lazy_build_after_publish_is_caught_before_it_reads(world):
    """Without the replay snapshot, upstream builds the chunk cache in the first attention
    break; were read-done published for that forward, the check stops the build before it
    reads anything."""
    w, capture, runner, replay = world
    before = _events(wc.PATCH_ID).get("violations", 0)
    with installed(PATCHES, env(SGLANG_DEBUG_WAR_SNAPSHOT="1")):
        static, ends = replay(MIXED, ForwardMode.MIXED)
        assert ends is SharedReadEnds.UNKNOWN
        # As if this forward had published read-done (upstream's publisher, PRE_REPLAY).
        shared_read_event.maybe_publish_prefill_shared_read_done(
            runner.model_runner, SharedReadEnds.PRE_REPLAY, SimpleNamespace(Event=_Event)
        )
        with pytest.raises(wc.WarSnapshotViolation) as e:
            w.run_layer(static, 0)
        assert capture.sparse_prefill_cache is None  # nothing was built
        msg = str(e.value)
        assert "DeepseekV4AttnBackend._build_sparse_prefill_chunk_cache" in msg
        assert f"forward #{runner.model_runner.forward_pass_id}" in msg
        with pytest.raises(wc.WarSnapshotViolation, match="translate_loc_from_full_to_swa"):
            w.backend.token_to_kv_pool.translate_loc_from_full_to_swa(static.out_cache_loc)
        # The scheduler's barrier ends the mark (upstream's method, barrier itself off here).
        Scheduler._apply_war_barrier(SimpleNamespace(_war_barrier_enabled=False))
        w.run_layer(static, 0)
    assert _events(wc.PATCH_ID)["violations"] == before + 2


def test_the_next_forward_ends_the_mark(world):
    w, capture, runner, replay = world
    with installed(
        PATCHES, env(SGLANG_OPT_DSV4_REPLAY_READ_DONE="1", SGLANG_DEBUG_WAR_SNAPSHOT="1")
    ):
        static, _ = replay(MIXED, ForwardMode.MIXED)
        with pytest.raises(wc.WarSnapshotViolation):
            w.backend.token_to_kv_pool.translate_loc_from_full_to_swa(static.out_cache_loc)
        runner.model_runner.forward_pass_id += 1
        w.backend.token_to_kv_pool.translate_loc_from_full_to_swa(static.out_cache_loc)


def test_a_stale_event_is_neither_counted_nor_marked(world):
    """Without the scheduler's WAR barrier (its non-overlap loop) the mailbox keeps the last
    event; a replay whose publish upstream declines must not be taken as published."""
    w, capture, runner, replay = world
    runner.model_runner.spec_algorithm = _Spec(publishes=False)
    stale = _Event()
    published = _events(rd.PATCH_ID).get("replays_published.mixed", 0)
    marked = _events(wc.PATCH_ID).get("forwards_marked", 0)
    with installed(
        PATCHES, env(SGLANG_OPT_DSV4_REPLAY_READ_DONE="1", SGLANG_DEBUG_WAR_SNAPSHOT="1")
    ):
        runner.model_runner.shared_read_done_event = stale
        static, ends = replay(MIXED, ForwardMode.MIXED, barrier=False)
        assert ends is SharedReadEnds.PRE_REPLAY
        assert runner.model_runner.shared_read_done_event is stale
        assert wc.PUBLISHED.active() is None
        w.backend.token_to_kv_pool.translate_loc_from_full_to_swa(static.out_cache_loc)
    assert _events(rd.PATCH_ID).get("replays_published.mixed", 0) == published
    assert _events(wc.PATCH_ID).get("forwards_marked", 0) == marked


# --------------------------------------------------------------------------------------------
# one row count: the split's replay plan and the read-done snapshot size what the break sees
# --------------------------------------------------------------------------------------------

BUCKET = K.Step(prefill=[(60, 11)], decode=[30, 290], padding=3, seed=5)  # MIXED in 16 rows


@pytest.fixture
def padded_world():
    """MIXED's 13 live rows replayed in a 16-row bucket: (world, capture, runner,
    replay(non_padded) -> (static, ends)); ``non_padded`` is the static batch's
    ``global_num_token_non_padded_cpu`` (None: not set)."""
    with K.reference_world():
        w = K.World(BUCKET)  # the bucket's metadata rows (K.World.build_metadata reads w.step)
        capture, model_runner, runner, key = _replay_runner(w, BUCKET)

        def replay(non_padded):
            model_runner.shared_read_done_event = None
            model_runner.forward_pass_id += 1
            w.step = MIXED
            live = w.forward_batch(mode=ForwardMode.MIXED)  # 13 rows, no padding
            w.step = BUCKET
            static = K.replay_static_batch(live, BUCKET.num_rows)
            static.global_num_token_non_padded_cpu = non_padded
            ends = PrefillCudaGraphRunner._prepare_forward_metadata_for_replay(
                runner, live, static, key
            )
            shared_read_event.maybe_publish_prefill_shared_read_done(
                model_runner, ends, SimpleNamespace(Event=_Event)
            )
            return static, ends

        wc.PUBLISHED.clear()
        yield w, capture, runner, replay
        wc.PUBLISHED.clear()


def _breaks(w, static):
    """Each layer through upstream's own attention break (``deepseek_v4_attention_with_output``,
    which slices to ``global_num_token_non_padded_cpu``) on the bucket's query rows."""
    from sglang.srt.environ import envs
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph import (
        context_manager as tcp,
    )
    from sglang.srt.models.deepseek_v4 import deepseek_v4_attention_with_output

    # The op is registered for CUDA only; its Python body (what the CUDA op runs) is the
    # wrapped function (``sglang.srt.utils.custom_op._call_directly_in_eager``).
    attention_break = deepseek_v4_attention_with_output.__wrapped__
    q, sink = w.q(), w.attn_sink()
    layers = [
        SimpleNamespace(layer_id=i, v_head_dim=512, tp_q_head_num=q.shape[1])
        for i in range(len(K.LAYER_RATIOS))
    ]
    out = {}
    with (
        torch.no_grad(),
        forward_context(ForwardContext(attn_backend=w.backend)),
        tcp.set_tc_piecewise_forward_context(static, layers, None, [], []),
        envs.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL.override(True),
    ):
        for i, ratio in enumerate(K.LAYER_RATIOS):
            o = torch.full_like(q, float("nan"))
            attention_break(q, q, o, i, ratio, sink, False)
            out[i] = o
    return out


@pytest.mark.parametrize("non_padded", [None, MIXED.num_rows], ids=["unset", "set"])
def test_split_and_read_done_size_the_rows_the_break_sees(padded_world, non_padded):
    """``global_num_token_non_padded_cpu`` None: the break keeps the whole bucket (16 rows), set:
    the 13 live rows. The split's replay plan and the read-done patch use that one count, so the
    plan holds through every layer, nothing is built after read-done is published, and the
    output equals the unsplit replay's."""
    w, capture, runner, replay = padded_world
    expected = BUCKET.num_rows if non_padded is None else MIXED.num_rows
    with installed(PATCHES, env()):
        base = _breaks(w, replay(non_padded)[0])  # upstream alone: lazy build in layer 0
    abandoned = counters.get_fallback(ms.PATCH_ID, "shape")
    with installed(PATCHES, SPLIT_READ_DONE):
        builds = _builds(w)
        static, ends = replay(non_padded)
        plan = ms.get_plan(w.backend)
        assert ends is SharedReadEnds.PRE_REPLAY and plan is not None and plan.matches(static)
        assert plan.boundary.num_rows == rd.attention_rows(static) == expected
        assert (plan.boundary.b0, plan.boundary.decode_end) == (11, 13)
        # The step's one chunk cache (prefill only) for the rows the break sees.
        assert builds == [expected] and capture.sparse_prefill_cache is plan.prefill_cache
        out = _breaks(w, static)  # a build after the publish would raise (the check is on)
        assert ms.get_plan(w.backend) is plan and builds == [expected]
    assert counters.get_fallback(ms.PATCH_ID, "shape") == abandoned
    assert plan.decode_calls == {0: 1, 4: 1, 128: 1}
    live = MIXED.num_rows
    for layer in out:
        assert not out[layer].isnan().any()
        torch.testing.assert_close(
            out[layer][:live].float(), base[layer][:live].float(), atol=ATOL, rtol=RTOL
        )
        assert torch.equal(out[layer][:11], base[layer][:11])  # the prefill rows, bit for bit
        if non_padded is not None:
            assert torch.equal(out[layer][live:], base[layer][live:])  # zeroed by the break


@pytest.mark.parametrize("non_padded, rows", [(None, 16), (13, 13), (0, 0), (20, 16)])
def test_the_patch_counts_the_rows_the_break_slices_to(non_padded, rows):
    """The replay prepare sizes its chunk cache for ``query[:global_num_token_non_padded_cpu]``
    of the bucket (``core.attention_rows``, test/core/test_attention_rows.py)."""
    batch = SimpleNamespace(input_ids=torch.zeros(16), global_num_token_non_padded_cpu=non_padded)
    assert rd.attention_rows(batch) == rows
