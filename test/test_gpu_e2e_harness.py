"""The end-to-end harness's own logic on CPU: workload, phases, checks, and the driver's plumbing.

The GPU run itself is test/gpu_e2e/run_e2e.py (it needs the H200 and the kit); here the driver
runs with a stand-in phase process that writes what a phase writes (tokens, step log, counter
lines), so that what it reports and its exit status are checked without a GPU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

E2E = Path(__file__).resolve().parent / "gpu_e2e"
sys.path.insert(0, str(E2E))

import e2e_checks as C  # noqa: E402
import e2e_phases as P  # noqa: E402
import e2e_workload as W  # noqa: E402

CONFIG = json.loads((E2E / "tiny_dsv4_config.json").read_text())


# ---- the tiny model and the workload ---------------------------------------------------------


def test_tiny_config_is_dsv4_shaped():
    assert CONFIG["model_type"] == "deepseek_v4" and CONFIG["num_attention_heads"] == 64
    ratios = CONFIG["compress_ratios"][: CONFIG["num_hidden_layers"]]
    assert {0, 4, 128} <= set(ratios)  # SWA-only, c4 (with the indexer), c128 layers
    assert CONFIG["window_size"] == 128 and CONFIG["index_topk"] == 512


def test_workload_is_fixed_and_makes_the_shapes_the_checks_need():
    segs = W.build()
    assert segs == W.build()  # fixed seed
    assert segs != W.build(seed=1)
    reqs = W.all_requests(segs)
    assert len({r.rid for r in reqs}) == len(reqs)
    assert all(10 <= t < W.VOCAB - 10 for r in reqs for t in r.prompt)
    lens = [len(r.prompt) for r in reqs]
    window, c128_page = CONFIG["window_size"], 128 * 64
    assert any(n > P.CHUNK for n in lens)  # prompts longer than the chunk
    assert (
        max(lens) > c128_page and max(lens) // 4 > CONFIG["index_topk"]
    )  # beyond the indexer's top-k
    # Requests that decode while later prompts arrive, with contexts beyond the SWA window.
    staggered = [s for s in segs if s.then]
    assert staggered and all(len(r.prompt) + 1 > window for s in staggered for r in s.then)
    assert W.peak_tokens(segs) <= P.MAX_TOTAL_TOKENS
    assert max(len(s.first) + len(s.then) for s in segs) <= P.MAX_RUNNING


def test_long_requests_still_decode_when_the_late_prompt_arrives():
    long = next(s for s in W.build() if s.name == "long")
    chunks = -(-W.LONG_PROMPT // P.CHUNK)
    ends = [chunks * (i + 1) + r.max_new for i, r in enumerate(long.first)]  # in chunk steps
    all_decoding_from = chunks * len(long.first)
    assert min(ends) - all_decoding_from >= W.LATE_MARGIN_STEPS


def test_long_mixed_steps_are_where_the_h200_cost_model_splits_c4():
    from sglang_mixgraph.core import split_cost_model as scm

    coeffs = scm.load_coefficients("sm90")
    d = W.LONG_REQUESTS
    seqs, exts = [W.LONG_PROMPT + P.CHUNK] + [W.LONG_PROMPT + 1] * d, [P.CHUNK] + [1] * d
    shape = lambda r: scm.StepShape.from_lists(r, seqs, exts, d, topk=CONFIG["index_topk"])  # noqa: E731
    assert scm.should_split(shape(4), coeffs) and not scm.should_split(shape(128), coeffs)
    short = scm.StepShape.from_lists(4, [900, 41], [256, 1], 1, topk=CONFIG["index_topk"])
    assert not scm.should_split(short, coeffs)  # the short segments stay unsplit under adaptive


# ---- phases ------------------------------------------------------------------------------------


def test_phases_parse_in_run_order_and_reject_unknown_names():
    names = [p.name for p in P.parse([])]
    assert len(names) == 9 and names[:3] == ["eager-off", "dgraph-off", "bcg-off"]
    assert [p.name for p in P.parse(["bcg-always", "eager-off"])] == ["eager-off", "bcg-always"]
    with pytest.raises(ValueError, match="unknown phase"):
        P.parse(["eager-sometimes"])


def test_phase_env_differs_from_its_baseline_by_the_split_alone():
    offs = {
        "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN": "0",
        "SGLANG_MIXGRAPH_SPLIT_POLICY": "always",
        "SGLANG_MIXGRAPH_PREFILL_BUCKETS": "upstream",
        "SGLANG_EXPERIMENTAL_FORCE_BCG": "0",
    }
    base = P.Phase("dgraph", "off").env(offs, radix=True)
    adaptive = P.Phase("dgraph", "adaptive").env(offs, radix=True)
    diff = {k for k in set(base) | set(adaptive) if base.get(k) != adaptive.get(k)}
    assert diff == {"SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN", "SGLANG_MIXGRAPH_SPLIT_POLICY"}
    assert (
        adaptive["SGLANG_MIXGRAPH_SPLIT_POLICY"] == "adaptive"
        and base["SGLANG_MIXGRAPH_PREFILL_BUCKETS"] == "upstream"
    )
    assert base[P.RADIX_CORE_ENV] == "python" and P.RADIX_CORE_ENV not in P.Phase(
        "eager", "off"
    ).env(offs, radix=False)


def test_engine_kwargs_per_graph_mode():
    kw = {g: P.Phase(g, "off").engine_kwargs("/m", radix=False, slot=1) for g in P.GRAPHS}
    assert kw["eager"]["disable_cuda_graph"] is True
    assert (
        kw["dgraph"]["cuda_graph_backend_prefill"] == "disabled"
        and kw["dgraph"]["cuda_graph_backend_decode"] == "full"
    )
    assert kw["bcg"]["cuda_graph_backend_prefill"] == "breakable"
    assert all(
        k["enable_mixed_chunk"]
        and k["chunked_prefill_size"] == P.CHUNK
        and k["disable_radix_cache"]
        for k in kw.values()
    )
    assert (
        P.Phase("eager", "off").engine_kwargs("/m", radix=True, slot=0)["port"]
        != kw["eager"]["port"]
    )


# ---- checks ------------------------------------------------------------------------------------


def test_compare_tokens_reports_first_differing_position_per_request():
    base = {"a": [1, 2, 3], "b": [4, 5], "c": [6], "d": [7, 8]}
    other = {"a": [1, 2, 3], "b": [4, 9], "c": [6, 0], "e": [1]}
    assert C.compare_tokens(base, other) == [
        C.Mismatch("b", 1, 2, 2),
        C.Mismatch("c", 1, 1, 2),
        C.Mismatch("d", None, 2, 0),
        C.Mismatch("e", None, 0, 1),
    ]
    assert C.compare_tokens(base, dict(base)) == []


def test_merge_counters_takes_each_process_last_line_and_sums_processes():
    lines = [
        {"pid": 1, "events": {"mixed_split": {"steps_split": 1}}, "fallbacks": {}},
        {
            "pid": 1,
            "events": {"mixed_split": {"steps_split": 5}},
            "fallbacks": {"mixed_split": {"bcg": 2}},
        },
        {"pid": 2, "events": {"mixed_split": {"steps_split": 1, "x": 3}}, "fallbacks": {}},
    ]
    assert C.merge_counters(lines) == {
        "events": {"mixed_split": {"steps_split": 6, "x": 3}},
        "fallbacks": {"mixed_split": {"bcg": 2}},
    }


def _steps(eager_mixed=0, graph_mixed=0):
    return (
        [{"mode": "MIXED", "graph": False}] * eager_mixed
        + [{"mode": "MIXED", "graph": True}] * graph_mixed
        + [{"mode": "DECODE", "graph": True}] * 3
    )


def _rec(name, split, *, steps, events=None, fallbacks=None, outputs=None, stubs=()):
    outputs = {"r0": [1, 2, 3], "r1": [4, 5]} if outputs is None else outputs
    return C.PhaseRecord(
        name=name,
        split=split,
        ran=True,
        outputs=outputs,
        expected_lens={"r0": 3, "r1": 2},
        steps=steps,
        counters={
            "events": {"mixed_split": events} if events else {},
            "fallbacks": {"mixed_split": fallbacks} if fallbacks else {},
        },
        stub_calls=list(stubs),
    )


def _failed(checks):
    return [c.name for c in checks if not c.ok]


ACTED = {
    "steps_seen.mixed_run_as_extend": 4,
    "steps_split": 4,
    "layers_split.c0": 4,
    "layers_split.c4": 8,
    "layers_split.c128": 4,
}


def test_a_split_phase_passes_only_with_equal_tokens_and_the_split_acting():
    base = _rec("eager-off", "off", steps=_steps(4))
    assert _failed(C.check_phase(base, None)) == []
    assert (
        _failed(C.check_phase(_rec("eager-always", "always", steps=_steps(4), events=ACTED), base))
        == []
    )
    # Equal tokens but the split never acted: failed, not a pass.
    vacuous = C.check_phase(
        _rec(
            "eager-always", "always", steps=_steps(4), events={"steps_seen.mixed_run_as_extend": 4}
        ),
        base,
    )
    assert _failed(vacuous) == [
        "split acted in every eager MIXED step",
        "layers of every compress ratio split",
    ]
    # Acted but different tokens: the mismatch is reported with its first position.
    differs = C.check_phase(
        _rec(
            "eager-always",
            "always",
            steps=_steps(4),
            events=ACTED,
            outputs={"r0": [1, 7, 3], "r1": [4, 5]},
        ),
        base,
    )
    bad = [c for c in differs if not c.ok]
    assert [c.name for c in bad] == ["tokens equal eager-off"] and "r0: first differs at 1" in bad[
        0
    ].detail


def test_adaptive_must_decide_every_step_and_split_some():
    base = _rec("dgraph-off", "off", steps=_steps(4))
    ok = {
        "steps_seen.mixed_run_as_extend": 4,
        "steps_split": 1,
        "steps_unsplit_adaptive": 3,
        "layers_split.c4": 2,
    }
    assert (
        _failed(
            C.check_phase(_rec("dgraph-adaptive", "adaptive", steps=_steps(4), events=ok), base)
        )
        == []
    )
    never = {"steps_seen.mixed_run_as_extend": 4, "steps_unsplit_adaptive": 4}
    assert _failed(
        C.check_phase(_rec("dgraph-adaptive", "adaptive", steps=_steps(4), events=never), base)
    ) == ["adaptive split at least one eager MIXED step"]


REPLAYS = {
    "replays_seen": 5,
    "replays_split": 5,
    "layers_split.c0": 5,
    "layers_split.c4": 10,
    "layers_split.c128": 5,
}


def test_replayed_mixed_steps_must_split_and_stubs_fail_a_phase():
    base = _rec("bcg-off", "off", steps=_steps(0, 5))
    assert (
        _failed(
            C.check_phase(_rec("bcg-always", "always", steps=_steps(0, 5), events=REPLAYS), base)
        )
        == []
    )
    partly = dict(REPLAYS, replays_split=2)
    assert _failed(
        C.check_phase(_rec("bcg-always", "always", steps=_steps(0, 5), events=partly), base)
    ) == ["split acted in every replayed MIXED step"]
    at_import = "cutlass.cute.jit (pid 1) from utils.py:331 < <frozen importlib._bootstrap>:488"
    serving = "sgl_kernel.x (pid 1) from layernorm.py:631 < deepseek_v4.py:900"
    stubbed = _rec(
        "bcg-always", "always", steps=_steps(0, 5), events=REPLAYS, stubs=[at_import, serving]
    )
    assert _failed(C.check_phase(stubbed, base)) == ["no stub was called while serving"]
    assert C.split_stub_calls([at_import, serving]) == ([serving], [at_import])
    only_import = _rec(
        "bcg-always", "always", steps=_steps(0, 5), events=REPLAYS, stubs=[at_import]
    )
    assert _failed(C.check_phase(only_import, base)) == []


def test_a_baseline_without_mixed_steps_or_with_split_activity_fails():
    assert _failed(C.check_phase(_rec("eager-off", "off", steps=_steps(0)), None)) == [
        "the workload made MIXED steps"
    ]
    assert _failed(
        C.check_phase(_rec("eager-off", "off", steps=_steps(2), events={"steps_split": 1}), None)
    ) == ["mixed_split inactive (flag off)"]


def test_missing_tokens_and_a_failed_run_are_failed_checks():
    short = _rec("eager-off", "off", steps=_steps(1), outputs={"r0": [1, 2], "r1": [4, 5]})
    assert _failed(C.check_phase(short, None)) == ["every request got all its tokens"]
    died = C.PhaseRecord(name="eager-always", split="always", ran=False, error="boom")
    assert _failed(C.check_phase(died, None)) == ["ran to the end"]


# ---- the driver, with a stand-in phase process -------------------------------------------------

FAKE_PHASE = """
import json, os, sys
kwargs, out = sys.argv[1], sys.argv[2]
split = os.environ["SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN"] == "1"
radix_serializes = os.environ.get("FAKE_RADIX_SERIALIZES") == "1" and "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND" in os.environ
acts = os.environ.get("FAKE_SPLIT_ACTS") == "1"
graph = json.load(open(kwargs)).get("cuda_graph_backend_prefill") == "breakable"
steps = [{"mode": "EXTEND" if radix_serializes else "MIXED", "bs": 3, "rows": 258, "graph": graph, "ms": 2.0}] * 2
steps += [{"mode": "DECODE", "bs": 3, "rows": 3, "graph": True, "ms": 1.0}]
with open(os.path.join(os.environ["MIXGRAPH_E2E_STEP_LOG"], "steps_1.jsonl"), "w") as f:
    f.writelines(json.dumps(s) + "\\n" for s in steps)
