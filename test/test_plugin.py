"""Plugin discovery through SGLang's loader, flag parsing, and the registry's all-or-nothing install."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from sglang_mixgraph import plugin
from sglang_mixgraph.flags import FLAGS, FlagValueError, StrictEnvSeconds, bool_flag, choice_flag
from sglang_mixgraph.patches import all_patches
from sglang_mixgraph.registry import (
    Hook,
    Patch,
    PatchCheckError,
    check_hook,
    describe_signature,
    install,
    installed_sglang_version,
)

# Every patch module registers its flags in FLAGS when imported; import them all now so
# FLAGS is complete whatever ran before (collection order decides otherwise).
all_patches()


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (SGLang loads plugins once per process)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )


# Flags a test can set to turn each patch on (the first non-off value).
def _on_value(flag) -> str:
    if isinstance(flag.field, StrictEnvSeconds):
        return "1"
    return (
        "1"
        if isinstance(flag.default, bool)
        else next(v for v in flag.accepted if v != flag.off_value)
    )


LOAD_AND_REPORT = """
    import json, logging, sys
    logging.basicConfig(level=logging.INFO)
    from sglang.srt.plugins import load_plugins
    load_plugins()
    print(json.dumps({"loaded": "sglang_mixgraph.plugin" in sys.modules}))
"""


def test_sglang_loader_discovers_and_runs_mixgraph():
    result = run_python(LOAD_AND_REPORT)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {"loaded": True}
    assert "Executed general plugin: mixgraph" in result.stderr
    assert "sglang-mixgraph:" in result.stderr


def test_sglang_plugins_allowlist_without_mixgraph_skips_it():
    result = run_python(LOAD_AND_REPORT, env={"SGLANG_PLUGINS": "someone_else"})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {"loaded": False}
    assert "Skipping plugin mixgraph" in result.stderr


IDENTITIES = """
    import inspect, json, pkgutil
    from sglang_mixgraph.patches import all_patches
    from sglang_mixgraph.registry import resolve_target

    def identities():
        out = {}
        for patch in all_patches():
            for hook in patch.hooks:
                owner, attr, _ = resolve_target(hook.target)
                out[hook.target] = id(inspect.getattr_static(owner, attr))
        return out

    before = identities()
    from sglang.srt.plugins import load_plugins
    load_plugins()
    after = identities()
    print(json.dumps({"before": before, "after": after}))
