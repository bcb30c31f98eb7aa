"""The registry: signatures and target checks, the all-or-nothing install, drift of a
default-on patch, deferral to an upstream flag of the same name, and the catalogue entry (the
upstream PR named by number where there is one)."""

from __future__ import annotations

import pytest
from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import (
    breakable_cuda_graph as bcg,
)
from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from sglang_mixgraph import plugin
from sglang_mixgraph.flags import FLAGS, bool_flag, choice_flag
from sglang_mixgraph.patches import all_patches
from sglang_mixgraph.registry import (
    EAGER_BREAK,
    IMPORT_FAILED,
    Hook,
    Patch,
    PatchCheckError,
    check_attribute,
    check_hook,
    describe_signature,
    install,
    installed_sglang_version,
)


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


def _break_body(query, output, layer_id):
    return query


# A module-level graph break as SGLang declares DeepSeek-V4's attention break
_break = bcg.eager_on_graph(True)(_break_body)


def test_an_eager_break_target_checks_the_same_before_and_after_sglang_applies_its_hooks(
    clean_hook_registry, monkeypatch
):
    """`plan` checks every patch again after the plugin loaded: by then SGLang's HookRegistry
    has replaced the break with its wrapper function, which is still the break."""
    import sys

    module = sys.modules[__name__]
    original = module._break
    monkeypatch.setattr(module, "_break", original)  # restored after the hooks replace it
    hook = Hook(
        f"{__name__}._break", EAGER_BREAK, "query, output, layer_id", HookType.AROUND, _passthrough
    )
    before = check_hook(hook)
    assert before.ok and before.found == "eager_on_graph break (query, output, layer_id)"
    HookRegistry.register(hook.target, _passthrough, HookType.AROUND)
    monkeypatch.setattr(HookRegistry, "_patched", set(HookRegistry._patched))
    HookRegistry.apply_hooks()
    assert module._break is not original and module._break.__wrapped__ is original
    after = check_hook(hook)
    assert after.ok and after.found == before.found
    # a plain function is still a function, not a break
    plain = check_hook(
        Hook(f"{__name__}._break_body", EAGER_BREAK, "query", HookType.AROUND, _passthrough)
    )
    assert not plain.ok and plain.found.startswith("function")


def _patch(pid, flag_name, hooks):
    flag = FLAGS[flag_name]
    return Patch(
        id=pid,
        summary="test",
        flags=(flag,),
        hooks=tuple(hooks),
        is_enabled=lambda: flag.get() not in (False, flag.off_value),
    )


def test_install_records_the_patches_it_evaluated_and_nothing_when_it_refuses(
    test_flags, clean_hook_registry, monkeypatch
):
    """A hook asks `evaluated_patches` what the plugin's patches declare (the graph-config hook
    reads their capture effects): every patch an install checked, enabled or not, latest by
    id; a refused install records none."""
    from sglang_mixgraph import registry

    monkeypatch.setattr(registry, "_evaluated", {})
    monkeypatch.setenv("SGLANG_MIXGRAPH_TEST_BOOL", "0")
    hook = Hook(f"{__name__}._victim", "function", "a, b, *, c", HookType.AROUND, _passthrough)
    off = _patch("off", "SGLANG_MIXGRAPH_TEST_BOOL", [hook])
    install([off])
    assert registry.evaluated_patches() == (off,)
    monkeypatch.setenv("SGLANG_MIXGRAPH_TEST_BOOL", "1")
    broken = _patch(
        "off",
        "SGLANG_MIXGRAPH_TEST_BOOL",
        [Hook(f"{__name__}._victim", "function", "z", HookType.AROUND, _passthrough)],
    )
    with pytest.raises(PatchCheckError):
        install([broken])
    assert registry.evaluated_patches() == (off,)


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


# A module that exists but whose body raises, as one that loads a kernel library (ctypes.CDLL)
# raises OSError when the library is not there.
BROKEN = "mixgraph_test_broken_kernel"
BROKEN_ERROR = "libbroken_kernel.so: cannot open shared object file"


