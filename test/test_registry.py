"""registry.Patch's catalogue entry: the upstream PR named by number where there is one."""

from __future__ import annotations

import pytest

from sglang_mixgraph.patches import all_patches
from sglang_mixgraph.registry import Patch


def _patch(upstream_pr):
    return Patch(
        id="example",
        summary="an example",
        flags=(),
        hooks=(),
        is_enabled=lambda: False,
        upstream_pr=upstream_pr,
    )


def test_upstream_pr_is_named_by_number():
    assert _patch("SGLang PR #30338 splits mixed steps").upstream_pr_number == 30338
    assert _patch(None).upstream_pr_number is None
    with pytest.raises(ValueError, match="'example': upstream_pr must name the PR by number"):
        _patch("the upstream PR that splits mixed steps")


def test_every_patch_mirroring_an_upstream_pr_names_its_number():
    numbers = {p.id: p.upstream_pr_number for p in all_patches()}
    # the mixed split mirrors SGLang's split of DeepSeek-V4 mixed steps
    assert numbers["mixed_split"] == 30338
