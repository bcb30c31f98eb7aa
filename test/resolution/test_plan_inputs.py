"""`sglang-mixgraph plan` and `doctor` on bad, hostile or unusual input.

Each case names what is wrong in one line (no traceback, no usage screen, no silent default),
every computation stays bounded, the described GPU never leaves `plan`'s own process, and a
plugin that SGLang will not load is reported as such.

Most cases run `cli.main` in this process (the conftest already describes a GPU here); the
ones that depend on what a fresh process imports or loads run the installed console script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sglang_mixgraph import cli, target_gpu
from sglang_mixgraph.core.prefill_buckets import padding_profile
from sglang_mixgraph.kits.model_configs import write_model
from sglang_mixgraph.resolution.plan_inputs import (
    MAX_CONFIG_LAYERS,
    MAX_PLAN_LIST,
    MAX_PLAN_SIZE,
    PlanInputError,
    prepare_argv,
)
from sglang_mixgraph.resolution.presets import DSV4_MODEL_DIR, GLM5_MODEL_DIR, MEGA_MOE_CAP_ENV

DSV4 = str(DSV4_MODEL_DIR)
BUCKETS_ENV = "SGLANG_MIXGRAPH_PREFILL_BUCKETS"


def _model(tmp_path: Path, architecture: str) -> str:
    return str(write_model(tmp_path / architecture, architectures=[architecture]))


def _plan_in_process(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["plan", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _our_lines(stderr: str) -> list[str]:
    """What plan itself printed on stderr (SGLang's own log lines start with a timestamp)."""
    return [line for line in stderr.splitlines() if line and not line.startswith("[")]


def _cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 240, inherit: bool = True
) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("sglang-mixgraph")
    if inherit:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    else:  # a bare environment: nothing this process (torch, SGLang) exported
        full_env = {k: os.environ[k] for k in ("PATH", "LANG", "TMPDIR") if k in os.environ}
    full_env.update(env or {})
    return subprocess.run(
        [str(script), *args], env=full_env, capture_output=True, text=True, timeout=timeout
    )


# ---------------------------------------------------------------- user errors: one line each


@pytest.mark.parametrize(
    "args, env, code, expected",
    [
        # a failed SGLang assert shows its condition and the values, not a bare AssertionError
        (
            ["--model-path", DSV4, "--tp", "3", "--attn-dp-size", "2"],
            {},
            1,
            "SGLang requires `cfg.tp_size % cfg.attn_dp_size == 0`, which does not hold "
            "(cfg.tp_size=3, cfg.attn_dp_size=2)",
        ),
        # without --model-path the arguments go on top of the reference deployment (attn DP 8)
        (["--tp", "4"], {}, 1, "(cfg.tp_size=4, cfg.attn_dp_size=8)"),
        (["--foo"], {}, 2, "unrecognized arguments: --foo"),
        (
            ["--model-path", "/nonexistent/model"],
            {},
            1,
            "--model-path /nonexistent/model does not exist",
        ),
        (["--model-path", DSV4, "--tp", "abc"], {}, 2, "invalid int value: 'abc'"),
        (
            [],
            {MEGA_MOE_CAP_ENV: "abc"},
            1,
            f"{MEGA_MOE_CAP_ENV}='abc' is not a valid value (\"abc\" is not a valid integer value); "
            "SGLang would warn and use its default 8192 instead",
        ),
        ([], {BUCKETS_ENV: "sometimes"}, 1, f"{BUCKETS_ENV}='sometimes' is not a valid value"),
        (
            ["--chunked-prefill-size", "99999999999"],
            {},
            1,
            f"--chunked-prefill-size 99999999999 is larger than plan accepts (at most {MAX_PLAN_SIZE})",
        ),
    ],
)
def test_a_user_error_is_one_line_naming_it(plan_env, capsys, args, env, code, expected):
    for name, value in env.items():
        plan_env.setenv(name, value)
    got, out, err = _plan_in_process(capsys, *args)
    assert got == code, err
    assert out == ""
    assert _our_lines(err) == [_our_lines(err)[0]] and _our_lines(err)[0].startswith(
        "sglang-mixgraph plan: "
    )
    assert expected in err
    assert "Traceback" not in err and "usage:" not in err


