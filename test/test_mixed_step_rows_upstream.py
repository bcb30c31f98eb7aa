"""How many rows a steady MIXED step has on SGLang 0.5.23, from upstream's own PrefillAdder (CPU).

The padding question of the one-rank slice (docs/results/rank_slice_serving_h200.md, "The padding
question"): does a MIXED step land exactly on the per-rank chunk C, or on the KV page floor below
it? Everything that decides it is upstream's and runs unchanged here: ``PrefillAdder``
(``sglang.srt.managers.schedule_policy``), the prefill budget DeepSeek-V4's allocator hands it
(``SWATokenToKVPoolAllocator.create_prefill_budget``, a ``SWAPrefillBudget``), real ``Req`` and
``ScheduleBatch`` objects, and the page size, chunk and scheduling policy that upstream resolves
for the slice's command line. Stand-ins, as upstream's own scheduler tests use them: the radix
cache (nothing cached or evictable) and the KV pool object under the allocator (built with
``object.__new__``; the adder never touches its tensors). The loop that feeds the adder follows
``Scheduler._get_new_batch_prefill_raw`` (the continuing chunk first, then the waiting queue until
the adder says stop); ``ScheduleBatch.mix_with_running`` then adds one row per running request,
so a step has prefill + d rows.

What it shows: the adder takes the d decode rows off the chunk budget (``PrefillAdder.__init__``),
charges every whole request page-ceiled and cuts a *new* request's chunk to a page boundary
(``PrefillAdder._select_prefill_admission``). A step that cuts a new request therefore has
P * floor((C - d) / P) prefill tokens (less the page slack of whole requests whose lengths are
not page multiples): 2560 + d rows at C = 2816, P = 256, C only at d = 0 or d = P. A *continuing*
chunk is not floored (``PrefillAdder.add_chunked_req``), so only a step that continues a prompt
longer than C - d lands exactly on C.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from pathlib import Path

import pytest

import sglang_mixgraph
from sglang_mixgraph.core.prefill_buckets import derive_prefill_buckets

DSV4 = str(Path(sglang_mixgraph.__file__).parent / "data" / "dsv4_pro")
# The one-rank slice (tools/rank-slice/README.md, "Use it"), as resolved for its H200.
SLICE_ARGV = [
    "--model-path",
    DSV4,
    "--tp",
    "1",
    "--enable-mixed-chunk",
    "--chunked-prefill-size",
    "2816",
    "--max-running-requests",
    "256",
]
C = 2816  # per-rank chunk, the reference deployment's 22528 / 8
DSV4_PAGE = 256
PAGE_FLOOR = 2560  # 256 * floor((2816 - d) / 256) for 1 <= d <= 256
DECODE_ROWS = (1, 47, 136, 255, 256)
PROMPT = 2048  # the slice's served prompts (docs/results/rank_slice_faithful_h200.md)
OUTPUT = 200
STEPS = 6
MAX_PREFILL_TOKENS = 16384  # upstream's default, resolved for the slice


# --------------------------------------------------------------------------- upstream, resolved


@pytest.fixture(scope="module")
def resolved():
    """The slice's server arguments as upstream resolves them (DeepSeek-V4 sets the page)."""
    from sglang_mixgraph.resolution.resolve import resolve

    r = resolve(SLICE_ARGV, gpu="H200").resolved
    return {
        k: r[k]
        for k in (
            "page_size",
            "chunked_prefill_size",
            "enable_mixed_chunk",
            "max_running_requests",
            "max_prefill_tokens",
            "schedule_policy",
            "disable_radix_cache",
        )
    }


@pytest.fixture(scope="module")
def published(resolved):
    """Those arguments published as the scheduler's process publishes them (the adder reads the
    exec and schedule namespaces)."""
    from sglang.srt.runtime_context import get_context

    override = get_context().override_server_args(**resolved)
    override.install()
    yield resolved
    override.restore()


class _RadixCache:
    """The admission-side answers of an empty radix cache: nothing cached, nothing evictable."""

    sliding_window_size = 128  # DeepSeek-V4's SWA window
    buffer_pipeline = None
    disable = False

    def supports_mamba(self):
        return False

    def supports_prefix_sharing(self):
        return True

    def evictable_size(self):
        return 0

    def full_evictable_size(self):
        return 0

    def swa_evictable_size(self):
        return 0

    def lock(self, node):
        return None

    def unlock(self, lock):
        pass

    def finish_storage_prefetch_admission(self, *args, **kwargs):
        pass

    def discard_storage_prefetch_accounting(self, *args, **kwargs):
        pass

    def checkpoint(self, req, up_to):
        pass


@pytest.fixture(scope="module")
def world(published):
    """Upstream's SWA allocator of DeepSeek-V4 (``kv_cache_configurator`` builds a
    ``SWATokenToKVPoolAllocator`` over ``DeepSeekV4TokenToKVPool``), with KV room to spare."""
    import torch
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool

    pool = object.__new__(DeepSeekV4TokenToKVPool)
    pool.register_mapping = lambda mapping: None
    allocator = SWATokenToKVPoolAllocator(
        1 << 20,
        1 << 18,
        page_size=published["page_size"],
        dtype=torch.int64,
        device="cpu",
        kvcache=pool,
        need_sort=False,
    )
    return published, _RadixCache(), allocator


# --------------------------------------------------------------------------- the scheduler's loop


def _req(rid: str, prompt_len: int, generated: int = 0):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req(rid, "", array("q", range(1, prompt_len + 1)), SamplingParams(max_new_tokens=OUTPUT))
    req.output_ids = array("q", [7] * generated)
    return req


