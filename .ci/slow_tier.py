"""Which slow test files a change needs: path rules, as vLLM's `source_file_dependencies`.

The README's test command runs the fast tier (`test/conftest.py` skips the tests marked `slow`).
`.ci/run` then asks this script which slow files to run: those whose own file or one of whose
source paths changed since the commit named in `.ci/slow-tier-base`, the last commit on which
the whole suite (`python -m pytest test -q --slow`) passed. A change to a path every test depends
on (the plugin layer, the patches, the test setup, the packaging) selects every slow file, and so
does a base the clone does not hold (a shallow clone, an unknown commit): nothing is skipped
without a reason, and each selected file is printed with the path that selected it.

    python3 .ci/slow_tier.py            # the slow files to run, one per line (reasons on stderr)
    python3 .ci/slow_tier.py --all      # every slow file
"""

from __future__ import annotations

import fnmatch
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE_FILE = ".ci/slow-tier-base"  # the last commit on which the whole suite passed
PKG = "python/sglang_mixgraph/"

# Paths every test depends on: a change here runs the whole slow tier.
EVERYTHING = (
    PKG + "__init__.py",
    PKG + "plugin.py",
    PKG + "registry.py",
    PKG + "flags.py",
    PKG + "upstream_attrs.py",
    PKG + "patches/*",
    "test/*conftest.py",  # the root's and every folder's fixtures
    "pyproject.toml",
    ".ci/*",
)

# What `plan` and the resolution hook run through: the planner, SGLang's resolution, the presets.
PLANNER = (
    PKG + "cli/*",
    PKG + "resolution/*",
    PKG + "planner/*",
    PKG + "bcg_rules.py",
    PKG + "target_gpu.py",
    PKG + "counters.py",
    PKG + "core/*",
    PKG + "data/*",
    PKG + "kits/model_configs.py",
    PKG + "kits/fake_nvidia_smi.py",
)
AB = (PKG + "ab/*", PKG + "cli/ab.py", PKG + "resolution/*", "test/ab/*")

# Each file holding slow tests and the source paths it covers (besides EVERYTHING and itself).
SLOW_FILES: dict[str, tuple[str, ...]] = {
    "test/test_plugin.py": PLANNER,
    "test/cli/test_cli.py": PLANNER,
    "test/resolution/test_plan_inputs.py": PLANNER,
    "test/patches/test_graph_config.py": PLANNER,
    "test/patches/mixed_split/test_mixed_split.py": (
        PKG + "core/*",
        PKG + "kits/*",
        PKG + "reference/*",
        "test/patches/mixed_split/*",
    ),
    "test/ab/test_ab_standin.py": AB,
    "test/ab/test_ab_demo.py": (*AB, PKG + "cli/demo.py"),
    "test/ab/test_rank_slice_device_ab.py": (*AB, "tools/rank-slice/*"),
    "test/advise/test_advise_hostile.py": (
        PKG + "advise/*",
        PKG + "cli/advise.py",
        PKG + "cli/__init__.py",
        PKG + "resolution/serving_client.py",
        "test/advise/*",
    ),
    "test/tools/test_rank_slice_model.py": (*PLANNER, "tools/rank-slice/*"),
}


def _matches(path: str, patterns: tuple[str, ...]) -> str | None:
    return next((p for p in patterns if fnmatch.fnmatchcase(path, p)), None)


def select(changed: list[str] | None) -> dict[str, str]:
    """The slow files to run, each with the reason; `changed` None means the base is unknown."""
    if changed is None:
        return {f: "the last full-suite commit is not in this clone" for f in SLOW_FILES}
    chosen: dict[str, str] = {}
    for path in changed:
        if _matches(path, EVERYTHING):
            return {f: f"{path} changed (every test depends on it)" for f in SLOW_FILES}
        for test_file, covers in SLOW_FILES.items():
            if test_file not in chosen and (path == test_file or _matches(path, covers)):
                chosen[test_file] = f"{path} changed"
    return chosen


def changed_since_base(root: Path = ROOT) -> list[str] | None:
    """Paths changed between the recorded full-suite commit and the work tree, or None."""
    base_file = root / BASE_FILE
    words = base_file.read_text().split() if base_file.exists() else []
    if not words:
        return None
    run = subprocess.run(
        ["git", "diff", "--name-only", words[0], "--", "."],
        cwd=root,
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        return None
    return [p for p in run.stdout.splitlines() if p and p != BASE_FILE]


def main(argv: list[str]) -> int:
    if argv == ["--all"]:
        chosen = dict.fromkeys(SLOW_FILES, "--all")
    elif argv:
        print(f"usage: {sys.argv[0]} [--all]", file=sys.stderr)
        return 2
    else:
        chosen = select(changed_since_base())
    for test_file, reason in chosen.items():
        print(f"slow tier: {test_file} ({reason})", file=sys.stderr)
        print(test_file)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
