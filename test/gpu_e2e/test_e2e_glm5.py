"""The GLM-5 phases of the end-to-end harness on CPU: definitions, checks, probe and driver.

The GPU run is ``run_e2e.py --model glm5`` (the H200 and the kit). Here the phases' Engine
arguments are resolved by SGLang's own ``plan`` for the tiny GLM-5, every check is fed records on
which it must fail as well as ones it must pass, the probe's counting runs on upstream's real
classes (its wrappers over stand-in modules, its live-object checks over upstream's MLA mixin and
Indexer), and the driver runs with a stand-in phase process that writes what a GLM-5 phase
writes.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import e2e_glm5 as G
import e2e_glm5_probe as probe
import e2e_step_log as L
import pytest
from e2e_checks import PhaseRecord

from sglang_mixgraph.kits import gpu_machine

ROOT = Path(__file__).resolve().parents[2]
CONFIG = json.loads(G.TINY_CONFIG.read_text())
LAYERS = G.indexer_layers(CONFIG)


# ---- phases -------------------------------------------------------------------------------


def test_default_phases_are_graph_x_drop_empty_with_the_eager_baseline_first():
    names = [p.name for p in G.parse([])]
    assert names == [
        "glm5-eager",
        "glm5-dgraph",
        "glm5-bcg",
        "glm5-eager-des",
        "glm5-dgraph-des",
        "glm5-bcg-des",
    ]
    assert G.parse(["glm5-bcg-des", "glm5-bcg"]) == [G.Glm5Phase("bcg"), G.Glm5Phase("bcg", True)]
    des = G.Glm5Phase("bcg", True)
    assert (des.baseline, des.twin, des.is_baseline) == ("glm5-eager", "glm5-bcg", False)
    assert G.Glm5Phase("eager").is_baseline
    for bad in ("glm5-pcg", "bcg-off", "glm5-bcg-rd"):
        with pytest.raises(ValueError, match="unknown GLM-5 phase"):
            G.parse([bad])


def test_engine_arguments_and_environment_select_the_kit_s_glm5_path():
    bcg = G.Glm5Phase("bcg", True)
    kw = bcg.engine_kwargs("/m", radix=True, slot=2)
    assert {k: kw[k] for k in gpu_machine.GLM5_ENGINE} == gpu_machine.GLM5_ENGINE
    assert kw["cuda_graph_backend_prefill"] == "breakable" and kw["enable_mixed_chunk"] is True
    assert kw["disable_radix_cache"] is False and kw["port"] == 31080
    assert G.Glm5Phase("eager").engine_kwargs("/m", radix=False, slot=0)["disable_cuda_graph"]
    assert (
        G.Glm5Phase("dgraph").engine_kwargs("/m", radix=True, slot=0)["cuda_graph_backend_prefill"]
        == "disabled"
    )
    with pytest.raises(ValueError, match="one GPU"):
        bcg.engine_kwargs("/m", radix=True, slot=0, dp=2)
    with pytest.raises(ValueError, match="stand-in"):
        bcg.engine_kwargs("/m", radix=True, slot=0, kernels="faithful")
    env = bcg.env({G.DES_FLAG: "0", "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN": "0"}, radix=True)
    assert env[G.DES_FLAG] == "1" and env["SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN"] == "0"
    assert {k: env[k] for k in gpu_machine.GLM5_ENV} == gpu_machine.GLM5_ENV
    assert env[gpu_machine.RADIX_CORE_ENV] == "python"
    assert G.Glm5Phase("bcg").env({G.DES_FLAG: "0"}, radix=False)[G.DES_FLAG] == "0"
    assert gpu_machine.RADIX_CORE_ENV not in G.Glm5Phase("bcg").env({}, radix=False)


def test_the_harness_config_is_the_generator_s_output():
    script = ROOT / "tools" / "glm5" / "make_tiny_glm5.py"
    spec = importlib.util.spec_from_file_location("make_tiny_glm5", script)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert CONFIG == gen.tiny_config() and LAYERS == CONFIG["num_hidden_layers"] == 4


def test_sglang_plans_the_bcg_phase_s_engine_arguments_for_the_tiny_glm5(
    tmp_path, capsys, monkeypatch
):
    from sglang_mixgraph import cli

    for name in list(os.environ):
        if name.startswith("SGLANG_") and name != "SGLANG_PLATFORM":
            monkeypatch.delenv(name)
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(G.TINY_CONFIG.read_text())
    kw = G.Glm5Phase("bcg").engine_kwargs(str(model), radix=True, slot=0)
    args = ["--tp", "1", "--enable-mixed-chunk", "--target-gpu", "H200"]
    for key in (
        "chunked_prefill_size",
        "max_running_requests",
        "dsa_topk_backend",
        "dsa_prefill_backend",
        "dsa_decode_backend",
        "kv_cache_dtype",
        "moe_runner_backend",
        "cuda_graph_backend_prefill",
    ):
        args += [f"--{key.replace('_', '-')}", str(kw[key])]
    code = cli.main(["plan", "--model-path", str(model), *args, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    plan = json.loads(out)
    assert plan["graph"]["model"] == ["GlmMoeDsaForCausalLM"]
    assert plan["attention_backend"] == "dsa"
    assert plan["graph"]["prefill_graph"]["backend"] == "breakable"
    assert plan["dsa_surface"][0] == "DSA split-op surface (4 of 4 layers run the indexer):"
    # bf16 KV cache and FlashMLA's sparse prefill: the RoPE kernel sits between the two breaks
    assert any("RoPE: a kernel between the two breaks" in line for line in plan["dsa_surface"])


# ---- checks -------------------------------------------------------------------------------


def _steps(graph: bool, split_ops: int, capturing: int = 0) -> list[dict]:
    prefill = {"bs": 2, "rows": 300, "graph": graph, "ms": 2.0}
    counts = {G.SPLIT_OPS: split_ops, G.SPLIT_OPS_CAPTURING: capturing}
    return [
        dict(prefill, mode="EXTEND", **counts),
        dict(prefill, mode="MIXED", **counts),
        {"mode": "DECODE", "bs": 2, "rows": 2, "graph": graph, "ms": 1.0, **counts},
    ]


GUARDS_OK = {
    "guards": [{"name": "dsa_indexer_split_op", "ok": True, "problems": []}],
    "live": [{"name": "live_split_op", "ok": True, "detail": ""}],
}


def _rec(phase: G.Glm5Phase, **kw) -> PhaseRecord:
    bcg = phase.graph == "bcg"
    empty = kw.pop("empty", 0)
    captures = [{"segments": 9, "empty": empty, "indexer_breaks": LAYERS}] * 2 if bcg else []
    fields = dict(
        name=phase.name,
        split="off",
        drop_empty=phase.drop_empty,
        ran=True,
        graph=phase.graph,
        outputs={"r0": [1, 2, 3]},
        expected_lens={"r0": 3},
        steps=_steps(bcg, LAYERS if bcg else 0),
        counters={"events": {}, "fallbacks": {}},
        probe={"captures": captures, "guards": [GUARDS_OK]},
    )
    if phase.drop_empty and bcg:
        fields["counters"] = {
            "events": {
                G.DES_PATCH: {
                    "captures_checked": 2,
                    "segments_dropped": 2 * empty,
                    "launches_skipped": 6 * empty,
                }
            },
            "fallbacks": {},
        }
    fields.update(kw)
    return PhaseRecord(**fields)


def _check(phase: G.Glm5Phase, rec: PhaseRecord | None = None, **others) -> dict[str, object]:
    rec = rec or _rec(phase)
    records = {"glm5-eager": _rec(G.Glm5Phase("eager")), **others}
    records.setdefault(phase.twin, _rec(G.Glm5Phase(phase.graph)))
    return {c.name: c for c in G.check_phase(rec, phase, records, LAYERS)}


@pytest.mark.parametrize("phase", G.parse([]), ids=lambda p: p.name)
def test_every_phase_passes_on_what_it_should_show(phase):
    checks = _check(phase)
    assert [f"{n}: {c.detail}" for n, c in checks.items() if not c.ok] == []
    assert ("tokens equal glm5-eager" in checks) == (not phase.is_baseline)
    assert ("tokens equal glm5-bcg" in checks) == (phase.name == "glm5-bcg-des")


def test_a_replayed_prefill_without_the_split_op_fails():
    bcg = G.Glm5Phase("bcg")
    name = "the indexer ran as one eager split op per layer in every captured prefill"
    # the indexer captured into the graph: its split op never ran in the replay
    assert not _check(bcg, _rec(bcg, steps=_steps(True, 0)))[name].ok
    # a run while the stream was capturing
    assert not _check(bcg, _rec(bcg, steps=_steps(True, LAYERS, capturing=1)))[name].ok
    # a captured bucket with one split-op break too few
    short = {"captures": [{"segments": 9, "empty": 0, "indexer_breaks": LAYERS - 1}]}
    assert not _check(bcg, _rec(bcg, probe=dict(short, guards=[GUARDS_OK])))[name].ok
    # no replayed prefill step at all: nothing shows the split op
    assert not _check(bcg, _rec(bcg, steps=_steps(False, 0)))[name].ok
    # an eager phase whose steps ran split ops
    eager = G.Glm5Phase("eager")
    bad = _check(eager, _rec(eager, steps=_steps(False, 2)))
    assert not bad["the indexer ran eagerly, never as a split op (no prefill graph)"].ok


def test_steps_without_the_probe_s_counts_fail():
    bcg = G.Glm5Phase("bcg")
    steps = [{k: v for k, v in s.items() if k != G.SPLIT_OPS} for s in _steps(True, LAYERS)]
    check = _check(bcg, _rec(bcg, steps=steps))[
        "the probe counted the indexer in every prefill step"
    ]
    assert not check.ok and check.detail == "2 of 2 prefill steps without its counts"


def test_drop_empty_must_drop_every_empty_segment_seen():
    des = G.Glm5Phase("bcg", True)
    name = "drop_empty_segments dropped every empty segment seen"
    assert _check(des, _rec(des, empty=4))[name].ok
    rec = _rec(des, empty=4)
    rec.counters["events"][G.DES_PATCH]["segments_dropped"] = 7
    check = _check(des, rec)[name]
    assert not check.ok and "2 breakable captures, 18 segments, 8 empty" in check.detail
    rec = _rec(des, empty=1)
    rec.counters["events"][G.DES_PATCH]["launches_skipped"] = 0
    assert not _check(des, rec)[name].ok
    # off: the probe must still have seen the captures, and the patch must be silent
    bcg = G.Glm5Phase("bcg")
    off = "empty segments counted; drop_empty_segments off"
    assert _check(bcg, _rec(bcg, empty=4))[off].ok
    assert not _check(bcg, _rec(bcg, probe={"captures": [], "guards": [GUARDS_OK]}))[off].ok


def test_tokens_must_equal_the_eager_phase_and_the_twin():
    des = G.Glm5Phase("bcg", True)
    checks = _check(des, _rec(des, outputs={"r0": [1, 2, 4]}))
    assert not checks["tokens equal glm5-eager"].ok and not checks["tokens equal glm5-bcg"].ok
    assert "r0: first differs at 2 (3 vs 3 tokens)" in checks["tokens equal glm5-eager"].detail
    died = _rec(G.Glm5Phase("bcg"), ran=False)
    assert not _check(des, **{"glm5-bcg": died})["tokens equal the phase it is compared with"].ok


def test_fallbacks_and_stray_patches_fail():
    bcg = G.Glm5Phase("bcg")
    name = "no fallback, and no patch acted but the phase's"
    fb = {"events": {}, "fallbacks": {G.DES_PATCH: {"no capture": 1}}}
    assert not _check(bcg, _rec(bcg, counters=fb))[name].ok
    stray = {"events": {"mixed_split": {"steps_seen.mixed": 3}}, "fallbacks": {}}
    assert not _check(bcg, _rec(bcg, counters=stray))[name].ok
    # drop_empty_segments acting where the phase did not switch it on
    des_events = {"events": {G.DES_PATCH: {"captures_checked": 2}}, "fallbacks": {}}
    assert not _check(bcg, _rec(bcg, counters=des_events))[name].ok
    # hold_break_inputs counts its held inputs only where the run switched it on
    held = {"events": {G.HOLD_PATCH: {"inputs_held": 30}}, "fallbacks": {}}
    assert not _check(bcg, _rec(bcg, counters=held))[name].ok
    assert _check(bcg, _rec(bcg, counters=held, hold_break_inputs=True))[name].ok


def test_guards_must_have_been_checked_live_and_hold():
    bcg = G.Glm5Phase("bcg")
    name = "doctor's GLM-5 guards hold against the running server's objects"
    captures = _rec(bcg).probe["captures"]
    assert not _check(bcg, _rec(bcg, probe={"captures": captures, "guards": []}))[name].ok
    failed = {
        "guards": [{"name": "mla_bmm_attention_composite", "ok": False, "problems": ["gone"]}],
        "live": [],
    }
    check = _check(bcg, _rec(bcg, probe={"captures": captures, "guards": [failed]}))[name]
    assert not check.ok and check.detail == "mla_bmm_attention_composite: gone"


def test_a_phase_that_died_stops_at_its_first_check():
    checks = G.check_phase(
        _rec(G.Glm5Phase("bcg"), ran=False, error="boom"), G.Glm5Phase("bcg"), {}, LAYERS
    )
    assert [(c.name, c.ok, c.detail) for c in checks] == [("ran to the end", False, "boom")]


# ---- the probe ----------------------------------------------------------------------------


@pytest.fixture
def fresh_probe(monkeypatch, tmp_path):
    monkeypatch.setattr(probe, "_counts", {"split_ops": 0, "capturing": 0})
    monkeypatch.setattr(probe, "_captures", {})
    monkeypatch.setattr(probe, "_guards_written", True)
    monkeypatch.setenv("MIXGRAPH_E2E_STEP_LOG", str(tmp_path))
    return probe


def test_split_op_runs_are_counted_per_forward_and_per_capture(fresh_probe, monkeypatch, tmp_path):
    from contextvars import ContextVar

    import torch

    capture_var = ContextVar("capture", default=None)
    capturing = iter([False, True, False, False])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: next(capturing))
    module = SimpleNamespace(get_tc_piecewise_forward_context=lambda: "context")
    fresh_probe._count_split_ops(module)
    monkeypatch.setattr(fresh_probe, "_current_capture", capture_var.get)
    step = fresh_probe.StepProbe()
    step.begin(None)
    assert [module.get_tc_piecewise_forward_context() for _ in range(3)] == ["context"] * 3
    assert step.end(None) == {"dsa_split_ops": 3, "dsa_split_ops_capturing": 1}
    capture = object()
    capture_var.set(capture)
    module.get_tc_piecewise_forward_context()
    assert fresh_probe._captures[id(capture)]["indexer_breaks"] == 1


def test_segments_are_counted_and_written_per_capture(fresh_probe, monkeypatch, tmp_path):
    class Capture:
        def _end_current_segment(self):
            return None

        def __exit__(self, *args):
            return None

    nodes = iter([5, 0, None, 3])
    module = SimpleNamespace(
        BreakableCUDAGraphCapture=Capture,
        get_current_stream=lambda: SimpleNamespace(cuda_stream=0),
    )
    monkeypatch.setattr(fresh_probe, "segment_nodes", lambda handle: next(nodes))
    fresh_probe._count_segments(module)
    capture = Capture()
    for _ in range(4):
        capture._end_current_segment()
    capture.__exit__(None, None, None)
    lines = next(tmp_path.glob(f"{probe.CAPTURES_PREFIX}*.jsonl")).read_text().splitlines()
    assert [json.loads(x) for x in lines] == [
        {"segments": 4, "with_nodes": 2, "empty": 1, "unknown": 1, "indexer_breaks": 0}
    ]
    assert G.read_probe(tmp_path)["captures"] == [json.loads(lines[0])]


def test_the_step_log_adds_the_probe_s_fields(monkeypatch, tmp_path):
    import torch
    from test_e2e_harness import cpu_step_log

    class Probe:
        def begin(self, runner):
            runner.began = True

        def end(self, runner):
            return {"dsa_split_ops": 4, "began": runner.began}

    class ModelRunner:
        def forward(self, forward_batch):
            return SimpleNamespace(can_run_graph=True)

    monkeypatch.setattr(L, "PROBES", [Probe()])
    cpu_step_log(monkeypatch, tmp_path)
    module = SimpleNamespace(ModelRunner=ModelRunner)
    L._wrap_forward(module)
    batch = SimpleNamespace(
        forward_mode=SimpleNamespace(name="EXTEND"),
        input_ids=torch.zeros(7),
        batch_size=2,
        global_num_tokens_cpu=None,
    )
    module.ModelRunner().forward(batch)
    (line,) = next(tmp_path.glob("steps_*.jsonl")).read_text().splitlines()
    rec = json.loads(line)
    assert (rec["mode"], rec["rows"], rec["graph"]) == ("EXTEND", 7, True)
    assert (rec["dsa_split_ops"], rec["began"]) == (4, True)


def test_fused_add_rmsnorm_standin_equals_upstream_native_norm(monkeypatch, capsys):
    import torch
    from sglang.srt.layers.layernorm import RMSNorm

    monkeypatch.syspath_prepend(str(gpu_machine.ENGINE_DIR.parent / "shim"))
    standins = gpu_machine.engine_standins()
    torch.manual_seed(0)
    norm = RMSNorm(64, eps=1e-5).to(torch.bfloat16)
    norm.weight.data.uniform_(0.5, 1.5)
    x, residual = torch.randn(5, 64, dtype=torch.bfloat16), torch.randn(5, 64, dtype=torch.bfloat16)
    want_x, want_residual = norm.forward_native(x.clone(), residual.clone())
    monkeypatch.setattr(standins, "_announced", set())
    standins.fused_add_rmsnorm(x, residual, norm.weight.data, 1e-5)  # in place, as sgl_kernel
    torch.testing.assert_close(residual, want_residual)
    torch.testing.assert_close(x, want_x, atol=2e-2, rtol=2e-2)
    assert standins.SGL_KERNEL["sgl_kernel.fused_add_rmsnorm"] is standins.fused_add_rmsnorm
    assert capsys.readouterr().err.splitlines() == [
        f"{standins.STANDIN_MARK}sgl_kernel.fused_add_rmsnorm -> torch (pid {os.getpid()})"
    ]


def _upstream():
    for name in (probe.BCG_MODULE, probe.INDEXER_MODULE, probe.SPLIT_MODULE):
        importlib.import_module(name)
    from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_mla import (
        DeepseekMLAForwardMixin,
    )

    return Indexer, DeepseekMLAForwardMixin


def _layer(mixin, indexer_cls, **kw):
    import torch

    layer = object.__new__(type("Attn", (mixin,), {}))
    layer.indexer = object.__new__(indexer_cls)
    layer.use_deep_gemm_bmm = False
    layer.w_kc = torch.empty(1, dtype=torch.bfloat16)
    layer.current_attention_backend = "dsa"
    vars(layer).update(kw)
    return layer


def test_live_checks_pass_on_upstream_s_classes_and_name_what_breaks_them():
    import torch

    indexer_cls, mixin = _upstream()
    model = SimpleNamespace(modules=lambda: [object(), _layer(mixin, indexer_cls)])
    assert [c for c in probe.live_checks(model) if not c["ok"]] == []
    fp8 = _layer(mixin, indexer_cls, w_kc=torch.empty(1, dtype=torch.float8_e4m3fn))
    other = _layer(mixin, indexer_cls, current_attention_backend="torch_native")
    checks = {
        c["name"]: c for c in probe.live_checks(SimpleNamespace(modules=lambda: [fp8, other]))
    }
    assert not checks["live_bmm_attention_composite"]["ok"]
    assert checks["live_bmm_attention_composite"]["detail"] == (
        "layer 0: fp8 w_kc; layer 1: backend 'torch_native'"
    )
    assert checks["live_split_op"]["ok"] and checks["live_indexers"]["ok"]
    assert not {c["name"]: c for c in probe.live_checks(SimpleNamespace(modules=list))}[
        "live_indexers"
    ]["ok"]


# ---- the driver ---------------------------------------------------------------------------

FAKE_GLM5_PHASE = """
import json, os, sys
kwargs, out = sys.argv[1], sys.argv[2]
steps_dir = os.environ["MIXGRAPH_E2E_STEP_LOG"]
assert "e2e_glm5_probe" in os.environ["MIXGRAPH_E2E_STARTUP"]
assert os.environ["SGLANG_DSA_FUSE_TOPK"] == "0"
des = os.environ["SGLANG_OPT_BCG_DROP_EMPTY_SEGMENTS"] == "1"
bcg = json.load(open(kwargs)).get("cuda_graph_backend_prefill") == "breakable"
ops = {"dsa_split_ops": 4 if bcg else 0, "dsa_split_ops_capturing": 0}
steps = [dict(mode="MIXED", bs=2, rows=300, graph=bcg, ms=2.0, **ops)] * 2
with open(os.path.join(steps_dir, "steps_1.jsonl"), "w") as f:
    f.writelines(json.dumps(s) + "\\n" for s in steps)