"""


def _every_patch_target() -> set[str]:
    return {h.target for p in all_patches() for h in p.hooks}


def test_with_every_flag_off_no_upstream_attribute_changes():
    env = {f.name: f.off_value for f in FLAGS.values()}
    result = run_python(IDENTITIES, env=env)
    assert result.returncode == 0, result.stderr
    ids = json.loads(result.stdout.splitlines()[-1])
    assert set(ids["before"]) == _every_patch_target()
    assert ids["before"], "no patch registers a target"
    assert ids["after"] == ids["before"]


def test_with_every_flag_on_every_target_is_wrapped():
    env = {f.name: _on_value(f) for f in FLAGS.values()}
    result = run_python(IDENTITIES, env=env)
    assert result.returncode == 0, result.stderr
    ids = json.loads(result.stdout.splitlines()[-1])
    changed = {t for t in ids["before"] if ids["before"][t] != ids["after"][t]}
    assert changed == _every_patch_target()


@pytest.mark.parametrize("flag_name", sorted(FLAGS))
def test_invalid_flag_value_stops_startup_naming_variable_and_values(flag_name):
    result = run_python(
        "from sglang.srt.plugins import load_plugins\nload_plugins()\n",
        env={flag_name: "maybe"},
    )
    assert result.returncode != 0
    flag = FLAGS[flag_name]
    assert f"{flag_name}='maybe' is not a valid value" in result.stderr
    assert all(v in result.stderr for v in flag.accepted)


# ---------------------------------------------------------------- in-process registry tests


def _victim(a, b, *, c=1):
    return (a, b, c)


class _Victim:
    def method(self, x, *args, y, **kwargs):
        return x

    @classmethod
    def build(cls, z, /):
        return z


def _passthrough(original, *args, **kwargs):
    return original(*args, **kwargs)


@pytest.fixture
def test_flags(monkeypatch):
    bool_flag("SGLANG_MIXGRAPH_TEST_BOOL", False, "test-only")
    choice_flag("SGLANG_MIXGRAPH_TEST_CHOICE", "a", ("a", "b"), "test-only", off_value="a")
    yield
    for name in ("SGLANG_MIXGRAPH_TEST_BOOL", "SGLANG_MIXGRAPH_TEST_CHOICE"):
        FLAGS.pop(name)


@pytest.fixture
def clean_hook_registry():
    saved = {k: list(v) for k, v in HookRegistry._hooks.items()}
    yield
    HookRegistry._hooks.clear()
    HookRegistry._hooks.update(saved)


def test_describe_signature_marks_positional_and_keyword_only():
    assert describe_signature(_victim) == "a, b, *, c"
    assert describe_signature(_Victim.method) == "self, x, *args, y, **kwargs"
    assert describe_signature(_Victim.__dict__["build"].__func__) == "cls, z, /"


def test_check_hook_reports_kind_and_signature():
    here = __name__
    ok = check_hook(
        Hook(f"{here}._victim", "function", "a, b, *, c", HookType.AROUND, _passthrough)
    )
    assert ok.ok and ok.found == "function (a, b, *, c)"
    cls = check_hook(
        Hook(f"{here}._Victim.build", "classmethod", "cls, z, /", HookType.AFTER, print)
    )
    assert cls.ok
    wrong_kind = check_hook(
        Hook(f"{here}._Victim.build", "method", "cls, z, /", HookType.AFTER, print)
    )
    assert not wrong_kind.ok and wrong_kind.found.startswith("classmethod")
    missing = check_hook(Hook(f"{here}._Victim.gone", "method", "self", HookType.AFTER, print))
    assert not missing.ok and "has no attribute 'gone'" in missing.found


def _patch(pid, flag_name, hooks):
    flag = FLAGS[flag_name]
    return Patch(
        id=pid,
        summary="test",
        flags=(flag,),
        hooks=tuple(hooks),
        is_enabled=lambda: flag.get() not in (False, flag.off_value),
    )


@pytest.mark.parametrize(
    "bad_hook, found_text",
    [
        (
            Hook(
                f"{__name__}._Victim.missing_method",
                "method",
                "self",
                HookType.AROUND,
                _passthrough,
            ),
            "missing: ",
        ),
        (
            Hook(f"{__name__}._victim", "function", "a, b, c", HookType.AROUND, _passthrough),
            "found function (a, b, *, c)",
        ),
    ],
    ids=["missing-method", "signature-mismatch"],
)
def test_enabled_patch_with_wrong_target_fails_and_nothing_is_registered(
    test_flags, clean_hook_registry, monkeypatch, bad_hook, found_text
):
    monkeypatch.setenv("SGLANG_MIXGRAPH_TEST_BOOL", "1")
    monkeypatch.setenv("SGLANG_MIXGRAPH_TEST_CHOICE", "b")
    good = _patch(
        "good",
        "SGLANG_MIXGRAPH_TEST_CHOICE",
        [Hook(f"{__name__}._victim", "function", "a, b, *, c", HookType.AROUND, _passthrough)],
    )
    bad = _patch("bad", "SGLANG_MIXGRAPH_TEST_BOOL", [bad_hook])
    registered_before = {k: list(v) for k, v in HookRegistry._hooks.items()}
    with pytest.raises(PatchCheckError) as err:
        install([good, bad])
    message = str(err.value)
    assert "patch 'bad' (SGLANG_MIXGRAPH_TEST_BOOL=True)" in message
    assert (
        f"target {bad_hook.target}: expected {bad_hook.kind} with ({bad_hook.signature})" in message
    )
    assert found_text in message
    assert f"installed sglang {installed_sglang_version()}" in message
    assert "SGLANG_MIXGRAPH_TEST_BOOL=0" in message
    assert {k: list(v) for k, v in HookRegistry._hooks.items()} == registered_before

    # Through the entry point the same failure stops startup (SystemExit escapes
    # load_plugins, which swallows ordinary exceptions).
    monkeypatch.setattr("sglang_mixgraph.patches.all_patches", lambda: (good, bad))
    with pytest.raises(SystemExit) as stop:
        plugin.register()
    assert "startup stopped" in str(stop.value) and bad_hook.target in str(stop.value)
    assert {k: list(v) for k, v in HookRegistry._hooks.items()} == registered_before


def _victim_with_optional(a, b, *, c=1, d=None):
    return (a, b, c, d)


def _victim_with_required(a, b, e, *, c=1):
    return (a, b, c, e)


def _strict_hook(original, a, b, *, c):
    return original(a, b, c=c)


@pytest.mark.parametrize(
    "target, hook_fn, why",
    [
        ("_victim_with_optional", _passthrough, ""),  # an added optional keyword: compatible
        (
            "_victim_with_optional",
            _strict_hook,
            "new optional parameter(s) d that the hook does not pass on",
        ),
        ("_victim_with_required", _passthrough, ""),  # passed on through *args / **kwargs
        (
            "_victim_with_required",
            _strict_hook,
            "new required parameter(s) e that the hook does not pass on",
        ),
        ("_victim", _strict_hook, ""),
    ],
)
def test_signature_check_by_what_the_hook_needs(target, hook_fn, why):
    check = check_hook(
        Hook(f"{__name__}.{target}", "function", "a, b, *, c", HookType.AROUND, hook_fn)
    )
    assert check.ok == (why == "") and check.why == why


def test_new_required_keyword_and_reordered_positionals_are_incompatible():
    from sglang_mixgraph.registry import incompatibility

    def required_keyword(a, b, *, c, f):
        return a

    def reordered(b, a, *, c=1):
        return a

    assert incompatibility("a, b, *, c", required_keyword, _strict_hook) == (
        "new required parameter(s) f that the hook does not pass on"
    )
    assert incompatibility("a, b, *, c", required_keyword, _passthrough) == ""
    assert incompatibility("a, b, *, c", reordered, _passthrough) == (
        "positional parameters (b, a) do not start with (a, b)"
    )


@pytest.fixture
def default_on_flag():
    flag = choice_flag(
        "SGLANG_MIXGRAPH_TEST_DEFAULT_ON", "on", ("on", "off"), "test-only", off_value="off"
    )
    yield flag
    FLAGS.pop(flag.name)


def test_default_on_patch_meeting_drift_warns_and_stays_off(
    default_on_flag, clean_hook_registry, monkeypatch, caplog
):
    monkeypatch.delenv(default_on_flag.name, raising=False)
    bad = _patch(
        "drifted",
        default_on_flag.name,
        [Hook(f"{__name__}._victim", "function", "a, b, c", HookType.AROUND, _passthrough)],
    )
    with caplog.at_level("WARNING", logger="sglang_mixgraph"):
        statuses = install([bad])
    assert statuses[0].state == "off (upstream changed)" and not statuses[0].enabled
    assert f"{__name__}._victim" not in HookRegistry._hooks
    warned = [r.getMessage() for r in caplog.records if "drifted" in r.getMessage()]
    assert len(warned) == 1
    assert "found function (a, b, *, c)" in warned[0] and f"{default_on_flag.name}=off" in warned[0]
    # the same patch switched on explicitly stops startup
    monkeypatch.setenv(default_on_flag.name, "on")
    with pytest.raises(PatchCheckError, match="switch the patch off"):
        install([bad])


def test_other_sglang_version_warns_once(monkeypatch, caplog):
    from sglang_mixgraph import registry

    monkeypatch.setattr(registry, "installed_sglang_version", lambda: "0.5.24")
    monkeypatch.setattr(registry, "_version_warned", False)
    with caplog.at_level("WARNING", logger="sglang_mixgraph"):
        install([])
        install([])
    warned = [r for r in caplog.records if "sglang 0.5.24 is installed" in r.getMessage()]
    assert len(warned) == 1


def test_drift_remedy_names_only_the_switch(test_flags, clean_hook_registry, monkeypatch):
    """A patch with a switch and a policy flag: only the switch turns it off."""
    monkeypatch.setenv("SGLANG_MIXGRAPH_TEST_BOOL", "1")
    switch, policy = FLAGS["SGLANG_MIXGRAPH_TEST_BOOL"], FLAGS["SGLANG_MIXGRAPH_TEST_CHOICE"]
    patch = Patch(
        id="two_flags",
        summary="test",
        flags=(switch, policy),
        hooks=(Hook(f"{__name__}._victim", "function", "a, b, c", HookType.AROUND, _passthrough),),
        is_enabled=lambda: bool(switch.get()),
    )
    with pytest.raises(PatchCheckError) as err:
        install([patch])
    remedy = str(err.value).splitlines()[-1]
    assert remedy.endswith("switch the patch off (SGLANG_MIXGRAPH_TEST_BOOL=0).")
    assert "SGLANG_MIXGRAPH_TEST_CHOICE" not in remedy


def test_disabled_patch_with_wrong_target_is_never_resolved(
    test_flags, clean_hook_registry, monkeypatch
):
    monkeypatch.delenv("SGLANG_MIXGRAPH_TEST_BOOL", raising=False)
    bad = _patch(
        "bad",
        "SGLANG_MIXGRAPH_TEST_BOOL",
        [Hook("no_such_module_anywhere.f", "function", "x", HookType.AROUND, _passthrough)],
    )
    statuses = install([bad])
    assert [s.state for s in statuses] == ["off"]
    assert statuses[0].checks == []
    assert "no_such_module_anywhere.f" not in HookRegistry._hooks


def test_enabled_patch_registers_its_hooks(test_flags, clean_hook_registry, monkeypatch):
    monkeypatch.setenv("SGLANG_MIXGRAPH_TEST_CHOICE", "b")
    hook = Hook(f"{__name__}._victim", "function", "a, b, *, c", HookType.AROUND, _passthrough)
    install([_patch("good", "SGLANG_MIXGRAPH_TEST_CHOICE", [hook])])
    assert [(t, h) for t, h, _ in HookRegistry._hooks[hook.target]] == [
        (HookType.AROUND, _passthrough)
    ]


@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("SGLANG_MIXGRAPH_TEST_BOOL", "1", True),
        ("SGLANG_MIXGRAPH_TEST_BOOL", "False", False),
        ("SGLANG_MIXGRAPH_TEST_BOOL", "", False),
        ("SGLANG_MIXGRAPH_TEST_CHOICE", "B", "b"),
    ],
)
def test_flags_parse_strictly_through_sglang_envs(test_flags, monkeypatch, name, value, expected):
    from sglang.srt.environ import envs

    monkeypatch.setenv(name, value)
    assert getattr(envs, name).get() == expected


@pytest.mark.parametrize(
    "name, value", [("SGLANG_MIXGRAPH_TEST_BOOL", "maybe"), ("SGLANG_MIXGRAPH_TEST_CHOICE", "c")]
)
def test_bad_flag_value_raises_naming_variable_and_accepted_values(
    test_flags, monkeypatch, name, value
):
    from sglang.srt.environ import envs

    monkeypatch.setenv(name, value)
    with pytest.raises(FlagValueError) as err:
        getattr(envs, name).get()
    assert name in str(err.value) and repr(value) in str(err.value)
    assert all(v in str(err.value) for v in FLAGS[name].accepted)


def test_our_flags_never_shadow_upstream_flags():
    """A name upstream's envs defines stays upstream's: our field is not put on Envs, and the
    flag reads as its default whatever the variable holds (it is SGLang's variable)."""
    from sglang.srt.environ import Envs

    name = "SGLANG_OPT_FLASHMLA_SPARSE_PREFILL"
    upstream = Envs.__dict__[name]
    try:
        flag = bool_flag(name, False, "clash")
        assert Envs.__dict__[name] is upstream
        assert flag.deferred and flag.upstream_field is upstream
        os.environ[name] = "1"
        assert flag.get() is False and flag.requests_on()
    finally:
        os.environ.pop(name, None)
        FLAGS.pop(name)


def test_patch_owning_an_upstream_flag_defers_and_touches_nothing(monkeypatch, clean_hook_registry):
    from sglang_mixgraph.registry import DEFERRED, evaluate

    name = "SGLANG_OPT_FLASHMLA_SPARSE_PREFILL"  # an upstream flag, standing in for a clash
    flag = bool_flag(name, False, "clash")
    try:
        # its one target does not exist: a deferred patch must never resolve it
        hook = Hook(
            "sglang.srt.server_args.ServerArgs.no_such", "method", "self", HookType.AROUND, print
        )
        patch = Patch("clashing", "test", (flag,), (hook,), flag.get)
        for value, requested in (("1", True), ("0", False), (None, False)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
            status = evaluate(patch)
            assert status.state == DEFERRED and not status.enabled and status.checks == []
            assert status.requested is requested
            assert "patch 'clashing' defers to upstream" in status.deferred
            assert f"defines {name} itself" in status.deferred
            assert f"Set {name} as SGLang documents it" in status.deferred
            assert ("to turn this plugin's patch on" in status.deferred) is requested
            assert "\n" not in status.deferred  # one line
            before = {k: list(v) for k, v in HookRegistry._hooks.items()}
            install([patch])  # no error, nothing registered
            assert {k: list(v) for k, v in HookRegistry._hooks.items()} == before
    finally:
        FLAGS.pop(name)


# SGLang ships SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN (as the upstream PR of the split would)
# before the plugin loads: registered the way SGLang's own flags are read, on its Envs class.
UPSTREAM_SHIPS_SPLIT_FLAG = """
    import inspect, json, logging, sys
    logging.basicConfig(level=logging.INFO)
    from sglang.srt.environ import EnvBool, Envs, envs
    upstream = EnvBool(False)
    upstream.name = "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN"
    setattr(Envs, upstream.name, upstream)
    from sglang_mixgraph.registry import resolve_target
    from sglang_mixgraph.patches.mixed_split import PATCH as SPLIT

    def identities():
        return {h.target: id(inspect.getattr_static(*resolve_target(h.target)[:2])) for h in SPLIT.hooks}

    before = identities()
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang_mixgraph.patches import all_patches
    from sglang_mixgraph.registry import evaluate
    print("OUT" + json.dumps({
        "loaded": "sglang_mixgraph.plugin" in sys.modules,
        "upstream_field_kept": Envs.__dict__[upstream.name] is upstream,
        "upstream_reads": envs.SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN.get(),
        "split_targets_untouched": identities() == before,
        "states": {p.id: evaluate(p).state for p in all_patches()},
    }))
"""


def test_upstream_flag_of_the_same_name_defers_the_patch_and_the_rest_loads():
    """Used to: RuntimeError in the plugin's import, swallowed by SGLang's loader, server
    unpatched without a word."""
    flag = "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN"
    result = run_python(
        UPSTREAM_SHIPS_SPLIT_FLAG,
        env={flag: "1", "SGLANG_MIXGRAPH_PREFILL_BUCKETS": "auto"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.split("OUT", 1)[1])
    assert out["loaded"] and out["upstream_field_kept"] and out["split_targets_untouched"]
    assert out["upstream_reads"] is True  # SGLang's own flag gets the user's value
    assert out["states"]["mixed_split"] == "deferred to upstream"
    assert out["states"]["graph_config"] == "active"  # the rest of the plugin loads
    assert "Failed to execute general plugin: mixgraph" not in result.stderr
    assert "Executed general plugin: mixgraph" in result.stderr
    warnings = [
        line
        for line in result.stderr.splitlines()
        if line.startswith("WARNING") and "defers to upstream" in line
    ]
    assert len(warnings) == 1, result.stderr[-3000:]
    (line,) = warnings
    assert "patch 'mixed_split'" in line and f"defines {flag} itself" in line
    assert f"You set {flag}='1'" in line and f"Set {flag} as SGLang documents it" in line
    assert "active patches: graph_config" in result.stderr


# A worker process as SGLang starts one: the module bound `configure_logger` at import (as
# scheduler.py, detokenizer_manager.py and data_parallel_controller.py do), then
# load_plugins() with no logging configured yet, then configure_logger (twice here).
ANNOUNCE_IN_WORKER = """
    import logging, sys, types
    from sglang.srt.utils import configure_logger
    worker = types.ModuleType("a_worker_module")
    worker.configure_logger = configure_logger
    sys.modules["a_worker_module"] = worker
    assert not logging.getLogger().handlers  # nothing configured when the plugin loads
    from sglang.srt.plugins import load_plugins
    load_plugins()

    class Args:
        log_level = "info"

    worker.configure_logger(Args(), prefix=" TP3")
    logging.getLogger("sglang").info("a later line")
    worker.configure_logger(Args(), prefix=" TP3")
"""

# The main process of launch_server: load_plugins(), then prepare_server_args' basicConfig.
ANNOUNCE_IN_MAIN = """
    import sys
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang.srt.server_args import prepare_server_args
    prepare_server_args(["--model-path", sys.argv[1]])
"""


def _announcements(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "sglang-mixgraph: " in line and "patch" in line]


def test_every_process_logs_its_active_patches_once_after_sglang_configures_logging():
    result = run_python(ANNOUNCE_IN_WORKER, env={"SGLANG_MIXGRAPH_PREFILL_BUCKETS": "auto"})
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = _announcements(result.stderr)
    # formatted by the handler configure_logger installed, with its prefix
    assert line.startswith("[") and " TP3] sglang-mixgraph: active patches: graph_config (" in line
    assert "SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto" in line
    assert "not active: mixed_split (off)" in line
    assert "a later line" in result.stderr


def test_the_main_process_logs_its_active_patches_after_prepare_server_args():
    from sglang_mixgraph.presets import DSV4_MODEL_DIR

    code = textwrap.dedent(ANNOUNCE_IN_MAIN) + textwrap.dedent(
        """
        import sglang.srt.server_args as sa
        print("WRAPPED" if not sa.prepare_server_args.__code__.co_filename.endswith(
            "server_args.py") else "ORIGINAL")
        """
    )
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}

    def run(**env):
        result = subprocess.run(
            [sys.executable, "-c", code, str(DSV4_MODEL_DIR)],
            env={**base_env, **env},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return result

    on = run(SGLANG_MIXGRAPH_PREFILL_BUCKETS="auto")
    (line,) = _announcements(on.stderr)
    assert line.startswith("[") and "] sglang-mixgraph: active patches: graph_config (" in line
    assert "not active: mixed_split (off)" in line and "(sglang " in line
    # With no patch enabled nothing of upstream is hooked, not even for this line.
    off = run()
    assert "ORIGINAL" in off.stdout and "WRAPPED" in on.stdout
    assert _announcements(off.stderr) == []
