"""tools/patches-page/make_patches_page.py: docs/patches.md is what the script writes from the
patches' declarations now; the page shows every field it promises, the commands that read a
patch follow the patch's fields, and the page stands on its own (every link resolves)."""

from __future__ import annotations

import dataclasses
import re

from tool_scripts import load

from sglang_mixgraph.patches import all_patches
from sglang_mixgraph.registry import DoctorLine

M = load("make_patches_page", "patches-page")


def test_docs_patches_md_is_current():
    current = M.current_page()
    assert M.PAGE.read_text() == current, (
        f"docs/patches.md is not what the patches declare: regenerate it with `{M.COMMAND}`"
    )


def _section(page: str, patch_id: str) -> str:
    return page.split(f"\n## `{patch_id}`\n", 1)[1].split("\n## ", 1)[0]


def test_each_patch_has_its_switches_catalogue_and_page():
    page = M.current_page()
    for patch in all_patches():
        section = _section(page, patch.id)
        for text in (patch.why, patch.how, patch.retired_by):
            assert " ".join(text.split()).rstrip(".")[1:] in section, (patch.id, text)
        for flag in patch.flags:
            line = next(x for x in section.splitlines() if x.startswith(f"- `{flag.name}` "))
            assert flag.doc in line and f"default `{M._default(flag)}`" in line
            assert ("(switch, off at" in line) is (flag in patch.switches), line
        assert f"]({patch.docs_page.removeprefix('docs/')})" in section
        if patch.upstream_pr_number is not None:
            assert f"{M.PULL_URL}{patch.upstream_pr_number})" in section
        else:
            assert "mirrors no upstream PR" in section
        assert f"[`{patch.id}`](#{patch.id})" in page  # the summary row


def _readers(patch, titles=()) -> str:
    return "\n".join(M.readers(patch, titles))


def test_the_commands_that_read_a_patch_follow_its_fields():
    hooks = ("explain", "explain_if_on", "capture_effects", "calibration", "doctor_caveat")
    base = dataclasses.replace(all_patches()[0], **dict.fromkeys(hooks), doctor_line=None)
    plain = _readers(base)
    assert "`doctor`" in plain and "`ab`" in plain
    assert "what it does there" not in plain and "capture-memory estimate" not in plain
    assert "would do there" not in plain and "`doctor --verbose`:" not in plain
    assert "warning" not in plain and "it depends on" not in plain
    if_on = _readers(dataclasses.replace(base, explain_if_on=lambda graph: {}))
    assert "what each switch would do there" in if_on and "what it does there" not in if_on
    calibrated = _readers(dataclasses.replace(base, calibration=dict))
    assert "cost model's coefficients" in calibrated
    assert "speculative decoding" in _readers(dataclasses.replace(base, doctor_caveat=str))
    line = DoctorLine("k", "Break inputs of X", str)
    assert 'the installed SGLang it depends on ("Break inputs of X: ...")' in _readers(
        dataclasses.replace(base, doctor_line=line)
    )
    explained = _readers(dataclasses.replace(base, explain=lambda graph: "acts"))
    assert "what it does there" in explained
    counted = _readers(dataclasses.replace(base, capture_effects=lambda: frozenset()))
    assert "capture-memory estimate" in counted
    assert "`advise`" not in plain
    assert "(one, two verdicts)" in _readers(base, ["one", "two"])
    hooks = len(base.hooks) + len(base.reads)
    assert f"the {hooks} upstream target" in plain


def test_advise_prices_patches_of_the_plugin_and_the_page_says_which():
    ids = {p.id for p in all_patches()}
    advised = M.advised()
    assert advised and set(advised) <= ids
    page = M.current_page()
    for patch_id, titles in advised.items():
        assert f"({', '.join(titles)} verdict" in _section(page, patch_id)
    for patch_id in ids - set(advised):
        assert "`advise`" not in _section(page, patch_id)


def test_an_upstream_pr_is_linked_by_its_number():
    base = all_patches()[0]
    patch = dataclasses.replace(base, upstream_pr="SGLang PR #123 does the same")
    section = M.patch_section(patch)
    assert f"[PR #123]({M.PULL_URL}123) does the same" in section
    assert "mirrors no upstream PR" in M.patch_section(dataclasses.replace(base, upstream_pr=None))


def test_the_page_stands_on_its_own():
    page = M.current_page()
    assert "../shared" not in page and "DESIGN" not in page
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page)
    local = [link for link in links if not link.startswith("https://")]
    assert local and [x for x in local if not (M.PAGE.parent / x).is_file()] == []


def test_the_readme_and_the_guide_link_the_page():
    assert "(docs/patches.md)" in (M.ROOT / "README.md").read_text()
    guide = (M.ROOT / "docs" / "adding-a-patch.md").read_text()
    assert "(patches.md)" in guide and M.COMMAND in guide
