"""`sglang-mixgraph doctor` and `plan`, run as a user runs them: the installed console script.
Plans that read only plan's output run `cli.main` in this process (the conftest's `plan_env`),
doctor runs there too (`doctor_here`): a fresh process costs seconds of SGLang imports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sglang_mixgraph.flags import FLAGS
from sglang_mixgraph.kits.broken_import import broken_import_env
from sglang_mixgraph.kits.fake_nvidia_smi import NO_DRIVER, fake_nvidia_smi
from sglang_mixgraph.kits.model_configs import write_model
from sglang_mixgraph.patches import all_patches
from sglang_mixgraph.resolution.presets import DSV4_MODEL_DIR, MEGA_MOE_CAP_ENV

# Every patch module registers its flags in FLAGS when imported; import them all now so
# FLAGS is complete whatever ran before (collection order decides otherwise).
all_patches()

SCRIPT = shutil.which("sglang-mixgraph", path=os.path.dirname(sys.executable)) or shutil.which(
    "sglang-mixgraph"
)


# Made-up nvidia-smi answers, so that plan's default target does not depend on this machine.
_FAKE_BIN = tempfile.TemporaryDirectory(prefix="fake-nvidia-smi-")


def cli(
    *args: str, env: dict[str, str] | None = None, local_gpu: str | None = None
) -> subprocess.CompletedProcess:
    """Run the console script without SGLANG_* variables, on a machine whose nvidia-smi
    answers `local_gpu` ("NAME, MiB"), or fails as without a driver (None)."""
    assert SCRIPT, "the sglang-mixgraph console script is not installed"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    fake = Path(_FAKE_BIN.name) / (local_gpu or "none").replace(" ", "_").replace(",", "")
    full_env["PATH"] = fake_nvidia_smi(fake, local_gpu)
    full_env.update(env or {})
    return subprocess.run(
        [SCRIPT, *args], env=full_env, capture_output=True, text=True, timeout=300
    )


def cli_json(*args: str, env: dict[str, str] | None = None) -> dict:
    result = cli(*args, "--json", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def plan_here(capsys, *args: str) -> tuple[int, str, str]:
    """`sglang-mixgraph plan ARGS` in this process, under `plan_env`: (exit code, out, err)."""
    from sglang_mixgraph.cli import main

    capsys.readouterr()
    code = main(["plan", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def plan_json_here(capsys, *args: str) -> dict:
    code, out, err = plan_here(capsys, *args, "--json")
    assert code == 0, err[-3000:]
    return json.loads(out)


# ---------------------------------------------------------------- doctor


def test_doctor_json_reports_versions_gpu_flags_and_every_patch(monkeypatch, doctor_here):
    from sglang_mixgraph.registry import evaluate

    for name in FLAGS:  # doctor runs with no SGLANG_* variable (see cli())
        monkeypatch.delenv(name, raising=False)
    # every patch is in the state its flag defaults give it
    default_state = {p.id: evaluate(p).state for p in all_patches()}
    code, out = doctor_here("--json")
    assert code == 0, out.err[-3000:]
    report = json.loads(out.out)
    assert report["versions"]["sglang"] == "0.5.23"
    assert report["versions"]["sglang_pinned"] == "0.5.23"
    assert report["versions"]["sglang_requirement"] == "sglang<0.5.24,>=0.5.23"
    assert report["versions"]["torch"]
    assert report["versions"]["flash_mla"]
    assert report["gpu"]["available"] is False
    assert {f["name"] for f in report["flags"]} == set(FLAGS)
    for f in report["flags"]:
        assert f["value"] == FLAGS[f["name"]].default
    assert [p["id"] for p in report["patches"]] == [p.id for p in all_patches()]
    for p in report["patches"]:
        assert p["status"] == default_state[p["id"]]
        assert p["targets"] and all(t["ok"] for t in p["targets"]), p
    assert report["ok"] is True
    catalogue = {
        p["id"]: [p[k] for k in ("why", "how", "upstream_pr", "retired_by", "docs_page")]
        for p in report["patches"]
    }
    assert catalogue == {
        p.id: [p.why, p.how, p.upstream_pr, p.retired_by, p.docs_page] for p in all_patches()
    }
    assert all(p["docs_page"].startswith("docs/") for p in report["patches"])
    # 0.5.23 keeps break inputs as weak views: named, with the switch, and not a failure.
    assert "37606" in report["break_inputs"]
    assert "SGLANG_MIXGRAPH_BCG_HOLD_BREAK_INPUTS=1" in report["break_inputs"]


def test_every_patch_has_its_catalogue_entry():
    """Why it exists, how it works and what retires it, for every patch (doctor prints them)."""
    for patch in all_patches():
        assert patch.why and patch.how and patch.retired_by, patch.id
        assert patch.upstream_pr is None or patch.upstream_pr, patch.id


def test_doctor_exits_1_on_an_invalid_flag(doctor_here):
    if not FLAGS:
        pytest.skip("no flag defined")
    name = sorted(FLAGS)[0]
    code, out = doctor_here("--json", env={name: "maybe"})
    assert code == 1
    report = json.loads(out.out)
    entry = next(f for f in report["flags"] if f["name"] == name)
    assert "is not a valid value" in entry["error"]
    assert report["ok"] is False


def test_doctor_fits_one_screen_and_says_an_empty_flag_is_unset(doctor_here):
    code, out = doctor_here(env={"SGLANG_MIXGRAPH_PREFILL_BUCKETS": ""})
    assert code == 0, out.err[-3000:]
    lines = out.out.splitlines()
    assert len(lines) <= 50, len(lines)
    # the flag set (empty) is listed, the others counted
    assert f"Flags set ({len(FLAGS) - 1} others at their defaults; --verbose lists all):" in lines
    assert (
        "  SGLANG_MIXGRAPH_PREFILL_BUCKETS = 'upstream' (set empty: unset, the default applies)"
        in lines
    )
    # one line per patch: its state, its switches and its targets checked; no signatures
    for patch in all_patches():
        (line,) = [x for x in lines if x.startswith(f"  {patch.id}: ")]
        assert all(f.name in line for f in patch.switches), line
        assert line.endswith("targets ok"), line
    assert not any(x.lstrip().startswith(("[ok ] sglang.srt", "why:")) for x in lines)


@pytest.mark.parametrize(
    "env, switches",
    [
        ({"SGLANG_MIXGRAPH_PREFILL_BUCKETS": "auto"}, "SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto"),
        ({"SGLANG_EXPERIMENTAL_FORCE_BCG": "1"}, "SGLANG_EXPERIMENTAL_FORCE_BCG=1"),
        (
            {"SGLANG_EXPERIMENTAL_FORCE_BCG": "1", "SGLANG_MIXGRAPH_PREFILL_BUCKETS": "auto"},
            "SGLANG_EXPERIMENTAL_FORCE_BCG=1 or SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto",
        ),
        ({}, None),
    ],
)
def test_doctor_warns_what_the_bcg_switches_do_under_speculative_decoding(
    doctor_here, env, switches
):
    """Doctor knows no deployment: with a switch on it says, once, what it would do to a
    speculative DeepSeek-V4 deployment (the upstream issue named); without one, nothing."""
    code, out = doctor_here(env=env)
    assert code == 0, out.err[-3000:]
    said = [x for x in out.out.splitlines() if "#29985" in x]
    code, js = doctor_here("--json", env=env)
    entry = next(p for p in json.loads(js.out)["patches"] if p["id"] == "graph_config")
    if switches is None:
        assert said == [] and "speculative_warning" not in entry
        return
    warning = entry["speculative_warning"]
    assert warning.startswith(f"{switches} keeps the breakable prefill CUDA graph on for a")
    assert "if it uses speculative decoding" in warning and "SGLang issue #29985" in warning
    assert said == [f"      WARNING: {warning}"]


def test_doctor_exits_1_when_an_enabled_patch_cannot_apply():
    code = (
        "import sys\n"
        "from sglang.srt.plugins.hook_registry import HookType\n"
        "import sglang_mixgraph.patches as patches\n"
        "from sglang_mixgraph.flags import bool_flag\n"
        "from sglang_mixgraph.registry import Hook, Patch\n"
        "f = bool_flag('SGLANG_MIXGRAPH_TEST_BROKEN', False, 'test')\n"
        "hook = Hook('sglang.srt.server_args.ServerArgs.no_such_method', 'method', 'self', HookType.AROUND, print)\n"
        "patches.all_patches = lambda: (Patch('broken', 'test', (f,), (hook,), f.get),)\n"
        "from sglang_mixgraph.cli import main\n"
        "sys.exit(main(['doctor', '--json']))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env["SGLANG_MIXGRAPH_TEST_BROKEN"] = "1"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    (patch,) = report["patches"]
    assert patch["status"] == "cannot apply"
    assert "ServerArgs.no_such_method" in patch["reason"]
    assert patch["targets"][0]["ok"] is False


BCG_MODULE = (
    "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph"
)


# A module only war_snapshot_check hooks, and one that other patches hook and the upstream
# guards read (the second in the slow tier). Its package imports it in its __init__, so the
# package is the first module on the target's path whose import raises, and is named.
@pytest.mark.parametrize(
    "broken, patch, switch, target, named",
    [
        (
            "sglang.srt.layers.attention.dsv4.low_ratio_backend_hip",
            "war_snapshot_check",
            "SGLANG_DEBUG_WAR_SNAPSHOT",
            "sglang.srt.layers.attention.dsv4.low_ratio_backend_hip._extend_k_slots",
            "sglang.srt.layers.attention.dsv4.low_ratio_backend_hip",
        ),
        pytest.param(
            BCG_MODULE,
            "drop_empty_segments",
            "SGLANG_OPT_BCG_DROP_EMPTY_SEGMENTS",
            f"{BCG_MODULE}.BreakableCUDAGraphCapture._end_current_segment",
            BCG_MODULE.rsplit(".", 1)[0],
            marks=pytest.mark.slow,
        ),
    ],
)
def test_doctor_names_a_target_module_whose_import_raises(
    tmp_path, broken, patch, switch, target, named
):
    """Used to: doctor died with the OSError's traceback while checking the targets (and the
    upstream guards)."""
    env = broken_import_env(
        tmp_path, broken, "OSError('libbroken_kernel.so: cannot open shared object file')"
    )
    result = cli("doctor", env={**env, switch: "1"})
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert any(line.startswith(f"{patch}: cannot apply") for line in lines)
    assert (
        f"[BAD] {target}: importing {named} raised OSError: "
        "libbroken_kernel.so: cannot open shared object file"
    ) in lines


# Three fresh processes: switched on (exit 1) in the fast tier, unset and off slow.
@pytest.mark.parametrize(
    "value, code",
    [
        ("1", 1),
        pytest.param(None, 0, marks=pytest.mark.slow),
        pytest.param("0", 0, marks=pytest.mark.slow),
    ],
)
def test_doctor_shows_a_patch_deferred_to_an_upstream_flag(value, code):
    """SGLang defines SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN itself: doctor shows mixed_split as
    deferred with the reason, and fails only when the user switched this plugin's patch on."""
    flag = "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN"
    program = (
        "import sys\n"
        "from sglang.srt.environ import EnvBool, Envs\n"
        "upstream = EnvBool(False)\n"
        f"upstream.name = {flag!r}\n"
        "setattr(Envs, upstream.name, upstream)\n"
        "from sglang_mixgraph.cli import main\n"
        "sys.exit(main(['doctor', '--json']))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    if value is not None:
        env[flag] = value
    result = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == code, result.stderr[-3000:]
    report = json.loads(result.stdout)
    split = next(p for p in report["patches"] if p["id"] == "mixed_split")
    assert split["status"] == "deferred to upstream"
    assert f"defines {flag} itself" in split["reason"]
    assert f"Set {flag} as SGLang documents it" in split["reason"]
    assert split["requested_but_deferred"] is (code == 1)
    entry = next(f for f in report["flags"] if f["name"] == flag)
    assert entry["owner"] == "sglang" and "error" not in entry
    others = [p for p in report["patches"] if p["id"] != "mixed_split"]
    assert all(p["status"] != "deferred to upstream" for p in others)
    assert report["ok"] is (code == 0)


# ---------------------------------------------------------------- plan


@pytest.fixture(scope="module")
def reference_plan() -> dict:
    return cli_json("plan")


def test_plan_default_is_the_reference_deployment(reference_plan):
    p = reference_plan
    assert p["default_deployment"] is True
    assert p["assumed_gpu"]["name"] == "B300" and p["assumed_gpu"]["sm"] == 103
    # no GPU on the (made-up) machine: the default, and why
    assert p["assumed_gpu"]["source"] == "default"
    assert p["assumed_gpu"]["why"] == f"the default: no GPU here, nvidia-smi failed: {NO_DRIVER}"
    assert p["model_path"] == str(DSV4_MODEL_DIR)
    assert p["graph"]["deployment"]["tp_size"] == 8
    assert (
        p["graph"]["deployment"]["attn_dp_size"] == 8
        and p["graph"]["deployment"]["dp_attention"] is True
    )
    assert p["graph"]["deployment"]["enable_mixed_chunk"] is True
    assert p["graph"]["deployment"]["chunked_prefill_per_rank"] == 2816
    assert p["graph"]["deployment"]["max_running_requests"] == 2048
    assert p["graph"]["deployment"]["running_per_rank"] == 256
    assert p["attention_backend"] == "dsv4"
    assert p["graph"]["deployment"]["moe_a2a_backend"] == "megamoe"
    assert p["graph"]["deployment"]["mega_moe_cap_per_rank"] == 2816
    for phase in ("prefill_graph", "decode_graph"):
        graph = p["graph"][phase]
        assert graph["backend"] in ("breakable", "full", "disabled")
        assert graph["buckets"] == sorted(graph["buckets"])
        assert graph["max_bs"] >= max(graph["buckets"])
    assert p["graph"]["prefill_graph"]["decided_by"]
    assert {x["id"] for x in p["patches"]} == {x.id for x in all_patches()}


def test_plan_json_fields_each_once(reference_plan):
    """`plan --json`: what was planned and how at the top, the planner's result under "graph";
    the deployment facts and the graph configuration only there."""
    p = reference_plan
    assert set(p) == {
        "schema_version",
        "assumed_gpu",
        "server_args",
        "default_deployment",
        "preset",
        "arguments_on_top",
        "plugin",
        "model_path",
        "model_class_note",
        "attention_backend",
        "moe_runner_backend",
        "patches",
        "graph",
        "dsa_surface",
    }
    assert set(p["assumed_gpu"]) == {"name", "sm", "memory_bytes", "source", "why"}
    assert set(p["graph"]) == {
        "gpu",
        "model",
        "flags",
        "deployment",
        "prefill_graph",
        "decode_graph",
        "memory",
        "capture_memory",
        "capture_calibration",
        "split_cost_calibration",
        "bucket_lists",
        "validations",
        "ok",
    }
    assert set(p["graph"]["deployment"]) == {
        "tp_size",
        "attn_dp_size",
        "dp_attention",
        "enable_mixed_chunk",
        "chunked_prefill_per_rank",
        "max_running_requests",
        "running_per_rank",
        "moe_a2a_backend",
        "mega_moe_cap_per_rank",
        "mem_fraction_static",
    }
    assert set(p["graph"]["prefill_graph"]) == {
        "backend",
        "decided_by",
        "rules",
        "max_bs",
        "buckets",
        "speculative_warning",
    }
    assert p["graph"]["prefill_graph"]["speculative_warning"] is None  # no speculative decoding
    assert set(p["graph"]["decode_graph"]) == {"backend", "decided_by", "max_bs", "buckets"}


def test_plan_megamoe_cap_comes_from_the_environment(plan_env, capsys):
    plan_env.setenv(MEGA_MOE_CAP_ENV, "4096")
    p = plan_json_here(capsys)
    assert p["graph"]["deployment"]["mega_moe_cap_per_rank"] == 4096


# Slow tier (about 19 s, two fresh processes); in-process plans for described GPUs run in
# test_plan_decision.py and test_plan_inputs.py.
@pytest.mark.slow
def test_plan_target_gpu_reaches_sglang_resolution(tmp_path):
    model = _dense_model(tmp_path)
    b300 = cli_json("plan", "--model-path", str(model))
    h200 = cli_json("plan", "--target-gpu", "h200", "--model-path", str(model))
    assert (b300["assumed_gpu"]["sm"], h200["assumed_gpu"]["sm"]) == (103, 90)
    assert h200["assumed_gpu"]["source"] == "given"
    # SGLang picks the attention backend from the SM version (model_override_base.py).
    assert b300["attention_backend"] == "trtllm_mha"
    assert h200["attention_backend"] == "fa3"


def _dense_model(tmp_path: Path) -> Path:
    return write_model(tmp_path / "dense")


def test_plan_small_dense_model(plan_env, capsys, tmp_path):
    model = _dense_model(tmp_path)
    p = plan_json_here(
        capsys,
        "--model-path",
        str(model),
        "--chunked-prefill-size",
        "4096",
        "--max-running-requests",
        "64",
    )
    assert p["default_deployment"] is False
    assert (
        p["graph"]["deployment"]["tp_size"] == 1
        and p["graph"]["deployment"]["attn_dp_size"] == 1
        and p["graph"]["deployment"]["dp_attention"] is False
    )
    assert p["graph"]["deployment"]["enable_mixed_chunk"] is False
    assert p["graph"]["deployment"]["chunked_prefill_per_rank"] == 4096
    assert (
        p["graph"]["deployment"]["max_running_requests"] == 64
        and p["graph"]["deployment"]["running_per_rank"] == 64
    )
    deployment = p["graph"]["deployment"]
    assert (
        deployment["moe_a2a_backend"] != "megamoe" and deployment["mega_moe_cap_per_rank"] is None
    )
    assert p["graph"]["prefill_graph"]["backend"] == "breakable"
    assert p["graph"]["prefill_graph"]["decided_by"]["kind"] == "default"
    assert max(p["graph"]["prefill_graph"]["buckets"]) <= 4096


def test_plan_targets_this_machines_gpu_and_keeps_provenance_for_verbose(
    plan_env, capsys, tmp_path
):
    plan_env.setenv("PATH", fake_nvidia_smi(tmp_path / "h100", "NVIDIA H100 80GB HBM3, 81559"))
    code, out, err = plan_here(capsys)
    assert code == 0, err[-3000:]
    lines = out.splitlines()
    assert lines[0] == "target GPU: H100 (SM90), 81559 MiB (this machine's GPU)"
    assert "chunked prefill per rank 2816" in out
    # the split cost model's calibration in one line, no repository paths (--verbose has them)
    (split,) = [x for x in lines if x.startswith("Split cost model")]
    assert "calibrated on the NVIDIA H200 (sm90)" in split and split.endswith("--verbose)")
    assert not any(w in out for w in ("benchmark/", "docs/results/", "split_cost_"))


@pytest.mark.parametrize(
    "args, returncode, message",
    [
        (["--tp", "abc"], 2, "invalid int value: 'abc'"),
        (
            ["--tp", "8", "--attn-dp-size", "3"],
            1,
            "SGLang requires `cfg.tp_size % cfg.attn_dp_size == 0`, which does not hold "
            "(cfg.tp_size=8, cfg.attn_dp_size=3)",
        ),
    ],
)
def test_plan_invalid_server_arguments_give_sglangs_error(
    plan_env, capsys, args, returncode, message
):
    code, _, err = plan_here(capsys, "--model-path", str(DSV4_MODEL_DIR), *args)
    assert code == returncode
    assert message in err
    assert "Traceback" not in err and "usage:" not in err


def test_plan_rejects_unknown_target_gpu():
    result = cli("plan", "--target-gpu", "A100")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


# Slow tier (about 40 s, four fresh processes); the same notes in-process: test_plan_decision.py's
# test_what_the_split_would_do_follows_the_deployment.
@pytest.mark.slow
def test_plan_says_what_the_mixed_split_would_do(tmp_path):
    on = {"SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN": "1"}
    bcg = {**on, "SGLANG_MIXGRAPH_PREFILL_BUCKETS": "auto"}
    notes = {p["id"]: p.get("note") for p in cli_json("plan", env=bcg)["patches"]}
    # graph_config (auto) keeps BCG on for the reference deployment: replays split in the break.
    assert notes["mixed_split"].startswith("splits mixed steps")
    assert (
        "steps of up to 2816 tokens replay breakable prefill graphs and split inside the replay's "
        "attention break"
    ) in notes["mixed_split"]

    eager = {
        p["id"]: p
        for p in cli_json("plan", env=on)["patches"]  # the default: upstream's DSV4 rule
    }
    assert eager["mixed_split"]["status"] == "active"
    assert "replay" not in eager["mixed_split"]["note"]

    trtllm = {
        p["id"]: p.get("note")
        for p in cli_json(
            "plan",
            "--model-path",
            str(DSV4_MODEL_DIR),
            "--tp",
            "8",
            "--dsv4-attn-backend",
            "trtllm",
            env=on,
        )["patches"]
    }
    assert trtllm["mixed_split"].startswith("falls back to upstream: trtllm")

    dense = {
        p["id"]: p.get("note")
        for p in cli_json("plan", "--model-path", str(_dense_model(tmp_path)), env=on)["patches"]
    }
    assert dense["mixed_split"] == "not a DeepSeek-V4 model: nothing to split"


def test_plan_finds_every_switched_on_patch_applicable_after_the_plugin_loaded():
    """`plan` resolves with the plugin loaded (SGLang has applied the hooks), then checks each
    patch again: a hooked target is still its target (an eager_on_graph break among them)."""
    from sglang_mixgraph.patches import all_patches

    on = {}
    for patch in all_patches():
        switch = patch.switches[0]
        on[switch.name] = "auto" if switch.name == "SGLANG_MIXGRAPH_PREFILL_BUCKETS" else "1"
    patches = {p["id"]: p for p in cli_json("plan", "--target-gpu", "H100", env=on)["patches"]}
    assert {i: p["status"] for i, p in patches.items() if p["status"] == "cannot apply"} == {}
    assert patches["wo_a_in_break"]["status"] == "active"