def test_an_architecture_without_a_model_class_is_an_error(plan_env, capsys, tmp_path):
    got, out, err = _plan_in_process(capsys, "--model-path", _model(tmp_path, "FooBarForCausalLM"))
    assert got == 1 and out == ""
    (line,) = _our_lines(err)
    assert "SGLang has no model class for architecture FooBarForCausalLM" in line
    assert "launch_server would fail loading the model" in line


def test_an_architecture_sglang_has_plans(plan_env, capsys, tmp_path):
    got, out, err = _plan_in_process(
        capsys, "--model-path", _model(tmp_path, "LlamaForCausalLM"), "--json"
    )
    assert got == 0, err
    assert json.loads(out)["model_class_note"] is None


def test_a_directory_without_config_json(plan_env, capsys, tmp_path):
    got, _, err = _plan_in_process(capsys, "--model-path", str(tmp_path))
    assert got == 1
    assert _our_lines(err) == [
        f"sglang-mixgraph plan: --model-path {tmp_path} has no config.json "
        "(plan reads the model's config.json)"
    ]


@pytest.mark.parametrize("content", ["[1, 2]", '"a string"', "3", "null", "{not json"])
def test_a_config_json_that_is_not_an_object(plan_env, capsys, tmp_path, content):
    config = tmp_path / "config.json"
    config.write_text(content)
    got, out, err = _plan_in_process(capsys, "--model-path", str(tmp_path))
    assert got == 1 and out == ""
    (line,) = _our_lines(err)
    assert line.startswith(f"sglang-mixgraph plan: {config} ")
    assert ("not an object" in line) or ("not valid JSON" in line)
    assert "AttributeError" not in err and "Traceback" not in err


def _dsv4_with_ratios(tmp_path: Path, ratios) -> str:
    config = json.loads((DSV4_MODEL_DIR / "config.json").read_text())
    config["compress_ratios"] = ratios(config["compress_ratios"])
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.mark.parametrize(
    "ratios, expected",
    [
        (
            lambda r: r * 2,
            "compress_ratios has 124 entries, more than num_hidden_layers=61 plus "
            "num_nextn_predict_layers=1; SGLang would build 30 indexer layers from the first 61 but "
            "count 60",
        ),
        (
            lambda r: r[:40],
            "compress_ratios has 40 entries for num_hidden_layers=61; layers 40..60",
        ),
        (lambda r: r[:-1] + [3], None),  # the MTP entry is not a layer SGLang builds: accepted
        (lambda r: [3] + r[1:], "compress_ratios holds 3; SGLang's DeepSeek-V4 layers accept"),
        (lambda r: "4,128", "compress_ratios must be a list of integers"),
    ],
)
def test_a_dsv4_compress_ratios_that_matches_no_layer_count(
    plan_env, capsys, tmp_path, ratios, expected
):
    model = _dsv4_with_ratios(tmp_path, ratios)
    if expected is None:
        from sglang_mixgraph.resolution.plan_inputs import _check_config_json

        _check_config_json(Path(model) / "config.json")  # no error; the plan itself is slow
        return
    got, out, err = _plan_in_process(capsys, "--model-path", model, "--tp", "8")
    assert got == 1 and out == ""
    (line,) = _our_lines(err)
    assert line.startswith(f"sglang-mixgraph plan: {Path(model) / 'config.json'}: ")
    assert expected in line


def test_the_embedded_dsv4_config_passes_the_config_checks():
    from sglang_mixgraph.resolution.plan_inputs import _check_config_json

    _check_config_json(DSV4_MODEL_DIR / "config.json")  # 61 layers + 1 MTP entry


def test_arguments_without_model_path_go_on_top_of_the_reference(plan_env, capsys):
    got, out, err = _plan_in_process(capsys, "--chunked-prefill-size", "11264", "--json")
    assert got == 0, err
    p = json.loads(out)
    assert p["default_deployment"] is True
    assert p["arguments_on_top"] == ["--chunked-prefill-size", "11264"]
    assert p["server_args"][:2] == ["--model-path", DSV4]
    assert p["graph"]["deployment"]["chunked_prefill_per_rank"] == 11264 // 8
    assert (
        p["graph"]["deployment"]["tp_size"] == 8
        and p["graph"]["deployment"]["enable_mixed_chunk"] is True
    )