@pytest.fixture
def broken_kernel_module(tmp_path, monkeypatch):
    (tmp_path / f"{BROKEN}.py").write_text(
        f"raise OSError({BROKEN_ERROR!r})\n\ndef attention(a, b, *, c=1):\n    return a\n"
    )
    (tmp_path / "mixgraph_test_needs_a_dependency.py").write_text(
        "import mixgraph_test_no_such_dependency\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return Hook(f"{BROKEN}.attention", "function", "a, b, *, c", HookType.AROUND, _passthrough)


def test_a_target_module_whose_import_raises_is_a_failed_check_naming_it(broken_kernel_module):
    """Used to: the OSError escaped the check, so SGLang's loader swallowed it (no patch at all)
    and doctor died with a traceback."""
    check = check_hook(broken_kernel_module)
    assert not check.ok and check.why == IMPORT_FAILED and check.unimportable == BROKEN
    assert check.found == f"importing {BROKEN} raised OSError: {BROKEN_ERROR}"
    attribute = check_attribute(f"{BROKEN}.attention", object)
    assert not attribute.ok and attribute.unimportable == BROKEN
    # a module that is there but misses a dependency is named as the one that does not import
    needs = check_attribute("mixgraph_test_needs_a_dependency.f", object)
    assert needs.found == (
        "importing mixgraph_test_needs_a_dependency raised ModuleNotFoundError: "
        "No module named 'mixgraph_test_no_such_dependency'"
    )
    # a module that is not there at all stays "missing"
    missing = check_attribute("mixgraph_test_no_such_module.f", object)
    assert missing.why == "attribute missing" and missing.unimportable is None


def test_an_unimportable_target_stops_an_explicit_patch_and_leaves_a_default_on_one_off(
    broken_kernel_module, test_flags, default_on_flag, clean_hook_registry, monkeypatch, caplog
):
    good_hook = Hook(f"{__name__}._victim", "function", "a, b, *, c", HookType.AROUND, _passthrough)
    good = _patch("good", "SGLANG_MIXGRAPH_TEST_CHOICE", [good_hook])
    monkeypatch.setenv("SGLANG_MIXGRAPH_TEST_CHOICE", "b")
    monkeypatch.delenv(default_on_flag.name, raising=False)
    kernel = _patch("kernel", default_on_flag.name, [broken_kernel_module])

    # on by default only: one warning naming the module and its error, off, the rest installs
    with caplog.at_level("WARNING", logger="sglang_mixgraph"):
        statuses = install([good, kernel])
    assert [s.state for s in statuses] == ["active", "off (upstream changed)"]
    warned = [r.getMessage() for r in caplog.records if "'kernel'" in r.getMessage()]
    assert len(warned) == 1
    assert f"importing {BROKEN} raised OSError: {BROKEN_ERROR}" in warned[0]
    assert f"Make {BROKEN} import (the error above) to use it" in warned[0]
    assert broken_kernel_module.target not in HookRegistry._hooks
    assert good_hook.target in HookRegistry._hooks

    # switched on: startup stops naming the module and the error, and nothing is registered
    HookRegistry._hooks.pop(good_hook.target)
    monkeypatch.setenv(default_on_flag.name, "on")
    with pytest.raises(PatchCheckError) as err:
        install([good, kernel])
    assert f"importing {BROKEN} raised OSError: {BROKEN_ERROR}" in str(err.value)
    assert f"Make {BROKEN} import (the error above), or switch the patch off" in str(err.value)
    assert "install sglang==" not in str(err.value).lower()  # the pinned sglang is installed
    assert good_hook.target not in HookRegistry._hooks


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


def test_a_deferral_says_what_becomes_of_each_switch_the_user_set(test_flags, monkeypatch):
    """Used to say "SGLang's own <deferred flags> gets that value instead" of whichever switch
    was set: false for a switch SGLang does not define (nothing reads it) and for several
    deferred flags (only the field of the variable's own name reads it)."""
    from sglang_mixgraph.registry import evaluate

    upstream_name = (
        "SGLANG_OPT_FLASHMLA_SPARSE_PREFILL"  # an upstream flag, standing in for a clash
    )
    deferred = bool_flag(upstream_name, False, "clash")
    ours = FLAGS["SGLANG_MIXGRAPH_TEST_BOOL"]
    try:
        patch = Patch("two_switches", "test", (ours, deferred), (), lambda: False, switch_count=2)
        monkeypatch.setenv(ours.name, "1")
        monkeypatch.delenv(upstream_name, raising=False)
        line = evaluate(patch).deferred
        assert (
            f"You set {ours.name}='1' to turn this plugin's patch on: SGLang defines no flag of "
            "that name and this plugin's patch stays off, so nothing acts on the value."
        ) in line
        assert "gets that value" not in line and f"envs.{upstream_name}" not in line

        monkeypatch.delenv(ours.name)
        monkeypatch.setenv(upstream_name, "true")
        line = evaluate(patch).deferred
        assert (
            f"You set {upstream_name}='true' to turn this plugin's patch on: SGLang's own field "
            f"of that name (envs.{upstream_name}) reads the value, and this plugin's patch stays "
            "off."
        ) in line
        assert ours.name not in line.split("You set", 1)[1]
    finally:
        FLAGS.pop(upstream_name)


def _catalogued(upstream_pr):
    return Patch(
        id="example",
        summary="an example",
        flags=(),
        hooks=(),
        is_enabled=lambda: False,
        upstream_pr=upstream_pr,
    )


def test_upstream_pr_is_named_by_number():
    assert _catalogued("SGLang PR #30338 splits mixed steps").upstream_pr_number == 30338
    assert _catalogued(None).upstream_pr_number is None
    with pytest.raises(ValueError, match="'example': upstream_pr must name the PR by number"):
        _catalogued("the upstream PR that splits mixed steps")


def test_every_patch_mirroring_an_upstream_pr_names_its_number():
    numbers = {p.id: p.upstream_pr_number for p in all_patches()}
    # the mixed split mirrors SGLang's split of DeepSeek-V4 mixed steps
    assert numbers["mixed_split"] == 30338
