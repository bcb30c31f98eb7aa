"""README tells the truth: every flag is documented, CI runs the README's own commands."""

from __future__ import annotations

import re
from pathlib import Path

from sglang_mixgraph import counters  # noqa: F401  (registers its flag)
from sglang_mixgraph.flags import FLAGS
from sglang_mixgraph.patches import all_patches

all_patches()  # every patch module registers its flags when imported

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CI = (ROOT / ".ci" / "run").read_text()


def _flag_rows() -> dict[str, str]:
    rows = {}
    for line in README.splitlines():
        match = re.match(r"\|\s*`(SGLANG_[A-Z0-9_]+)`\s*\|(.*)", line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


def test_every_flag_has_a_readme_row_and_every_row_a_flag():
    assert set(_flag_rows()) == set(FLAGS)


def test_readme_rows_show_each_flags_default_and_values():
    rows = _flag_rows()
    for name, flag in FLAGS.items():
        row = rows[name]
        shown_default = (
            ("1" if flag.default else "0") if isinstance(flag.default, bool) else flag.default
        )
        assert f"({shown_default})" in row, (name, row)
        if not isinstance(flag.default, bool):
            assert all(f"`{v}`" in row for v in flag.accepted), (name, row)


def test_every_flag_belongs_to_a_patch_or_the_counters():
    patch_flags = {f.name for p in all_patches() for f in p.flags}
    assert patch_flags | {counters.INTERVAL_FLAG.name} == set(FLAGS)


def _fenced_commands(text: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    lines = [line.split("  # ")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line]  # each command without its trailing comment


def test_ci_runs_the_readme_install_and_test_commands():
    commands = _fenced_commands(README)
    install = "pip install -q -e '.[test]'"
    test = "python -m pytest test -q -n auto --dist worksteal"
    assert install in " ".join(commands) and install in CI
    assert test in commands and test in CI
    for lint in ("ruff check .", "ruff format --check ."):
        assert lint in " ".join(commands) and lint in CI