def _only_line(result: subprocess.CompletedProcess) -> str:
    """The one line a refused plan printed: nothing else on stderr (no SGLang error, no
    traceback) and nothing on stdout."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and result.stdout == "", result.stderr[-3000:]
    return lines[0]


def test_the_config_json_given_as_the_model_path_is_refused():
    """Used to be planned as if it were the model's directory (launch_server would fail)."""
    result = _cli("plan", "--model-path", f"{DSV4}/config.json", timeout=120)
    assert result.returncode == 1
    assert _only_line(result) == (
        f"sglang-mixgraph plan: --model-path {DSV4}/config.json is the model's config.json, not "
        f"its directory: pass the directory that holds it (--model-path {DSV4})"
    )


def test_a_model_file_is_accepted_only_as_gguf(tmp_path):
    from sglang_mixgraph.resolution.plan_inputs import _check_model_path

    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"not a model")
    with pytest.raises(PlanInputError, match="is a file, not a model directory"):
        _check_model_path(str(weights))
    gguf = tmp_path / "model-q4"
    gguf.write_bytes(b"GGUF" + bytes(12))  # SGLang's check_gguf_file reads the magic
    _check_model_path(str(gguf))


def test_a_parallel_size_below_1_is_refused():
    """--tp 0 used to be planned as a valid deployment."""
    result = _cli("plan", "--tp", "0", timeout=120)
    assert result.returncode == 1
    assert (
        _only_line(result)
        == "sglang-mixgraph plan: --tp-size 0 is below 1: it is a number of ranks"
    )


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--ep", "-2"], "--ep-size -2 is below 1: it is a number of ranks"),
        (["--pp-size", "0"], "--pp-size 0 is below 1: it is a number of ranks"),
        (["--dp-size", "0"], "--dp-size 0 is below 1: it is a number of ranks"),
        (["--nnodes", "0"], "--nnodes 0 is below 1: it is a number of nodes"),
    ],
)
def test_every_parallel_size_below_1_is_refused_before_sglang_sees_it(args, expected):
    with pytest.raises(PlanInputError) as e:
        prepare_argv(["--model-path", DSV4, *args])
    assert str(e.value) == expected


def test_architectures_given_as_a_string_is_refused(tmp_path):
    """Used to be reported letter by letter ("L, l, a, m, a, ...")."""
    model = write_model(tmp_path / "llama", architectures="LlamaForCausalLM")
    result = _cli("plan", "--model-path", str(model), timeout=120)
    assert result.returncode == 1
    assert _only_line(result) == (
        f'sglang-mixgraph plan: {model / "config.json"}: "architectures" is the string '
        '"LlamaForCausalLM"; it must be a list of class names: ["LlamaForCausalLM"]'
    )


@pytest.mark.parametrize("architectures", [["LlamaForCausalLM", 3], [""], {"a": 1}])
def test_architectures_must_be_a_list_of_class_names(tmp_path, architectures):
    from sglang_mixgraph.resolution.plan_inputs import _check_config_json

    config = write_model(tmp_path / "m", architectures=architectures) / "config.json"
    with pytest.raises(PlanInputError, match='"architectures" must be a list of class names'):
        _check_config_json(config)


def test_a_malformed_config_yaml_is_plans_one_line_only(tmp_path):
    """SGLang's own four-line error used to come before plan's line."""
    config = tmp_path / "server.yaml"
    config.write_text("tp-size: [8\n  bad: : x\n")
    result = _cli("plan", "--config", str(config), timeout=120)
    assert result.returncode == 1
    line = _only_line(result)
    assert line.startswith("sglang-mixgraph plan: --config: while parsing a flow sequence")
    assert f'in "{config}", line 2, column 6' in line


# ---------------------------------------------------------------- bounded work


