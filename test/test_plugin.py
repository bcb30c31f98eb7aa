"""The plugin in fresh SGLang processes: SGLang's loader finds and runs it (or skips it by the
allowlist), every target wrapped with every flag on and none with every flag off, a bad flag
value stopping startup, a patch deferring to an upstream flag of its name, and the one line
each process logs about its active patches. The registry and the flags: test_registry.py,
test_flags.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sglang_mixgraph.flags import FLAGS, StrictEnvSeconds
from sglang_mixgraph.kits.broken_import import broken_import_env
from sglang_mixgraph.patches import all_patches

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


# A fresh SGLang process per flag: the first in the fast tier, the rest slow (test_flags.py parses
# every flag's values in-process).
@pytest.mark.parametrize(
    "flag_name",
    [pytest.param(f, marks=pytest.mark.slow if i else ()) for i, f in enumerate(sorted(FLAGS))],
)
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
    assert f"SGLang's own field of that name (envs.{flag}) reads the value" in line
    assert "active patches: graph_config" in result.stderr


# A kernel library that will not load: importing the module raises OSError, as ctypes.CDLL does.
KERNEL_ERROR = "OSError('libbroken_kernel.so: cannot open shared object file')"
# Hooked by war_snapshot_check only; SGLang imports it lazily, for HIP (deepseek_v4_backend).
WAR_TARGET_MODULE = "sglang.srt.layers.attention.dsv4.low_ratio_backend_hip"

# load_plugins as SGLang's processes call it; what it registered and wrapped is printed even when
# startup stops (SystemExit goes on after the finally).
LOAD_WITH_A_BROKEN_MODULE = """
    import inspect, json, logging, sys
    logging.basicConfig(level=logging.INFO)
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang_mixgraph.patches.graph_config import PATCH as GRAPH_CONFIG
    from sglang_mixgraph.registry import resolve_target

    def identities():
        return {h.target: id(inspect.getattr_static(*resolve_target(h.target)[:2]))
                for h in GRAPH_CONFIG.hooks}

    def ours():  # other installed plugins register hooks of their own
        return sorted(t for t, hooks in HookRegistry._hooks.items()
                      if any(fn.__module__.startswith("sglang_mixgraph") for _, fn, _ in hooks))

    before = identities()
    try:
        from sglang.srt.plugins import load_plugins
        load_plugins()
    finally:
        print("OUT" + json.dumps({
            "registered": ours(),
            "graph_config_untouched": identities() == before,
        }))
"""


def test_an_enabled_patch_whose_target_module_does_not_import_stops_startup(tmp_path):
    """Used to: the OSError escaped register(), SGLang's loader logged "Failed to execute
    general plugin: mixgraph" and the server started with no patch at all."""
    env = broken_import_env(tmp_path, WAR_TARGET_MODULE, KERNEL_ERROR)
    env.update({"SGLANG_DEBUG_WAR_SNAPSHOT": "1", "SGLANG_MIXGRAPH_PREFILL_BUCKETS": "auto"})
    result = run_python(LOAD_WITH_A_BROKEN_MODULE, env=env)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "sglang-mixgraph: startup stopped." in result.stderr
    assert (
        f"importing {WAR_TARGET_MODULE} raised OSError: libbroken_kernel.so: cannot open shared "
        "object file"
    ) in result.stderr
    assert "switch the patch off (SGLANG_DEBUG_WAR_SNAPSHOT=0)" in result.stderr
    assert "Failed to execute general plugin" not in result.stderr
    assert "Traceback" not in result.stderr
    out = json.loads(result.stdout.split("OUT", 1)[1])
    # graph_config could apply, yet nothing of the plugin is installed: never half-applied
    assert out == {"registered": [], "graph_config_untouched": True}


# A patch on by default (none of the plugin's is) whose one target's module does not import.
DEFAULT_ON_PATCH_WITH_A_BROKEN_MODULE = """
    import json, logging
    logging.basicConfig(level=logging.INFO)
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    import sglang_mixgraph.patches as patches
    from sglang_mixgraph.flags import choice_flag
    from sglang_mixgraph.registry import Hook, Patch

    flag = choice_flag("SGLANG_MIXGRAPH_TEST_KERNEL", "on", ("on", "off"), "test", off_value="off")
    hook = Hook("mixgraph_test_kernel.attention", "function", "a", HookType.AROUND, print)
    kernel = Patch("kernel", "test", (flag,), (hook,), lambda: flag.get() == "on")
    shipped = patches.all_patches
    patches.all_patches = lambda: (*shipped(), kernel)
    from sglang.srt.plugins import load_plugins
    load_plugins()
    print("OUT" + json.dumps({"kernel_registered": hook.target in HookRegistry._hooks}))
"""


def test_a_default_on_patch_whose_target_module_does_not_import_warns_once_and_stays_off(
    tmp_path,
):
    env = broken_import_env(tmp_path, "mixgraph_test_kernel", KERNEL_ERROR)
    env["SGLANG_MIXGRAPH_PREFILL_BUCKETS"] = "auto"
    result = run_python(DEFAULT_ON_PATCH_WITH_A_BROKEN_MODULE, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.split("OUT", 1)[1]) == {"kernel_registered": False}
    assert "Executed general plugin: mixgraph" in result.stderr
    warnings = [
        line
        for line in result.stderr.splitlines()
        if line.startswith("WARNING") and "patch 'kernel'" in line
    ]
    assert len(warnings) == 1, result.stderr[-3000:]
    assert (
        "  target mixgraph_test_kernel.attention: expected function with (a), found importing "
        "mixgraph_test_kernel raised OSError: libbroken_kernel.so: cannot open shared object file"
    ) in result.stderr
    assert "Make mixgraph_test_kernel import (the error above) to use it" in result.stderr
    assert "active patches: graph_config" in result.stderr  # the rest of the plugin loads
    assert "Traceback" not in result.stderr


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
    from sglang_mixgraph.resolution.presets import DSV4_MODEL_DIR

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
