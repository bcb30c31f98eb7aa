"""The replay read-done snapshot proven against late writes, on upstream's breakable CUDA graph.

Once a replay has published read-done, the scheduler may rewrite ``req_to_token`` and
``full_to_swa_index_mapping`` for its next batch while the replay still runs. Here those writes
are made as hostile as they can be: right after upstream's publisher recorded the event, another
stream waits for it and overwrites the step's rows of both tables (each request's row reversed,
its slots' SWA mapping rotated), and the replay runs only after that stream has finished. A
replay that reads nothing of the tables after the event gives the same output as without the
poison; the negative control, a deliberately late reader (the chunk cache dropped after the
publish, so the first attention break rebuilds it from the tables), must be caught by the same
comparison. The graph, the fixture, the runner stand-in and the patches' environment are
test_breakable_graph_upstream's.
"""

import pytest
import torch
from test_breakable_graph_upstream import _live, _ModelRunner, capture_bucket, read_done_env

from sglang_mixgraph.kits import dsv4_gpu as G
from sglang_mixgraph.kits.install import installed
from sglang_mixgraph.patches import mixed_split as ms
from sglang_mixgraph.patches import replay_read_done as rd
from sglang_mixgraph.patches import war_snapshot_check as wc

NAMES = ("mixed_b", "extend")


@pytest.fixture(scope="module")
def bucket(sglang_cuda):
    return capture_bucket()


class Poison:
    """After read-done: overwrite the step's rows of both shared tables on a side stream that
    waits for the event; the replay (current stream) starts once the writes are done."""

    def __init__(self, world, view):
        self.world, self.view = world, view
        # Taken before the replay, so the copy is ordered before the event on the current stream.
        self.saved = tuple(t.clone() for t in self._tables())
        self.side = torch.cuda.Stream()
        self.landed = False

    def _tables(self):
        return self.world.req_to_token, self.world.pool.full_to_swa_index_mapping

    def __call__(self, model_runner):
        event = model_runner.shared_read_done_event
        assert isinstance(event, torch.cuda.Event), "no read-done event to poison after"
        req_to_token, full_to_swa = self._tables()
        self.side.wait_event(event)
        with torch.cuda.stream(self.side):
            for r, n in enumerate(self.view.step.seq_lens):  # req_pool_indices are 0..n-1
                row = req_to_token[r, :n]
                slots = row.to(torch.int64)
                full_to_swa[slots] = full_to_swa[slots].roll(1)  # other valid SWA slots
                req_to_token[r, :n] = row.flip(0)  # other valid slots, other positions
        torch.cuda.current_stream().wait_stream(self.side)

    def restore(self):
        torch.cuda.synchronize()
        tables = self._tables()
        self.landed = all(not torch.equal(t, s) for t, s in zip(tables, self.saved, strict=True))
        for t, s in zip(tables, self.saved, strict=True):
            t.copy_(s)
        torch.cuda.synchronize()


def _replays(b, world, env, *, poison: bool, late_reader=None):
    """Each live batch replayed with the patches of ``env``; ``poison``: the tables overwritten
    after its read-done; ``late_reader``: run right after the publish, before the poison."""
    runner = _ModelRunner(world.backend)
    outputs = {}
    wc.PUBLISHED.clear()
    try:
        with installed((ms.PATCH, rd.PATCH, wc.PATCH), env):
            for name in NAMES:
                runner.forward_pass_id += 1
                runner.shared_read_done_event = None
                view, fb = _live(world, name)
                p = Poison(world, view) if poison else None

                def after_publish(model_runner, p=p):
                    if late_reader is not None:
                        late_reader()
                    if p is not None:
                        p(model_runner)

                try:
                    outputs[name] = b.replay(
                        view, fb, view.q(), model_runner=runner, after_publish=after_publish
                    )
                finally:
                    if p is not None:
                        p.restore()
                assert b.read_ends is not None and runner.shared_read_done_event is not None
                if p is not None:
                    assert p.landed, f"{name}: the poison did not reach both tables"
    finally:
        wc.PUBLISHED.clear()
    return outputs


@pytest.mark.parametrize("split", [False, True], ids=["unsplit", "split"])
def test_tables_overwritten_after_read_done_leave_the_replay_unchanged(bucket, split):
    """Split off and on, a MIXED and an EXTEND replay: poisoned equals clean (bit for bit; the
    split's decode rows, from FlashMLA's decode kernel, within 1e-3 where a poisoned read moves
    them by order 1), and the snapshot check stays silent (it would raise inside the attention
    break)."""
    world, b = bucket
    clean = _replays(b, world, read_done_env(split), poison=False)
    poisoned = _replays(b, world, read_done_env(split), poison=True)
    for name in NAMES:
        view, _ = _live(world, name)
        b0, rows = view.step.b0, view.step.num_rows
        for layer in b.layers:
            got, want = poisoned[name][layer], clean[name][layer]
            if split and name.startswith("mixed"):
                assert torch.equal(got[:b0], want[:b0]), f"{name} layer {layer}: prefill rows"
                err = G.rel_l2(got[b0:rows], want[b0:rows])
                assert err < 1e-3, f"{name} layer {layer}: decode rows rel L2 {err:.2e}"
                assert torch.equal(got[rows:], want[rows:])
            else:
                assert torch.equal(got, want), (
                    f"{name} layer {layer}: output changed by writes after read-done, rel L2 "
                    f"{G.rel_l2(got, want):.2e}"
                )


def test_a_late_reader_is_caught_by_the_same_poison(bucket):
    """Negative control (snapshot check off, so nothing raises): the chunk cache dropped after
    the publish makes the first attention break read the tables. Unpoisoned, that late build
    equals the prebuilt cache; poisoned, the output changes, so the comparison above sees a
    late reader."""
    world, b = bucket
    env = read_done_env(False, check=False)
    reference = _replays(b, world, env, poison=False)

    def drop_cache():
        b.metadata.sparse_prefill_cache = None

    late_clean = _replays(b, world, env, poison=False, late_reader=drop_cache)
    late_poisoned = _replays(b, world, env, poison=True, late_reader=drop_cache)
    for name in NAMES:
        view, _ = _live(world, name)
        rows = view.step.num_rows
        for layer in b.layers:
            assert torch.equal(late_clean[name][layer], reference[name][layer]), (name, layer)
        worst = max(
            G.rel_l2(late_poisoned[name][layer][:rows], reference[name][layer][:rows])
            for layer in b.layers
        )
        assert worst > 1e-2, (
            f"{name}: the late reader read the poisoned tables unseen ({worst:.2e})"
        )