@pytest.mark.parametrize(
    "args, what",
    [
        (["--chunked-prefill-size", "1000000000"], "--chunked-prefill-size 1000000000"),
        (
            ["--cuda-graph-max-bs-prefill", str(MAX_PLAN_SIZE + 1)],
            f"--cuda-graph-max-bs-prefill {MAX_PLAN_SIZE + 1}",
        ),
        (["--cuda-graph-max-bs-decode", "99999999999"], "--cuda-graph-max-bs-decode 99999999999"),
        (["--cuda-graph-bs-prefill", "16", "99999999999"], "--cuda-graph-bs-prefill 99999999999"),
        (
            ["--cuda-graph-config", '{"prefill": {"max_bs": 99999999999}}'],
            "--cuda-graph-config prefill max_bs",
        ),
        (
            ["--cuda-graph-config", '{"decode": {"bs": [1, 99999999999]}}'],
            "--cuda-graph-config decode bs 99999999999",
        ),
    ],
)
def test_sizes_that_would_build_huge_lists_are_refused_before_sglang_sees_them(args, what):
    with pytest.raises(PlanInputError, match="larger than plan accepts") as e:
        prepare_argv(["--model-path", DSV4, *args])
    assert str(e.value).startswith(what)


def test_size_lists_are_bounded_in_length():
    sizes = [str(8 * (i + 1)) for i in range(MAX_PLAN_LIST + 1)]
    with pytest.raises(
        PlanInputError, match=f"lists {MAX_PLAN_LIST + 1} sizes; plan accepts at most"
    ):
        prepare_argv(["--model-path", DSV4, "--cuda-graph-bs-prefill", *sizes])


def test_the_ceiling_itself_is_accepted():
    prepared = prepare_argv(["--model-path", DSV4, "--chunked-prefill-size", str(MAX_PLAN_SIZE)])
    assert prepared.on_reference is False


def test_padding_profile_does_not_walk_every_size():
    start = time.monotonic()
    prof = padding_profile([16, 1 << 40], lo=1, hi=1 << 41)
    assert time.monotonic() - start < 1.0
    assert prof.smallest_replayed == 8 and prof.worst_factor == 2.0
    assert prof.eager_sizes == (1 << 41) - (16 - 8 + 1) - ((1 << 40) - (1 << 39) + 1)


def test_plan_returns_quickly_on_the_chunk_that_used_to_hang():
    start = time.monotonic()
    result = _cli(
        "plan", "--chunked-prefill-size", "1000000000", env={BUCKETS_ENV: "upstream"}, timeout=120
    )
    assert time.monotonic() - start < 120
    assert result.returncode == 1
    assert _our_lines(result.stderr) == [
        f"sglang-mixgraph plan: --chunked-prefill-size 1000000000 is larger than plan accepts "
        f"(at most {MAX_PLAN_SIZE}): SGLang builds a CUDA-graph size list up to it"
    ]


def _glm5_config(directory: Path, **changes) -> Path:
    """The embedded GLM-5 config.json with `changes`, in `directory`."""
    config = json.loads((GLM5_MODEL_DIR / "config.json").read_text())
    return write_model(directory, {**config, **changes})


def test_a_glm5_config_with_100_million_layers_is_refused_at_once(tmp_path):
    """Used to hang past 90 s inside SGLang's config loading (transformers builds per-layer
    lists, each entry validated)."""
    model = _glm5_config(tmp_path / "glm5", num_hidden_layers=100_000_000)
    result = _cli("plan", "--model-path", str(model), "--tp", "8", timeout=90)
    assert result.returncode == 1
    assert _only_line(result) == (
        f"sglang-mixgraph plan: {model / 'config.json'}: num_hidden_layers is 100000000, more "
        f"than plan accepts (at most {MAX_CONFIG_LAYERS}); SGLang's config loading builds lists "
        "that long"
    )


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"num_hidden_layers": 1e8}, "num_hidden_layers is 100000000.0, more than plan accepts"),
        (
            {"hidden_size": 10**12},
            f"hidden_size is {10**12}, more than plan accepts (at most 1048576)",
        ),
        (
            {"num_attention_heads": 10**6},
            "num_attention_heads is 1000000, more than plan accepts (at most 16384)",
        ),
        (
            {"vocab_size": 10**9},
            "vocab_size is 1000000000, more than plan accepts (at most 16777216)",
        ),
        ({"text_config": {"num_hidden_layers": 10**6}}, "text_config.num_hidden_layers is 1000000"),
        (
            {"compress_ratios": [4] * (2 * MAX_CONFIG_LAYERS + 1)},
            f"compress_ratios has {2 * MAX_CONFIG_LAYERS + 1} entries, more than plan accepts "
            f"(at most {2 * MAX_CONFIG_LAYERS}: one per layer and MTP layer)",
        ),
    ],
)
def test_config_sizes_are_bounded_before_sglang_reads_them(tmp_path, changes, expected):
    from sglang_mixgraph.resolution.plan_inputs import _check_config_json

    config = _glm5_config(tmp_path / "glm5", **changes) / "config.json"
    start = time.monotonic()
    with pytest.raises(PlanInputError) as e:
        _check_config_json(config)
    assert time.monotonic() - start < 1.0
    assert str(e.value).startswith(f"{config}: {expected}")


