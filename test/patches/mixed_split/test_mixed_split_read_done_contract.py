"""The split and replay read-done share a contract, not an import: the split reads the read-done
switch by the name `upstream_attrs.ENVS_REPLAY_READ_DONE` in `flags.FLAGS` (whether read-done
may be published for a replay before its first layer), and no patch module imports another."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sglang_mixgraph.flags import FLAGS
from sglang_mixgraph.patches import replay_read_done
from sglang_mixgraph.patches.mixed_split import plan
from sglang_mixgraph.upstream_attrs import ENVS_REPLAY_READ_DONE

PATCHES = Path(replay_read_done.__file__).parent


def test_the_name_the_split_reads_is_read_dones_own_switch():
    assert FLAGS[ENVS_REPLAY_READ_DONE] is replay_read_done.FLAG


@pytest.mark.parametrize("value, replay_may_publish", [("1", True), ("0", False)])
def test_a_replay_may_publish_exactly_when_read_done_is_on(monkeypatch, value, replay_may_publish):
    monkeypatch.setenv(ENVS_REPLAY_READ_DONE, value)
    assert plan._read_done_may_publish(replay=True) is replay_may_publish
    assert plan._read_done_may_publish(replay=False) is True  # eager: upstream's own snapshot


def _patch_of(path: Path) -> str:
    return path.relative_to(PATCHES).parts[0].removesuffix(".py")


def test_no_patch_module_imports_another_patch():
    """`patches/__init__.py` lists every patch (`all_patches`); any other module of a patch
    imports only its own package."""
    crossing = []
    for path in sorted(PATCHES.rglob("*.py")):
        if path.parent == PATCHES and path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if name.startswith("sglang_mixgraph.patches."):
                    target = name.removeprefix("sglang_mixgraph.patches.").split(".")[0]
                    if target != _patch_of(path):
                        crossing.append(f"{path.relative_to(PATCHES)} imports {name}")
    assert crossing == []
