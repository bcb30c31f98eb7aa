"""The commands read a patch through its `Patch` record: no front, shared module of the
commands or planner module tests a patch's id, and no front imports a single patch's module
(what plan and doctor say of one patch is a field of its record: explain_if_on, doctor_caveat,
calibration, doctor_line); the check sees each kind of special case added to a real module."""

from __future__ import annotations

import ast
from pathlib import Path

import sglang_mixgraph

PACKAGE = Path(sglang_mixgraph.__file__).parent
FRONTS = sorted((PACKAGE / "cli").glob("*.py"))
SHARED = sorted((PACKAGE / "resolution").glob("*.py")) + sorted((PACKAGE / "planner").glob("*.py"))


def special_cases(source: str, imports: bool = True) -> list[str]:
    """Comparisons with a patch id (`x.id`, `PATCH_ID`, a patch's id as a literal) and, with
    `imports`, imports of a single patch's module (the catalogue, `all_patches`, excepted)."""
    from sglang_mixgraph.patches import all_patches

    ids = {p.id for p in all_patches()}
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                named = getattr(side, "attr", None) or getattr(side, "id", None)
                literal = isinstance(side, ast.Constant) and side.value in ids
                if named in ("id", "PATCH_ID") or literal:
                    found.append(f"line {node.lineno}: compares a patch id")
        elif (
            imports
            and isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith("sglang_mixgraph.patches")
        ):
            names = [a.name for a in node.names]
            if node.module != "sglang_mixgraph.patches" or names != ["all_patches"]:
                found.append(f"line {node.lineno}: imports {node.module} {names}")
    return found


MUTATIONS = (
    'if patch.id == "graph_config":\n        pass',
    "if patch.id == graph_config.PATCH_ID:\n        pass",
    'if "mixed_split" != patch.id:\n        pass',
    "from sglang_mixgraph.patches.hold_break_inputs import exposure",
    "from sglang_mixgraph.patches import all_patches, graph_config",
)


def test_plan_and_doctor_read_patches_through_their_records():
    assert {p.name: special_cases(p.read_text()) for p in FRONTS} == {p.name: [] for p in FRONTS}
    found = {str(p.relative_to(PACKAGE)): special_cases(p.read_text(), False) for p in SHARED}
    assert found == {name: [] for name in found}
    doctor = PACKAGE / "cli" / "doctor.py"
    for line in MUTATIONS:
        mutated = doctor.read_text() + f"\n\ndef _mutant(patch):\n    {line}\n"
        assert special_cases(mutated), line