def test_the_ceilings_themselves_are_accepted(tmp_path):
    from sglang_mixgraph.resolution.plan_inputs import _check_config_json

    _check_config_json(GLM5_MODEL_DIR / "config.json")
    _check_config_json(
        _glm5_config(tmp_path / "glm5", num_hidden_layers=MAX_CONFIG_LAYERS) / "config.json"
    )


# ---------------------------------------------------------------- environment


def test_an_unwritable_home_is_named_as_the_cause(tmp_path):
    home = tmp_path / "home-is-a-file"
    home.write_text("")  # nothing can be created under it, even by root
    result = _cli("plan", env={"HOME": str(home)}, timeout=240, inherit=False)
    assert result.returncode == 1
    (line,) = _our_lines(result.stderr)
    assert line.startswith(f"sglang-mixgraph plan: cannot write {home}/")
    assert "point SGLANG_CACHE_DIR at a writable directory or make HOME" in line
    assert "Traceback" not in result.stderr and "server arguments" not in result.stderr


# Two fresh processes: plan's in the fast tier; doctor's, through the same handler
# (cli._until_the_reader_leaves), slow.
@pytest.mark.parametrize("command", ["plan", pytest.param("doctor", marks=pytest.mark.slow)])
def test_a_reader_that_closes_the_pipe_ends_the_report_quietly(command):
    """`plan | head`: used to end in a BrokenPipeError traceback."""
    script = Path(sys.executable).with_name("sglang-mixgraph")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has left before the first line is written
    try:
        result = subprocess.run(
            [str(script), command],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
            timeout=240,
        )
    finally:
        os.close(write_end)
    assert result.returncode == 141  # 128 + SIGPIPE, as a shell reports it for `yes | head`
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr
    assert "Exception ignored" not in result.stderr  # the interpreter's flush at exit is quiet


# ---------------------------------------------------------------- the SGLANG_PLUGINS allowlist


