"""The end-to-end harness under attention data parallelism (``run_e2e.py --dp N``), on CPU.

The workload pins requests to ranks, the phases' Engine arguments, the step log's rank fields,
the collection of per-process step logs, counters and upstream's logits-gather trace, and the
per-rank checks, each fed records on which it must pass and records on which it must fail.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import e2e_checks as C
import e2e_phase as PH
import e2e_phases as P
import e2e_workload as W
import pytest

from sglang_mixgraph.kits import gpu_machine

DP = 2


def test_dp_workload_pins_an_idle_and_a_mixed_segment_to_ranks():
    segs = W.build(chunk=P.CHUNK, workload=W.DP, dp=DP)
    assert segs == W.build(chunk=P.CHUNK, workload=W.DP, dp=DP)
    assert [s.name for s in segs] == ["batch", "staggered", "dp_idle", "dp_mixed"]
    idle, mixed = segs[2], segs[3]
    # one prompt of several chunks on rank 0: the other ranks idle while it prefills
    assert [r.dp_rank for r in idle.first] == [0] and not idle.then
    assert len(idle.first[0].prompt) > 2 * P.CHUNK
    # a request decoding on every rank, then a long prompt on rank 0 alone
    assert [r.dp_rank for r in mixed.first] == list(range(DP))
    assert [r.dp_rank for r in mixed.then] == [0] and len(mixed.then[0].prompt) > P.CHUNK
    assert all(r.max_new > -(-len(mixed.then[0].prompt) // P.CHUNK) for r in mixed.first)
    # the round-robin segments are the short workload's
    assert segs[:2] == W.build(chunk=P.CHUNK, workload="short")
    assert all(r.dp_rank is None for s in segs[:2] for r in s.first + s.then)
    assert [r.dp_rank for r in W.build(workload=W.DP, dp=1)[3].first] == [0]
    with pytest.raises(ValueError, match="dp must be at least 1"):
        W.build(workload=W.DP, dp=0)


def test_a_call_routes_its_requests_to_their_one_rank():
    a, b, free = (W.Request(n, (1,), 1, dp_rank=r) for n, r in (("a", 0), ("b", 1), ("f", None)))
    assert PH._route(a) == {"routed_dp_rank": 0}
    assert PH._route(free) == {} and PH._route(free, free) == {}
    with pytest.raises(ValueError, match="one DP rank"):
        PH._route(a, b)


def test_dp_engine_kwargs_keep_each_ranks_chunk_and_running_requests():
    phase = P.Phase("bcg", "always")
    one = phase.engine_kwargs("/m", radix=True, slot=0)
    assert phase.engine_kwargs("/m", radix=True, slot=0, dp=1) == one
    two = phase.engine_kwargs("/m", radix=True, slot=0, dp=DP)
    assert (two["tp_size"], two["attn_dp_size"]) == (DP, DP)
    assert two["chunked_prefill_size"] == DP * one["chunked_prefill_size"]
    assert two["max_running_requests"] == DP * one["max_running_requests"]
    # the decode graph's batch is per rank
    assert two["cuda_graph_max_bs_decode"] == one["cuda_graph_max_bs_decode"]
    changed = {k for k in two if two[k] != one.get(k)}
    assert changed == {"tp_size", "attn_dp_size", "chunked_prefill_size", "max_running_requests"}


def test_step_log_names_the_rank_only_under_dp(monkeypatch):
    import sglang.srt.runtime_context as rc

    monkeypatch.setattr(rc, "get_parallel", lambda: SimpleNamespace(attn_dp_rank=1))
    fb = SimpleNamespace(global_num_tokens_cpu=[259, 3])
    fields = gpu_machine.dp_step_fields
    assert fields(fb) == {"dp_rank": 1, "global_tokens": [259, 3]}
    assert fields(SimpleNamespace(global_num_tokens_cpu=[259])) == {}
    assert fields(SimpleNamespace(global_num_tokens_cpu=None)) == {}
    assert fields(SimpleNamespace()) == {}


def test_logits_gather_rows_read_upstreams_trace_line():
    line = (
        "SGLANG_TRACE_LOGITS_E2E dp=1 tp=1 stage=dp_metadata_returned buffer_shape=(7, 1024) "
        "local_start=tensor([3]) local_tokens=tensor([4])"
    )
    assert C.logits_gather_rows(line) == 7
    assert C.logits_gather_rows(line.replace("dp_metadata_returned", "lm_head_enter")) is None
    assert C.logits_gather_rows("SGLANG_TRACE_LOGITS_E2E stage=dp_metadata_returned") is None


# ---- the per-rank checks ----------------------------------------------------------------------


def _step(pid, rank, mode, graph=False, bs=4, rows=300):
    return {"pid": pid, "dp_rank": rank, "mode": mode, "graph": graph, "bs": bs, "rows": rows}


def _dp_rec(split="always", graph="bcg", read_done=False, **change):
    """Two ranks (pids 11, 12): rank 0 replayed 3 MIXED steps and decoded; rank 1 replayed 3
    decode-only batches SGLang ran as one-token EXTEND batches, then idled. The split planned
    and split each of those replays."""
    steps = [_step(11, 0, "MIXED", True)] * 3 + [_step(11, 0, "DECODE", True, rows=4)] * 2
    steps += [_step(12, 1, "EXTEND", True, rows=4)] * 3 + [_step(12, 1, "IDLE", bs=0, rows=0)] * 2
    by_pid = {
        pid: {
            "pid": pid,
            "events": {
                "mixed_split": {} if split == "off" else {"replays_seen": 3, "replays_split": 3},
                "replay_read_done": {"replays_published.mixed": 3} if read_done else {},
            },
            "fallbacks": {},
        }
        for pid in (11, 12)
    }
    fields = dict(
        name=f"{graph}-{split}",
        split=split,
        ran=True,
        read_done=read_done,
        graph=graph,
        dp=DP,
        steps=steps,
        counters_by_pid=by_pid,
        logits_gather_rows=[2, 5, 9],
        max_running=P.MAX_RUNNING * DP,
    )
    fields.update(change)
    return C.PhaseRecord(**fields)


def _failed(rec):
    return [c.name for c in C._dp_checks(rec) if not c.ok]


SPLIT_ALL = "the split acted on every rank's MIXED and relabelled decode-only steps"
RELABEL = "SGLang ran decode-only batches as EXTEND on some rank"


def test_dp_checks_pass_where_every_rank_did_its_part():
    assert _failed(_dp_rec()) == []
    assert _failed(_dp_rec(read_done=True)) == []
    assert _failed(_dp_rec(split="off")) == []
    adaptive = _dp_rec(split="adaptive")
    adaptive.counters_by_pid[12]["events"]["mixed_split"] = {"replays_seen": 3}
    assert _failed(adaptive) == []  # adaptive may keep them unsplit
    # eager and decode-graph modes do not relabel (no prefill-graph vote): not asked there
    eager = _dp_rec(graph="eager")
    eager.steps = [s for s in eager.steps if not (s["mode"] == "EXTEND")]
    eager.counters_by_pid[12]["events"]["mixed_split"] = {}
    assert _failed(eager) == []


def test_dp_checks_fail_on_a_missing_rank_no_idle_step_or_a_padded_logits_gather():
    no_rank1 = _dp_rec()
    no_rank1.steps = [s for s in no_rank1.steps if s["dp_rank"] == 0]
    assert "every one of the 2 attention-DP ranks ran steps" in _failed(no_rank1)
    busy = _dp_rec()
    busy.steps = [dict(s, mode="DECODE") if s["mode"] == "IDLE" else s for s in busy.steps]
    assert "some ranks ran IDLE steps (the workload idles them)" in _failed(busy)
    padded = _dp_rec(logits_gather_rows=[2, P.CHUNK * DP])
    assert "every DP logits gather held the live rows, not a padded bucket" in _failed(padded)
    assert "every DP logits gather held the live rows, not a padded bucket" in _failed(
        _dp_rec(logits_gather_rows=[])
    )
    no_relabel = _dp_rec(split="off")
    no_relabel.steps = [dict(s, rows=300) if s["mode"] == "EXTEND" else s for s in no_relabel.steps]
    assert _failed(no_relabel) == [RELABEL]


def test_dp_checks_fail_where_the_split_or_read_done_missed_a_rank():
    unsplit_mixed = _dp_rec()
    unsplit_mixed.counters_by_pid[11]["events"]["mixed_split"] = {"replays_seen": 3}
    assert _failed(unsplit_mixed) == [SPLIT_ALL]
    unsplit_relabel = _dp_rec()
    unsplit_relabel.counters_by_pid[12]["events"]["mixed_split"]["replays_split"] = 1
    assert _failed(unsplit_relabel) == [SPLIT_ALL]
    idle_planned = _dp_rec()
    idle_planned.counters_by_pid[12]["events"]["mixed_split"]["replays_seen"] = 5
    assert _failed(idle_planned) == ["idle ranks planned no split"]
    silent = _dp_rec(read_done=True)
    silent.counters_by_pid[11]["events"]["replay_read_done"] = {}
    assert _failed(silent) == ["read-done published on every rank that replayed MIXED steps"]


def test_dp_checks_run_only_for_dp_phases():
    rec = _dp_rec(dp=1, outputs={}, expected_lens={})
    assert not any("rank" in c.name for c in C.check_phase(rec, None, policy=None))


# ---- the driver's collection ------------------------------------------------------------------


def test_collect_keeps_each_process_steps_and_counters_and_the_logits_gathers(tmp_path):
    import run_e2e

    phase = P.Phase("bcg", "always")
    d = tmp_path / phase.name
    (d / "steps").mkdir(parents=True)
    logs = tmp_path / "logs"
    logs.mkdir()
    kwargs = phase.engine_kwargs("/m", radix=True, slot=0, dp=DP)
    (d / "kwargs.json").write_text(json.dumps(kwargs))
    for pid, rank, mode in ((11, 0, "MIXED"), (12, 1, "IDLE")):
        line = json.dumps({"mode": mode, "bs": 1, "rows": 1, "graph": False, "dp_rank": rank})
        (d / "steps" / f"steps_{pid}.jsonl").write_text(line + "\n")
    snaps = [
        {"pid": 11, "events": {"mixed_split": {"steps_split": 1}}, "fallbacks": {}},
        {"pid": 11, "events": {"mixed_split": {"steps_split": 2}}, "fallbacks": {}},
        {"pid": 12, "events": {"mixed_split": {"steps_seen.converted_decode": 1}}, "fallbacks": {}},
    ]
    text = [f"[s] sglang-mixgraph counters {json.dumps(s)}" for s in snaps]
    text += [
        "SGLANG_TRACE_LOGITS_E2E dp=0 tp=0 stage=dp_metadata_returned buffer_shape=(3, 64) x=1",
        "SGLANG_TRACE_LOGITS_E2E dp=1 tp=1 stage=lm_head_enter hidden_shape=(3, 64)",
    ]
    (logs / f"{phase.name}.log").write_text("\n".join(text) + "\n")
    (d / "out.json").write_text(json.dumps({"ok": True, "outputs": {}, "expected_lens": {}}))
    rec = run_e2e.collect(phase, str(tmp_path), str(logs), 1.0, False, dp=DP)["record"]
    assert sorted((s["pid"], s["dp_rank"]) for s in rec.steps) == [(11, 0), (12, 1)]
    assert rec.counters_by_pid[11]["events"]["mixed_split"] == {"steps_split": 2}
    assert rec.counters["events"]["mixed_split"]["steps_split"] == 2
    assert rec.logits_gather_rows == [3]
    assert (rec.dp, rec.graph, rec.max_running) == (DP, "bcg", P.MAX_RUNNING * DP)


def test_driver_rejects_a_dp_below_one(monkeypatch, tmp_path):
    import run_e2e

    argv = ["run_e2e.py", "--dp", "0", "--out", str(tmp_path), "--work", str(tmp_path / "w")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as e:
        run_e2e.main()
    assert e.value.code == 2


def test_upstream_engine_takes_a_routed_dp_rank_per_call_and_an_attention_dp_width():
    """What the workload's pinned requests pass (``e2e_phase._route``) and the phases set."""
    import inspect

    from sglang.srt.entrypoints.engine import Engine
    from sglang.srt.server_args import ServerArgs

    for fn in (Engine.generate, Engine.async_generate):
        assert "routed_dp_rank" in inspect.signature(fn).parameters, fn.__name__
    fields = inspect.signature(ServerArgs).parameters
    assert {"attn_dp_size", "tp_size", "chunked_prefill_size"} <= set(fields)


@pytest.mark.parametrize("dp", [1, DP])
def test_every_phase_process_keeps_nvlink_multicast_off(tmp_path, monkeypatch, dp):
    import run_e2e

    for k in gpu_machine.NO_MULTICAST_ENV:
        monkeypatch.setenv(k, "x")  # a parent that asks for it does not get it
    env = run_e2e._phase_env(P.Phase("bcg", "always"), {}, True, str(tmp_path), W.DP, dp)
    assert {k: env[k] for k in gpu_machine.NO_MULTICAST_ENV} == gpu_machine.NO_MULTICAST_ENV


def test_device_sh_exports_the_same_multicast_rule():
    """Servers that ab starts inherit device.sh's environment, not the drivers' dicts."""
    import re
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "tools" / "gpu-upstream" / "device.sh"
    exported = {}
    for line in script.read_text().splitlines():
        if line.startswith("export "):
            exported.update(re.findall(r"(\w+)=(\S+)", line))
    assert {k: exported.get(k) for k in gpu_machine.NO_MULTICAST_ENV} == (
        gpu_machine.NO_MULTICAST_ENV
    )
