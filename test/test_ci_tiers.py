"""The two CI tiers: `.ci/slow_tier.py`'s path rules and the fast tier's lighter property tests."""

import importlib.util
import re
import subprocess
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str, path: Path):
    """By path: `.ci` is no package, and `conftest` names several modules under pytest."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


slow_tier = _load("slow_tier", ROOT / ".ci" / "slow_tier.py")
conftest = _load("root_conftest", ROOT / "test" / "conftest.py")

SLOW_MARK = re.compile(r"pytest\.mark\.slow\b")


def test_every_file_with_slow_tests_has_its_path_rule():
    marked = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "test").rglob("test_*.py")
        if SLOW_MARK.search(p.read_text())
    }
    assert marked == set(slow_tier.SLOW_FILES)


def test_a_covered_path_selects_only_its_slow_files():
    chosen = slow_tier.select(["python/sglang_mixgraph/ab/report.py", "docs/ab.md"])
    assert set(chosen) == {
        "test/ab/test_ab_standin.py",
        "test/ab/test_ab_demo.py",
        "test/ab/test_rank_slice_device_ab.py",
    }
    assert "test/ab/test_ab_demo.py" in slow_tier.select(["python/sglang_mixgraph/cli/demo.py"])
    assert "python/sglang_mixgraph/ab/report.py" in chosen["test/ab/test_ab_standin.py"]
    assert slow_tier.select(["docs/ab.md", "README.md"]) == {}
    own = "test/patches/mixed_split/test_mixed_split.py"
    assert set(slow_tier.select([own])) == {own}


def test_a_path_everything_depends_on_selects_every_slow_file():
    for path in ("python/sglang_mixgraph/registry.py", "test/cli/conftest.py", "pyproject.toml"):
        assert set(slow_tier.select(["docs/x.md", path])) == set(slow_tier.SLOW_FILES)


def test_an_unknown_base_selects_every_slow_file(tmp_path):
    assert set(slow_tier.select(None)) == set(slow_tier.SLOW_FILES)
    assert slow_tier.changed_since_base(tmp_path) is None  # no record
    (tmp_path / ".ci").mkdir()
    (tmp_path / ".ci" / "slow-tier-base").write_text("0123abcd\n")
    assert slow_tier.changed_since_base(tmp_path) is None  # not a repository holding it


def test_changes_are_read_from_the_recorded_commit_to_the_work_tree(tmp_path):
    def git(*args):
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=tmp_path,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    git("init", "-q")
    (tmp_path / "a.py").write_text("a\n")
    git("add", ".")
    git("commit", "-qm", "base")
    (tmp_path / ".ci").mkdir()
    (tmp_path / ".ci" / "slow-tier-base").write_text(git("rev-parse", "HEAD") + "\n")
    assert slow_tier.changed_since_base(tmp_path) == []  # the record itself does not count
    (tmp_path / "a.py").write_text("b\n")
    assert slow_tier.changed_since_base(tmp_path) == ["a.py"]


def test_the_fast_tier_runs_a_quarter_of_a_property_tests_examples():
    calls = []

    @settings(max_examples=12, deadline=None, database=None)
    @given(st.integers())
    def prop(x):
        calls.append(x)

    seen: set[int] = set()
    conftest._lighten_property_test(prop, seen)
    conftest._lighten_property_test(prop, seen)  # a second parametrized case: not halved again
    prop()
    assert len(calls) == 12 // conftest.FAST_TIER_DEPTH
