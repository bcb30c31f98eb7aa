"""The end-to-end harness's pressure workload on CPU: a pool too small for the load, radix cache
on, client aborts mid-generation, read-done and the snapshot check on.

What is checked here without a GPU: the workload's shape (demand against the pool, the aborts,
the radix reuse), the pool log's wrappers (on stand-ins and against upstream's real classes), the
new checks on phase records they must pass and fail, and the driver run end to end with a
stand-in phase process (test_e2e_harness.py's) under ``--workload pressure``.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from types import SimpleNamespace

import e2e_checks as C
import e2e_phases as P
import e2e_pool_log as PL
import e2e_workload as W
import pytest
import test_e2e_harness as H

PAGE = 256  # DeepSeek-V4's page (sglang's deepseek_v4 model override)


def _pages(tokens: int) -> int:
    return -(-tokens // PAGE)


# ---- the workload --------------------------------------------------------------------------


def test_pressure_workload_overloads_the_pool_it_runs_against():
    segs = W.build(workload=W.PRESSURE)
    assert segs == W.build(workload=W.PRESSURE) and [s.name for s in segs] == ["warm", "pressure"]
    warm, press = segs
    assert W.engine_overrides(W.PRESSURE) == {
        "max_total_tokens": W.PRESSURE_POOL_TOKENS,
        "swa_full_tokens_ratio": W.PRESSURE_SWA_RATIO,
    }
    assert W.engine_overrides("full") == W.engine_overrides("short") == {}
    pool_pages = W.PRESSURE_POOL_TOKENS // PAGE
    load = press.first + press.then
    # Every request fits the pool alone; together they need about twice its pages.
    assert all(len(r.prompt) + r.max_new < W.PRESSURE_POOL_TOKENS for r in W.all_requests(segs))
    assert sum(_pages(len(r.prompt) + r.max_new) for r in load) >= 1.8 * pool_pages
    # The warm prompts stay cached (radix on) and must be evicted for the load.
    assert sum(_pages(len(r.prompt)) for r in warm.first) >= pool_pages // 4
    reused = [r for r in press.first if r.prompt[:512] in {w.prompt[:512] for w in warm.first}]
    assert len(reused) == 3
    # Prompts longer than the chunk arrive while others decode: MIXED steps.
    assert press.then and all(len(r.prompt) > P.CHUNK for r in press.then)
    assert len(load) <= P.MAX_RUNNING
    # The window pool holds every request of the load at once (up to two pages each, for a
    # 128-token window, plus two chunks in flight), so the full pool is the one that runs out.
    swa_pages = W.PRESSURE_SWA_RATIO * W.PRESSURE_POOL_TOKENS // PAGE
    assert swa_pages >= 2 * len(press.first) + 2 * _pages(P.CHUNK)


def test_pressure_admission_reserves_too_little_decode_room_so_decoding_must_retract():
    # Admit the streamed load in order as upstream's PrefillAdder.add_one_req would (prompt pages
    # plus min(max_new, clip) per request, running ones at their clipped remainder): the admitted
    # requests' full decode must outgrow the pool. At SGLang's default clip (4096) it never does.
    import sglang.srt.managers.schedule_policy as policy

    def admitted_growth(clip: int) -> tuple[int, int]:
        admitted, reserved = [], 0
        for r in W.build(workload=W.PRESSURE)[1].first:
            need = _pages(len(r.prompt)) * PAGE + min(r.max_new, clip)
            if reserved + need > W.PRESSURE_POOL_TOKENS:
                break
            admitted.append(r)
            reserved += need
        return len(admitted), sum(_pages(len(r.prompt) + r.max_new) * PAGE for r in admitted)

    clip = int(W.engine_env(W.PRESSURE)["SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION"])
    n, grown = admitted_growth(clip)
    assert n >= 8 and grown > 1.3 * W.PRESSURE_POOL_TOKENS
    assert admitted_growth(policy.CLIP_MAX_NEW_TOKENS)[1] <= W.PRESSURE_POOL_TOKENS
    assert W.engine_env("full") == W.engine_env("short") == {}


def test_only_the_pressure_phases_run_with_the_admission_clip(tmp_path):
    import run_e2e

    phase = P.Phase("bcg", "always", read_done=True)
    env = {w: run_e2e._phase_env(phase, {}, True, str(tmp_path), w) for w in W.WORKLOADS}
    clip = "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION"
    assert env[W.PRESSURE][clip] == W.PRESSURE_ENV[clip]
    assert env["short"].get(clip) == env["full"].get(clip) == os.environ.get(clip)


def test_pressure_aborts_are_mid_generation_and_only_in_the_streamed_requests():
    segs = W.build(workload=W.PRESSURE)
    targets = W.abort_targets(segs)
    press = segs[1]
    assert len(targets) == 3 and set(targets) <= {r.rid for r in press.first}
    by_rid = {r.rid: r for r in W.all_requests(segs)}
    assert all(0 < n == W.ABORT_AFTER < by_rid[rid].max_new for rid, n in targets.items())
    # SGLang aborts by rid prefix: no other request may start with an aborted one's rid.
    assert not [(a, r) for a in targets for r in by_rid if r != a and r.startswith(a)]
    assert W.abort_targets(W.build()) == {}  # the other workloads abort nothing


# ---- the phase process's client side ------------------------------------------------------


class _Engine:
    """What e2e_phase asks of ``sglang.Engine``: cumulative streamed chunks, one per step, and
    the tokenizer manager's ``abort_request``, after which a stream ends with an abort. As in
    SGLang (`Scheduler.abort_request`), an abort reaches every request whose rid starts with it."""

    def __init__(self):
        self.aborted, self.sent = set(), []
        self.tokenizer_manager = SimpleNamespace(abort_request=lambda rid: self.aborted.add(rid))

    async def async_generate(self, input_ids, sampling_params, stream=False, rid=None):
        import asyncio

        n = sampling_params["max_new_tokens"]
        self.sent.append(len(input_ids))
        if not stream:
            return {"output_ids": [1] * n}

        async def chunks():
            for i in range(1, n + 1):
                await asyncio.sleep(0)
                if any(rid.startswith(a) for a in self.aborted):
                    yield {
                        "output_ids": [1] * (i - 1),
                        "meta_info": {"finish_reason": {"type": "abort"}},
                    }
                    return
                done = {"type": "length"} if i == n else None
                yield {"output_ids": [1] * i, "meta_info": {"finish_reason": done}}

        return chunks()


def test_phase_aborts_its_targets_after_their_tokens_and_lets_the_others_finish():
    import asyncio

    import e2e_phase

    seg = W.build(workload=W.PRESSURE)[1]
    engine = _Engine()
    outputs, finishes = asyncio.run(e2e_phase._with_aborts(engine, seg))
    targets = W.abort_targets([seg])
    assert engine.aborted == set(targets) and set(finishes) == set(targets)
    for r in seg.first + seg.then:
        got = len(outputs[r.rid])
        if r.rid in targets:
            assert finishes[r.rid] == "abort" and W.ABORT_AFTER <= got < r.max_new, (r.rid, got)
        else:
            assert got == r.max_new, (r.rid, got)
    # The late prompts are sent after every streamed request's (first) chunk.
    assert engine.sent[-len(seg.then) :] == [len(r.prompt) for r in seg.then]


def test_a_stream_that_fails_to_start_neither_hangs_the_segment_nor_hides():
    import asyncio

    import e2e_phase

    class Refusing(_Engine):
        async def async_generate(self, input_ids, sampling_params, stream=False, rid=None):
            if rid == "press01":  # an abort target whose request is refused outright
                raise ValueError("refused")
            return await super().async_generate(input_ids, sampling_params, stream, rid)

    seg = W.build(workload=W.PRESSURE)[1]
    outputs, finishes = asyncio.run(
        asyncio.wait_for(e2e_phase._with_aborts(Refusing(), seg), timeout=60)
    )
    assert outputs["press01"] == [] and finishes["press01"] == "error: ValueError: refused"
    rec = _press(outputs={"r0": [1, 2, 3], "r1": [4, 5], "ab": []}, finish=finishes["press01"])
    assert "aborted requests stopped mid-generation" in H._failed(H._check(rec, _press("bcg-off")))


# ---- the pool log --------------------------------------------------------------------------


def test_pool_log_records_retractions_and_evictions_that_freed_something(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXGRAPH_E2E_STEP_LOG", str(tmp_path))

    class Batch:
        def __init__(self, out):
            self.out = out

        def retract_decode(self):
            return self.out

    class Cache:
        def __init__(self, full, swa):
            self.result = SimpleNamespace(num_tokens_evicted=full, swa_num_tokens_evicted=swa)

        def evict(self, params):
            return self.result

    PL._wrap_retract(Batch, "retract_decode")
    PL._wrap_evict(Cache, "evict")
    retracted = ([SimpleNamespace(rid="a"), SimpleNamespace(rid="b")], 0.5, [])
    assert Batch(retracted).retract_decode() is retracted  # the caller sees upstream's result
    Batch(([], 0.7, [])).retract_decode()  # nothing retracted: no line
    Batch(([], 0.7, ["c"])).retract_decode()
    Cache(512, 0).evict(None)
    Cache(0, 0).evict(None)  # nothing evicted: no line
    Cache(0, 128).evict(None)
    (log,) = tmp_path.glob(f"{PL.FILE_PREFIX}*.jsonl")
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert events == [
        {"event": "retract", "reqs": 2, "aborted": 0, "rids": ["a", "b"]},
        {"event": "retract", "reqs": 0, "aborted": 1, "rids": []},
        {"event": "evict", "tokens": 512, "swa_tokens": 0},
        {"event": "evict", "tokens": 0, "swa_tokens": 128},
    ]
    assert PL.summarize(events) == {
        "retractions": 2,
        "retracted_reqs": 2,
        "evictions": 2,
        "evicted_tokens": 512,
        "evicted_swa_tokens": 128,
        "retracted_rids": ["a", "b"],
    }


def test_pool_log_targets_are_upstreams_retraction_and_evictions():
    """The wrapped methods exist in sglang 0.5.23 with the results the wrappers read: a drift
    here would leave the pressure check blind, so it fails here first."""
    import importlib

    from sglang.srt.mem_cache.base_prefix_cache import EvictResult

    module, cls, name = PL.RETRACTOR
    retract = getattr(getattr(importlib.import_module(module), cls), name)
    assert "Tuple[List[Req], float, List[Req]]" in str(inspect.signature(retract).return_annotation)
    fields = set(EvictResult.__dataclass_fields__)
    assert {"num_tokens_evicted", "swa_num_tokens_evicted"} <= fields
    for module, cls, name in PL.EVICTORS:
        method = getattr(getattr(importlib.import_module(module), cls), name)
        assert inspect.signature(method).return_annotation in (EvictResult, "EvictResult")
    from sglang.srt.mem_cache.pure_swa_radix_cache import PureSWARadixCache
    from sglang.srt.mem_cache.radix_cache import RadixCache

    assert issubclass(PureSWARadixCache, RadixCache)  # its evict ends in RadixCache.evict


# ---- the checks ----------------------------------------------------------------------------

POOL = {"retractions": 3, "retracted_reqs": 4, "evictions": 9, "evicted_tokens": 2048}


def _press(name="bcg-off-rd", *, outputs=None, finish="abort", pool=POOL, **kw):
    outputs = {"r0": [1, 2, 3], "r1": [4, 5], "ab": [7] * 30} if outputs is None else outputs
    read_done = name.endswith("-rd")
    steps = H.RD_STEPS
    return C.PhaseRecord(
        name=name,
        split="off",
        ran=True,
        read_done=read_done,
        outputs=outputs,
        expected_lens={"r0": 3, "r1": 2, "ab": 512},
        steps=steps,
        counters={"events": dict(H.RD_EVENTS) if read_done else {}, "fallbacks": {}},
        abort_targets={"ab": 24},
        finish_reasons={"ab": finish},
        pool=dict(pool),
        pool_pressure=True,
        **kw,
    )


def test_pressure_phase_passes_with_survivors_equal_aborts_and_pool_pressure():
    base = _press("bcg-off", outputs={"r0": [1, 2, 3], "r1": [4, 5], "ab": [7] * 26})
    assert H._failed(H._check(base, None)) == []
    checks = H._check(_press(), base)  # the aborted request's tokens differ: not compared
    assert H._failed(checks) == []
    names = [c.name for c in checks]
    assert "tokens equal bcg-off (surviving requests)" in names
    assert "no shared-table read after read-done (WarSnapshotViolation)" in names
    assert H._detail(checks, "the pool forced retractions and evictions") == (
        "3 retractions (4 requests), 9 evictions (2048 tokens, 0 SWA tokens)"
    )


def test_pressure_phase_fails_where_a_survivor_differs_or_the_pool_never_pressed():
    base = _press("bcg-off")
    differs = _press(outputs={"r0": [1, 9, 3], "r1": [4, 5], "ab": [7] * 30})
    assert H._failed(H._check(differs, base)) == ["tokens equal bcg-off (surviving requests)"]
    pool = "the pool forced retractions and evictions"
    assert H._failed(H._check(_press(pool=dict(POOL, retracted_reqs=0)), base)) == [pool]
    assert H._failed(H._check(_press(pool=dict(POOL, evicted_tokens=0)), base)) == [pool]
    swa_only = dict(POOL, evicted_tokens=0, evicted_swa_tokens=256)
    assert H._failed(H._check(_press(pool=swa_only), base)) == []
    assert H._failed(H._check(_press(pool={}), base)) == [pool]
    # A survivor short of its length still fails; the aborted one is not held to its length.
    short = _press(outputs={"r0": [1, 2], "r1": [4, 5], "ab": [7] * 30})
    assert "every request got all its tokens (but those the client aborted)" in H._failed(
        H._check(short, base)
    )


def test_a_retracted_request_whose_tokens_differ_fails_and_is_named():
    base = _press("bcg-off", pool=dict(POOL, retracted_rids=["r1"]))
    rec = _press(outputs={"r0": [1, 2, 9], "r1": [4, 6], "ab": [7] * 30})
    (tokens,) = [c for c in H._check(rec, base) if c.name.startswith("tokens equal")]
    assert not tokens.ok
    assert tokens.detail == (
        "r0: first differs at 2 (3 vs 3 tokens); r1: first differs at 1 (2 vs 2 tokens) (retracted)"
    )


@pytest.mark.parametrize(
    "tokens, finish",
    [(512, "length"), (512, "abort"), (10, "abort"), (30, "error: ValueError: x"), (30, None)],
    ids=["ran-to-length", "full-length", "before-its-tokens", "errored", "no-finish"],
)
def test_an_abort_that_did_not_stop_the_request_mid_generation_fails(tokens, finish):
    rec = _press(outputs={"r0": [1, 2, 3], "r1": [4, 5], "ab": [7] * tokens}, finish=finish)
    checks = H._check(rec, _press("bcg-off"))
    assert H._failed(checks) == ["aborted requests stopped mid-generation"]
    assert H._detail(checks, "aborted requests stopped mid-generation").startswith(
        f"ab: {tokens} of 512 tokens (abort after 24), finish {finish}"
    )


def test_the_pool_check_belongs_to_the_pressure_workload_only():
    rec = H._rec("bcg-off", "off", steps=H.RD_STEPS)
    assert not rec.pool_pressure and not rec.abort_targets
    names = [c.name for c in H._check(rec, None)]
    assert "the pool forced retractions and evictions" not in names
    assert "aborted requests stopped mid-generation" not in names


# ---- the driver ----------------------------------------------------------------------------

# Appended to test_e2e_harness's stand-in phase (which has written out.json): the pool log a
# pressed pool leaves, and a request the client aborted.
FAKE_PRESSURE = """
d = os.environ["MIXGRAPH_E2E_STEP_LOG"]
if os.environ["MIXGRAPH_E2E_WORKLOAD"] == "pressure" and os.environ.get("FAKE_PRESSED") == "1":
    with open(os.path.join(d, "pool_1.jsonl"), "w") as f:
        f.write(json.dumps({"event": "retract", "reqs": 2, "aborted": 0}) + "\\n")
        f.write(json.dumps({"event": "evict", "tokens": 768, "swa_tokens": 0}) + "\\n")