events, fallbacks = {}, {}
if split and graph and acts:
    events = {"replays_seen": 2, "replays_split": 2, "layers_split.c0": 2, "layers_split.c4": 4,
              "layers_split.c128": 2}
elif split and graph:
    events = {"replays_seen": 2}
elif split and acts:
    events = {"steps_seen.mixed_run_as_extend": 2, "steps_split": 2, "layers_split.c0": 2,
              "layers_split.c4": 4, "layers_split.c128": 2}
elif split:
    events = {"steps_seen.mixed_run_as_extend": 2, "steps_unsplit_adaptive": 2}
if events or fallbacks:
    snap = {"pid": 7, "events": {"mixed_split": events}, "fallbacks": {"mixed_split": fallbacks}}
    print("[x] sglang-mixgraph counters " + json.dumps(snap))
print("[gpu-upstream] stand-in first use: sgl_kernel.rmsnorm -> torch (pid 7)")
json.dump({"ok": True, "outputs": {"r0": [1, 2]}, "expected_lens": {"r0": 2}, "timings": {}}, open(out, "w"))
"""


def _run_driver(tmp_path, monkeypatch, acts, radix_serializes=False):
    import run_e2e

    fake = tmp_path / "fake_phase.py"
    fake.write_text(FAKE_PHASE)
    monkeypatch.setattr(run_e2e, "PHASE_SCRIPT", str(fake))
    monkeypatch.setenv("FAKE_SPLIT_ACTS", "1" if acts else "0")
    monkeypatch.setenv("FAKE_RADIX_SERIALIZES", "1" if radix_serializes else "0")
    out = tmp_path / "out"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "run_e2e.py",
            "eager-off",
            "eager-always",
            "bcg-off",
            "bcg-always",
            "--out",
            str(out),
            "--work",
            str(tmp_path / "work"),
            "--budget-s",
            "120",
        ],
    )
    rc = run_e2e.main()
    return (
        rc,
        json.loads((out / "e2e_results.json").read_text()),
        (out / "e2e_tiny_dsv4.log").read_text(),
    )


def test_driver_reports_phases_and_exits_zero_when_every_check_holds(tmp_path, monkeypatch):
    rc, report, log = _run_driver(tmp_path, monkeypatch, acts=True)
    assert rc == 0 and report["checks_failed"] == 0 and report["radix_cache"] is True
    eager = report["phases"]["eager-always"]
    assert eager["steps_by_mode"] == {"DECODE/graph": 1, "MIXED/eager": 2}
    assert eager["counters"]["events"]["mixed_split"]["steps_split"] == 2
    assert eager["standins"] == ["sgl_kernel.rmsnorm -> torch"]
    assert report["phases"]["bcg-always"]["counters"]["events"]["mixed_split"]["replays_split"] == 2
    assert "[ok] split acted in every eager MIXED step: split 2 of 2" in log
    assert (tmp_path / "out" / "phase_logs.tgz").exists()


def test_driver_exits_nonzero_when_the_split_never_acted(tmp_path, monkeypatch):
    rc, report, log = _run_driver(tmp_path, monkeypatch, acts=False)
    # eager and replayed: the split did not act, and no layer of any ratio split
    assert rc == 1 and report["checks_failed"] == 4
    assert "FAILED eager-always: split acted in every eager MIXED step: split 0 of 2" in log
    assert "FAILED bcg-always: split acted in every replayed MIXED step: split 0 of 2" in log


# ---- the Engine-only stand-ins (tools/gpu-upstream/engine) -------------------------------------

ENGINE = Path(__file__).resolve().parents[1] / "tools" / "gpu-upstream" / "engine"
SHIM = ENGINE.parent / "shim"


@pytest.fixture
def standins(monkeypatch):
    monkeypatch.syspath_prepend(str(SHIM))
    monkeypatch.syspath_prepend(str(ENGINE))
    import engine_standins

    return engine_standins


def test_rmsnorm_standin_equals_upstream_native_rmsnorm(standins, capsys):
    import torch
    from sglang.srt.layers.layernorm import RMSNorm

    torch.manual_seed(0)
    norm = RMSNorm(64, eps=1e-6).to(torch.bfloat16)
    norm.weight.data.uniform_(0.5, 1.5)
    x = torch.randn(5, 64, dtype=torch.bfloat16) * 3
    expected = norm.forward_native(x.clone())
    torch.testing.assert_close(
        standins.rmsnorm(x, norm.weight.data, 1e-6), expected, atol=2e-2, rtol=2e-2
    )
    out = torch.empty_like(x)
    assert standins.rmsnorm(x, norm.weight.data, 1e-6, out=out) is out
    assert (
        capsys.readouterr().err.count(standins.STANDIN_MARK + "sgl_kernel.rmsnorm") == 1
    )  # first use only


def test_moe_sum_reduce_standin_sums_topk_and_scales(standins):
    import torch

    x = torch.randn(3, 2, 8, dtype=torch.bfloat16)
    out = torch.empty(3, 8, dtype=torch.bfloat16)
    standins.moe_sum_reduce(x, out, 1.5)
    torch.testing.assert_close(out, (x.float().sum(1) * 1.5).to(torch.bfloat16))


def test_stub_calls_are_loud_and_still_raise(standins, capsys):
    import stubs

    standins._make_stub_calls_loud(stubs)
    with pytest.raises(stubs.StubCalled):
        stubs._stub_class("sgl_kernel.some_kernel")(1)
    assert standins.STUB_MARK + "sgl_kernel.some_kernel" in capsys.readouterr().err


def test_short_workload_is_the_full_one_without_the_long_segment():
    full, short = W.build(), W.build(workload="short")
    assert [s.name for s in short] == ["batch", "staggered"] and short == full[:2]
    with pytest.raises(ValueError, match="workload"):
        W.build(workload="tiny")


def test_driver_turns_the_radix_cache_off_when_it_leaves_no_mixed_step(tmp_path, monkeypatch):
    rc, report, log = _run_driver(tmp_path, monkeypatch, acts=True, radix_serializes=True)
    assert "radix cache (SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python) OFF for this run" in log
    assert "made no MIXED step" in log
    assert rc == 0 and report["radix_cache"] is False
    assert report["phases"]["eager-off"]["steps_by_mode"]["MIXED/eager"] == 2
