"""tools/reading-path/split_reading_path.py: the files a reader of the mixed split opens (the
patch package and the package modules it imports, transitively, without the runtime foundation)
stay within 3,000 lines over 12 files, and the count follows every import it should."""

from __future__ import annotations

from tool_scripts import load

R = load("split_reading_path", "reading-path")

MAX_LINES = 3000
MAX_FILES = 12


def test_the_split_reads_in_at_most_3k_lines_over_12_files():
    path = R.reading_path()
    assert len(path) <= MAX_FILES, sorted(path)
    assert sum(path.values()) <= MAX_LINES, path


def test_the_path_is_the_patch_and_the_core_it_imports_and_no_other_patch():
    path = R.reading_path()
    patch = {p for p in path if p.startswith("patches/mixed_split/")}
    assert {"patches/mixed_split/__init__.py", "patches/mixed_split/plan.py"} <= patch
    assert set(path) - patch == {p for p in path if p.startswith("core/")}
    # the decode tail and the cost model are read; the capture estimate no longer is
    assert {"core/decode_tail.py", "core/split_cost_model.py"} <= set(path)
    assert "core/capture_memory.py" not in path
    with_foundation = R.reading_path(with_foundation=True)
    assert {"flags.py", "registry.py"} <= set(with_foundation) - set(path)


def _append_function_import(monkeypatch, module_path, statement: str) -> None:
    """Make the tool read `module_path` with a function that runs `statement` appended."""
    mutated = module_path.read_text() + f"\n\ndef _mutant():\n    {statement}\n"
    real_read = type(module_path).read_text

    def read_text(self, *args, **kwargs):
        return mutated if self == module_path else real_read(self, *args, **kwargs)

    monkeypatch.setattr(type(module_path), "read_text", read_text)


def test_the_count_follows_function_local_imports(monkeypatch):
    """A patch module importing another patch inside a function puts that patch on the path."""
    plan = R.PACKAGE / "patches" / "mixed_split" / "plan.py"
    _append_function_import(
        monkeypatch, plan, "from sglang_mixgraph.patches import replay_read_done"
    )
    assert "patches/replay_read_done.py" in R.reading_path()


def test_an_import_for_type_checking_only_is_off_the_path(monkeypatch):
    """The view the fallbacks are annotated with is imported for type checking only: off the
    run-time path; imported inside a function, it is on it."""
    assert "planner/split_view.py" not in R.reading_path()
    state = R.PACKAGE / "patches" / "mixed_split" / "state.py"
    assert "from sglang_mixgraph.planner.split_view import SplitView" in state.read_text()
    _append_function_import(monkeypatch, state, "from sglang_mixgraph.planner import split_view")
    assert "planner/split_view.py" in R.reading_path()
