"""The reference pages stay true: they describe how things work and link the run records in
`docs/results/`, which must exist; none says a result is still to come ("not yet run"); every
patch has its reference page and its CPU test named after its module; the guide to adding a
patch points at files that exist. Static reads of the tree, no SGLang process."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"


def reference_pages() -> list[Path]:
    """Every page that documents how things work: docs/*.md, the README, the tools' READMEs."""
    return (
        sorted(ROOT.glob("docs/*.md"))
        + [ROOT / "README.md"]
        + sorted(ROOT.glob("tools/*/README.md"))
    )


def _text(path: Path) -> str:
    # One space for every run of whitespace, so a phrase broken over lines still matches.
    return " ".join(path.read_text().split())


# A result announced but not there: "not yet run", "not run yet", "has not run on the GPU yet",
# "not yet been run", "yet to be run". A "yet" must be near: "the break does not run" is a fact.
_PENDING = re.compile(
    r"\bnot\s+yet\s+(?:been\s+)?run\b"
    r"|\bnot\s+(?:been\s+)?run\b(?:\W+\w+){0,6}?\W+yet\b"
    r"|\byet\s+to\s+(?:be\s+)?run\b",
    re.IGNORECASE,
)
# A run record cited by its path under docs/results/ (from a page anywhere, or `results/...`
# relative to a page in docs/).
_RECORD = re.compile(r"(?<![\w/.-])(docs/results/[\w./-]*[\w/]|results/[\w./-]*[\w/])")


def pending_phrases(text: str) -> list[str]:
    return [m.group(0) for m in _PENDING.finditer(" ".join(text.split()))]


def missing_records(page: Path) -> list[str]:
    missing = []
    for cited in sorted(set(_RECORD.findall(page.read_text()))):
        if cited.startswith("results/") and page.parent != ROOT / "docs":
            continue  # a command's output folder (`--out results/`), not a record
        target = ROOT / cited if cited.startswith("docs/") else page.parent / cited
        if not target.exists():
            missing.append(cited)
    return missing


@pytest.mark.parametrize(
    "text, found",
    [
        ("Not yet run on the H200.", True),
        ("the workload has not run on the GPU\n yet (the earlier runs", True),
        ("Not run yet: no machine was lent", True),
        ("it has not yet been run", True),
        ("a sweep yet to be run", True),
        ("the patch does not run the break; upstream runs it", False),
        ("cells not measured yet are listed", False),
    ],
)
def test_pending_phrases_are_recognised(text, found):
    assert bool(pending_phrases(text)) is found


def test_no_reference_page_announces_a_result_that_is_not_there():
    """A result is linked from docs/results/ once it exists; until then the page says what
    the test or command does, not that it is still to run."""
    found = [
        f"{p.relative_to(ROOT)}: {phrase!r}"
        for p in reference_pages()
        for phrase in pending_phrases(p.read_text())
    ]
    assert found == []


def test_every_run_record_a_reference_page_cites_exists(tmp_path):
    found = [f"{p.relative_to(ROOT)}: {r}" for p in reference_pages() for r in missing_records(p)]
    assert found == []
    # the check sees a missing record (and a compressed one under its new name)
    page = tmp_path / "page.md"
    page.write_text(
        "see docs/results/no_such_run_h200.log and docs/results/empty_segments_h200.md."
    )
    assert missing_records(page) == ["docs/results/no_such_run_h200.log"]


RAW = (".log", ".jsonl", ".json", ".txt", ".csv")


def test_large_raw_records_are_compressed():
    """A raw log or dump over 128 KiB is kept as FILE.xz (the tree travels to GPU machines)."""
    large = [
        str(p.relative_to(ROOT))
        for p in RESULTS.rglob("*")
        if p.suffix in RAW and p.stat().st_size > 128 * 1024 and "ab_example" not in p.parts
    ]
    assert large == []


# ------------------------------------------------------------------------- patches


def patch_modules() -> dict[str, object]:
    """Every module (or package) under sglang_mixgraph.patches that declares a PATCH."""
    import sglang_mixgraph.patches as patches

    found = {}
    for info in pkgutil.iter_modules(patches.__path__):
        module = importlib.import_module(f"{patches.__name__}.{info.name}")
        if hasattr(module, "PATCH"):
            found[info.name] = module
    return found


def test_every_patch_module_is_a_patch_of_the_plugin():
    from sglang_mixgraph.patches import all_patches

    declared = {m.PATCH.id for m in patch_modules().values()}
    assert declared == {p.id for p in all_patches()}
    assert len(all_patches()) == len(declared)


def test_every_patch_has_its_reference_page_and_its_tests():
    """The page exists under docs/, names the patch and each of its flags, and names the patch's
    CPU tests: test/patches/test_<module>.py, or the folder test/patches/<module>/ for a patch
    that is a package; those exist and hold tests."""
    problems = []
    for name, module in sorted(patch_modules().items()):
        patch = module.PATCH
        page = ROOT / patch.docs_page if patch.docs_page else None
        if page is None or page.parent != ROOT / "docs" or not page.is_file():
            problems.append(f"{name}: no reference page in docs/ ({patch.docs_page!r})")
            continue
        text = page.read_text()
        for needed in (patch.id, *(f.name for f in patch.flags)):
            if needed not in text:
                problems.append(f"{name}: {patch.docs_page} does not name {needed}")
        is_package = Path(module.__file__).name == "__init__.py"
        tests = f"test/patches/{name}/" if is_package else f"test/patches/test_{name}.py"
        files = sorted((ROOT / tests).glob("test_*.py")) if is_package else [ROOT / tests]
        if not files or not all(f.is_file() and "def test_" in f.read_text() for f in files):
            problems.append(f"{name}: no tests at {tests}")
        if tests not in text:
            problems.append(f"{name}: {patch.docs_page} does not name its tests {tests}")
    assert problems == []


# ------------------------------------------------------------------------- the guide

GUIDE = ROOT / "docs" / "adding-a-patch.md"


def test_the_guide_points_at_files_that_exist():
    text = GUIDE.read_text()
    # a placeholder such as test/patches/test_<name>.py is no path
    cited = set(
        re.findall(r"(?<![\w/.-])((?:python|test|docs|tools)/[\w./-]*\w)(?![\w./<-])", text)
    )
    # the template's module, docs page and tests, named in the guide
    assert {
        "python/sglang_mixgraph/patches/drop_empty_segments.py",
        "docs/empty-segments.md",
        "test/patches/test_drop_empty_segments.py",
        "test/gpu_upstream/test_empty_segments.py",
    } <= cited
    assert [c for c in sorted(cited) if not (ROOT / c).exists()] == []
    assert "docs/adding-a-patch.md" in (ROOT / "README.md").read_text()
