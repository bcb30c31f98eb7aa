"""Our flags: strict parsing through SGLang's envs, a bad value naming the variable and the
accepted values, and a name upstream already defines left to upstream."""

from __future__ import annotations

import os

import pytest

from sglang_mixgraph.flags import FLAGS, FlagValueError, bool_flag, choice_flag


@pytest.fixture
def test_flags():
    bool_flag("SGLANG_MIXGRAPH_TEST_BOOL", False, "test-only")
    choice_flag("SGLANG_MIXGRAPH_TEST_CHOICE", "a", ("a", "b"), "test-only", off_value="a")
    yield
    for name in ("SGLANG_MIXGRAPH_TEST_BOOL", "SGLANG_MIXGRAPH_TEST_CHOICE"):
        FLAGS.pop(name)


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