def test_plan_and_doctor_say_when_sglang_will_not_load_the_plugin(doctor_here):
    env = {"SGLANG_PLUGINS": "someone_else"}
    result = _cli("plan", "--json", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    p = json.loads(result.stdout)
    assert p["plugin"]["loaded"] is False
    assert "SGLANG_PLUGINS='someone_else'" in p["plugin"]["reason"]
    assert {x["status"] for x in p["patches"]} == {"not loaded"}
    # SGLang's own resolution: its blanket DeepSeek-V4 rule turns the prefill graph off and its
    # generic bucket list up to the global chunk stays (no derived buckets)
    assert p["graph"]["prefill_graph"]["backend"] == "disabled"
    assert p["graph"]["prefill_graph"]["decided_by"]["kind"] == "upstream rule"
    assert (
        max(p["graph"]["prefill_graph"]["buckets"]) == 22528
        and len(p["graph"]["prefill_graph"]["buckets"]) > 50
    )
    assert p["graph"]["bucket_lists"]["policy"] == "upstream (sglang-mixgraph is not loaded)"
    # that resolved list (86) is never captured, and says so beside the upstream list (45)
    lists = p["graph"]["bucket_lists"]
    assert lists["upstream"]["count"] == 45 and len(lists["final"]) == 86
    assert "SGLang never captures this list" in lists["final_note"]
    assert "sglang-mixgraph:" not in result.stderr  # none of our hooks ran

    # doctor reads the allowlist, not this process's plugins: it runs here (plan, above, needs a
    # process of its own, as SGLang's platform and plugins load once per process)
    code, doctor = doctor_here("--json", env=env)
    assert code == 0, doctor.err[-3000:]
    d = json.loads(doctor.out)
    assert d["plugin"]["loaded"] is False and "does not name 'mixgraph'" in d["plugin"]["reason"]
    assert {x["status"] for x in d["patches"]} == {"not loaded"}
    # what loading it would give: every patch off by default
    assert {x["status_if_loaded"] for x in d["patches"]} == {"off"}
    assert "UserWarning" not in doctor.err


def test_the_allowlist_naming_the_plugin_loads_it(monkeypatch):
    from sglang_mixgraph.resolution.resolve import plugin_load_status

    monkeypatch.setenv("SGLANG_PLUGINS", "someone_else, mixgraph")
    assert plugin_load_status().loaded is True
    monkeypatch.setenv("SGLANG_PLUGINS", "someone_else")
    assert plugin_load_status().loaded is False


# ---------------------------------------------------------------- the described GPU stays in plan


def test_activate_answers_only_in_a_process_that_selected_a_gpu(monkeypatch):
    monkeypatch.setattr(target_gpu, "_selected", None)
    monkeypatch.delenv("SGLANG_PLATFORM", raising=False)
    monkeypatch.setenv("SGLANG_MIXGRAPH_DESCRIBED_GPU", "H200")
    assert target_gpu.activate() is None
    # an inherited SGLANG_PLATFORM=mixgraph_target names the platform SGLang picks without it
    monkeypatch.setenv("SGLANG_PLATFORM", target_gpu.PLATFORM_PLUGIN_NAME)
    chosen = target_gpu.activate()
    assert chosen is not None and "DescribedGpuPlatform" not in chosen
    assert os.environ["SGLANG_PLATFORM"] == target_gpu.PLATFORM_PLUGIN_NAME


_PLATFORM_OF_A_SERVER = (
    "from sglang.srt.platforms import current_platform\n"
    "print('PLATFORM', type(current_platform).__name__)\n"
)


@pytest.mark.parametrize("inherited_platform", [False, True])
def test_a_server_process_never_sees_the_described_gpu(inherited_platform):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env["SGLANG_MIXGRAPH_DESCRIBED_GPU"] = (
        "H200"  # what used to turn any SGLang process into an H200
    )
    if inherited_platform:  # a process started from plan's or the tests' environment
        env["SGLANG_PLATFORM"] = target_gpu.PLATFORM_PLUGIN_NAME
    proc = subprocess.run(
        [sys.executable, "-c", _PLATFORM_OF_A_SERVER],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "PLATFORM" in proc.stdout and "DescribedGpuPlatform" not in proc.stdout


@pytest.mark.parametrize("mrr, per_rank", [("1", 1), ("7", 1), ("2048", 256), ("2050", 256)])
def test_running_requests_per_dp_rank_is_one_number_as_sglang_resolves_it(
    plan_env, capsys, mrr, per_rank
):
    # SGLang: max(1, max_running_requests // attn_dp_size) (pool_configurator); reference DP 8
    got, out, err = _plan_in_process(capsys, "--json", "--max-running-requests", mrr)
    assert got == 0, err
    p = json.loads(out)
    assert p["graph"]["deployment"]["max_running_requests"] == int(mrr)
    assert p["graph"]["deployment"]["running_per_rank"] == per_rank
    assert p["graph"]["deployment"]["running_per_rank"] == per_rank


def test_an_uncaptured_resolved_list_is_labelled_beside_the_upstream_one(plan_env, capsys):
    # the reference with the prefill graph off (upstream's DSV4 rule): SGLang keeps the list it
    # generated from the global chunk (86 sizes up to 22528) and never captures it; the upstream
    # list for the per-rank chunk (45 up to 2816) is what it captures with the graph on
    got, out, err = _plan_in_process(capsys)
    assert got == 0, err
    lines = out.splitlines()
    final = next(i for i, line in enumerate(lines) if "resolved list has 86" in line)
    assert "none captured (the prefill graph is off" in lines[final]
    assert lines[final + 1].startswith(
        "    note: the prefill graph is off, so SGLang never captures"
    )
    assert "upstream list (45 buckets, largest 2816)" in lines[final + 1]
    assert any(line.startswith("    upstream: 45 buckets") for line in lines)
    got, out, err = _plan_in_process(capsys, "--json")
    lists = json.loads(out)["graph"]["bucket_lists"]
    assert len(lists["final"]) == 86 and "never captures" in lists["final_note"]