if bcg:
    cap = {"segments": 10, "with_nodes": 10, "empty": 0, "unknown": 0, "indexer_breaks": 4}
    with open(os.path.join(steps_dir, "glm5_captures_1.jsonl"), "w") as f:
        f.write(json.dumps(cap) + "\\n")
guards = {"guards": [{"name": "dsa_indexer_split_op", "ok": True, "problems": []}], "live": []}
json.dump(guards, open(os.path.join(steps_dir, "glm5_guards_1.json"), "w"))
if des and bcg:
    snap = {"pid": 7, "events": {"drop_empty_segments": {"captures_checked": 1}}, "fallbacks": {}}
    print("[x] sglang-mixgraph counters " + json.dumps(snap))
json.dump({"ok": True, "outputs": {"r0": [1, 2]}, "expected_lens": {"r0": 2}, "timings": {}}, open(out, "w"))
"""


def _run_glm5_driver(tmp_path, monkeypatch, *extra: str):
    import run_e2e

    fake = tmp_path / "fake_phase.py"
    fake.write_text(FAKE_GLM5_PHASE)
    monkeypatch.setattr(run_e2e, "PHASE_SCRIPT", str(fake))
    out = tmp_path / "out"
    argv = ["run_e2e.py", "--model", "glm5", "--out", str(out), "--work", str(tmp_path / "w")]
    monkeypatch.setattr(sys, "argv", [*argv, "--budget-s", "120", *extra])
    rc = run_e2e.main()
    return rc, out


def test_driver_runs_the_six_glm5_phases_and_reports_their_checks(tmp_path, monkeypatch):
    rc, out = _run_glm5_driver(tmp_path, monkeypatch)
    report = json.loads((out / "e2e_results.json").read_text())
    log = (out / "e2e_tiny_glm5.log").read_text()
    assert rc == 0 and report["checks_failed"] == 0 and report["model"] == "glm5"
    assert sorted(report["phases"]) == sorted(p.name for p in G.parse([]))
    des = report["phases"]["glm5-bcg-des"]
    assert des["probe"]["captures"][0]["indexer_breaks"] == 4
    assert {c["name"] for c in des["checks"]} >= {
        "tokens equal glm5-eager",
        "tokens equal glm5-bcg",
        "drop_empty_segments dropped every empty segment seen",
        "the indexer ran as one eager split op per layer in every captured prefill",
        "doctor's GLM-5 guards hold against the running server's objects",
    }
    assert "e2e tiny GLM-5" in log and "GLM-5: 4 layers, 4 with the DSA indexer" in log


def test_driver_refuses_what_glm5_phases_do_not_run(tmp_path, monkeypatch, capsys):
    for extra in (["--dp", "2"], ["--kernels", "faithful"], ["glm5-pcg"]):
        with pytest.raises(SystemExit) as e:
            _run_glm5_driver(tmp_path, monkeypatch, *extra)
        assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--model glm5 runs on one GPU with the stand-in kernels" in err
    assert "unknown GLM-5 phase 'glm5-pcg'" in err


def test_the_probe_writes_doctor_s_guards_and_the_live_checks_once(fresh_probe, tmp_path):
    indexer_cls, mixin = _upstream()
    runner = SimpleNamespace(model=SimpleNamespace(modules=lambda: [_layer(mixin, indexer_cls)]))
    fresh_probe._guards_written = False
    step = fresh_probe.StepProbe()
    for _ in range(2):
        step.begin(runner)
        assert step.end(runner) == {"dsa_split_ops": 0, "dsa_split_ops_capturing": 0}
    (report,) = G.read_probe(tmp_path)["guards"]
    from sglang_mixgraph.resolution.upstream_guards import GUARDS

    assert [g["name"] for g in report["guards"]] == [g.name for g in GUARDS]
    assert [c["name"] for c in report["live"]] == [
        "live_split_op",
        "live_indexers",
        "live_bmm_attention_composite",
    ]
    bcg = G.Glm5Phase("bcg")
    rec = _rec(bcg, probe={"captures": _rec(bcg).probe["captures"], "guards": [report]})
    check = _check(bcg, rec)["doctor's GLM-5 guards hold against the running server's objects"]
    assert check.ok, check.detail


def test_drop_empty_segments_still_applies_over_the_probe_s_wrappers(fresh_probe, monkeypatch):
    from sglang_mixgraph.patches import all_patches
    from sglang_mixgraph.registry import check_hook

    module = importlib.import_module(probe.BCG_MODULE)
    cls = module.BreakableCUDAGraphCapture
    for name in ("_end_current_segment", "__exit__"):  # restored after the test
        monkeypatch.setattr(cls, name, vars(cls)[name])
    fresh_probe._count_segments(module)
    assert cls._end_current_segment.__wrapped__ is not None
    (patch,) = [p for p in all_patches() if p.id == G.DES_PATCH]
    checks = [check_hook(h) for h in patch.hooks if h.target.startswith(f"{probe.BCG_MODULE}.")]
    assert len(checks) == 4 and [c.why for c in checks if not c.ok] == []