@dataclass
class Step:
    extends: list[int]  # the prefill tokens of each admitted request, in admission order
    cut_new: bool  # the step cut a new request's first chunk
    rem_chunk_at_start: int

    @property
    def prefill(self) -> int:
        return sum(self.extends)


def mixed_steps(world, d: int, prompt_len: int, steps: int = STEPS) -> list[Step]:
    """Admission of `steps` consecutive MIXED steps with `d` running decode rows and a queue of
    `prompt_len`-token prompts that never runs dry, as ``Scheduler._get_new_batch_prefill_raw``
    drives the adder (``enable_mixed_chunk``: the adder is told ``running_bs``)."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder
    from sglang.srt.mem_cache.common import checkpoint_kv_cache

    args, tree, allocator = world
    running = ScheduleBatch(reqs=[_req(f"decode-{i}", PROMPT, generated=5) for i in range(d)])
    queue = [_req(f"prompt-{i}", prompt_len) for i in range(steps * C // prompt_len + 2)]
    chunked = None
    out = []
    for _ in range(steps):
        adder = PrefillAdder(
            args["page_size"],
            tree,
            allocator,
            running,
            0.7,
            args["max_prefill_tokens"],
            args["chunked_prefill_size"],
            len(running.reqs) if args["enable_mixed_chunk"] else 0,
        )
        assert not adder.exact_chunk_fill  # upstream's exact fill is for gfx95 (AMD) only
        start = adder.rem_chunk_tokens
        if chunked is not None:
            chunked.init_next_round_input()
            chunked = adder.add_chunked_req(chunked)
        for req in queue:
            if adder.budget_state() == AddReqResult.OTHER:
                break
            req.init_next_round_input()
            res = adder.add_one_req(
                req, has_chunked_req=chunked is not None, truncation_align_size=None
            )
            if res != AddReqResult.CONTINUE:
                break
        admitted = list(adder.can_run_list)
        taken = {id(r) for r in admitted}
        queue = [r for r in queue if id(r) not in taken]
        if adder.new_chunked_req is not None:
            chunked = adder.new_chunked_req
        out.append(Step([r.extend_len for r in admitted], adder.new_chunked_req is not None, start))
        for req in admitted:  # after the forward: the next chunk resumes where this one ended
            checkpoint_kv_cache(req, tree)
    return out


# --------------------------------------------------------------------------- the tests


def test_upstream_resolves_the_slice_to_pages_of_256_and_a_2816_chunk(resolved):
    # DeepSeek-V4's model override sets page_size 256 (arg_groups.model_overrides.deepseek_v4).
    assert resolved["page_size"] == DSV4_PAGE
    assert resolved["chunked_prefill_size"] == C and resolved["enable_mixed_chunk"]
    assert resolved["max_running_requests"] == 256
    # FCFS: no shortest-prefill-first cap on the continuing chunk.
    assert resolved["schedule_policy"] == "fcfs"
    assert PAGE_FLOOR == DSV4_PAGE * ((C - 1) // DSV4_PAGE)


@pytest.mark.parametrize("d", DECODE_ROWS)
def test_a_step_that_cuts_a_new_prompt_is_the_page_floor_plus_d(world, d):
    steps = mixed_steps(world, d, PROMPT)
    for step in steps:
        assert step.rem_chunk_at_start == C - d  # the decode rows come off the chunk first
        assert step.prefill == PAGE_FLOOR, step.extends
        rows = step.prefill + d  # mix_with_running: one row per running request
        assert rows == PAGE_FLOOR + d
        if d < DSV4_PAGE:
            assert rows < C, "the rule 'a mixed step lands exactly on C' would hold here"
        else:
            assert rows == C
    # Steady state: steps cut new prompts and resume them; a step whose whole requests leave
    # less than a page admits nothing more (a whole request is charged page-ceiled, a cut is
    # page-floored), so it stops at the floor too.
    assert any(s.cut_new for s in steps) and any(s.extends[0] < PROMPT for s in steps)


@pytest.mark.parametrize("d", DECODE_ROWS)
def test_only_a_continuing_prompt_longer_than_the_budget_lands_on_c(world, d):
    steps = mixed_steps(world, d, 40 * C, steps=3)
    # Its first chunk is cut as a new request: floored to the page.
    assert steps[0].extends == [PAGE_FLOOR]
    for step in steps[1:]:
        # add_chunked_req takes the whole remaining budget, C - d, unfloored.
        assert step.extends == [C - d] and not step.cut_new
        assert step.prefill + d == C


def test_replay_padding_of_the_page_floored_steps_with_and_without_the_mixed_band(world):
    """What a replay of 2560 + d rows pads to: the plugin's derived list without the band (the
    reference deployment's) and with it (buckets every 32 tokens above 2560)."""
    narrow = derive_prefill_buckets(chunk_per_rank=C, running_per_rank=256, page_size=1)
    banded = derive_prefill_buckets(chunk_per_rank=C, running_per_rank=256, page_size=DSV4_PAGE)
    assert sorted(set(banded) - set(narrow)) == list(range(2592, C, 32))

    def pad(buckets, rows):
        return min(b for b in buckets if b >= rows) - rows

    for d, without, with_band in ((1, 255, 31), (47, 209, 17), (136, 120, 24), (243, 13, 13)):
        (step,) = mixed_steps(world, d, PROMPT, steps=1)
        rows = step.prefill + d
        assert (pad(narrow, rows), pad(banded, rows)) == (without, with_band), d