assert json.load(open(kwargs))["max_total_tokens"] == int(os.environ["FAKE_POOL"])
res = json.load(open(out))
res["outputs"]["ab"] = [3] * 25
res["expected_lens"]["ab"] = 512
res["abort_targets"] = {"ab": 24}
res["finish_reasons"] = {"ab": "abort"}
json.dump(res, open(out, "w"))
"""


def _run_pressure(tmp_path, monkeypatch, pressed: bool):
    import run_e2e

    fake = tmp_path / "fake_phase.py"
    fake.write_text(H.FAKE_PHASE + FAKE_PRESSURE)
    monkeypatch.setattr(H.scm, "load_coefficients", lambda arch: H.POLICY.coeffs)
    monkeypatch.setattr(run_e2e, "PHASE_SCRIPT", str(fake))
    monkeypatch.setenv("FAKE_SPLIT_ACTS", "1")
    monkeypatch.setenv("FAKE_PRESSED", "1" if pressed else "0")
    monkeypatch.setenv("FAKE_POOL", str(W.PRESSURE_POOL_TOKENS))
    out = tmp_path / "out"
    argv = ["run_e2e.py", "bcg-off", "bcg-off-rd", "bcg-always-rd", "--workload", "pressure"]
    argv += ["--out", str(out), "--work", str(tmp_path / "work"), "--budget-s", "120"]
    monkeypatch.setattr(sys, "argv", argv)
    rc = run_e2e.main()
    return (
        rc,
        json.loads((out / "e2e_results.json").read_text()),
        (out / "e2e_tiny_dsv4.log").read_text(),
    )


def test_driver_runs_the_pressure_workload_with_its_pool_and_reports_the_pool_log(
    tmp_path, monkeypatch
):
    rc, report, log = _run_pressure(tmp_path, monkeypatch, pressed=True)
    assert rc == 0 and report["checks_failed"] == 0, log
    rd = report["phases"]["bcg-always-rd"]
    assert rd["pool"]["retracted_reqs"] == 2 and rd["pool"]["evicted_tokens"] == 768
    assert rd["finish_reasons"] == {"ab": "abort"}
    assert "[ok] the pool forced retractions and evictions: 1 retractions (2 requests)" in log
    assert "[ok] tokens equal bcg-off (surviving requests)" in log
    assert "[ok] aborted requests stopped mid-generation: 1 aborted" in log
    assert '"max_total_tokens": 8192' in log  # the workload's pool, in the logged arguments


def test_driver_fails_a_pressure_run_whose_pool_never_pressed(tmp_path, monkeypatch):
    rc, report, log = _run_pressure(tmp_path, monkeypatch, pressed=False)
    assert rc == 1 and report["checks_failed"] == 3
    for phase in ("bcg-off", "bcg-off-rd", "bcg-always-rd"):
        assert f"FAILED {phase}: the pool forced retractions and evictions: 0 retractions" in log
