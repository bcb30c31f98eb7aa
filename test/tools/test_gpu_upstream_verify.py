"""tools/gpu-upstream/verify.sh without a GPU: a stand-in python3 records what each check runs,
with its share of the time; bad arguments get the usage line and exit 2."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "gpu-upstream" / "verify.sh"


def _run(tmp: Path, *args: str, **extra_env: str) -> subprocess.CompletedProcess:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "python3"
    fake.write_text('#!/bin/sh\necho "ran: $*"\n')
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", OUT=str(tmp / "out"))
    env.pop("MIXGRAPH_KIT_KERNELS", None)
    env.update(extra_env)
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True
    )


def test_checks_share_the_seconds_and_log_one_file_each(tmp_path):
    p = _run(tmp_path, "500", "gpu_upstream", "e2e_pressure")
    assert p.returncode == 0, p.stderr
    out = tmp_path / "out"
    assert (out / "gpu_upstream.log").read_text() == (
        "ran: -m pytest test/gpu_upstream -q -p no:cacheprovider --durations=12\n"
    )
    assert (out / "e2e_pressure.log").read_text() == (
        "ran: test/gpu_e2e/run_e2e.py --workload pressure --budget-s 270 "
        "--out /tmp/e2e_pressure --label verify-pressure --kernels standin\n"
    )
    assert "verify: gpu_upstream exited 0 (limit 214s)" in p.stdout
    assert "verify: e2e_pressure exited 0 (limit 285s)" in p.stdout
    assert not (out / "e2e_short.log").exists()


def test_all_three_by_default(tmp_path):
    p = _run(tmp_path, "540")
    assert p.returncode == 0, p.stderr
    assert [line.split()[1] for line in p.stdout.splitlines() if line.startswith("verify:")] == [
        "gpu_upstream",
        "e2e_short",
        "e2e_pressure",
    ]
    assert "--workload short --budget-s 181 " in (tmp_path / "out" / "e2e_short.log").read_text()


def test_end_to_end_runs_take_the_kit_kernel_selection(tmp_path):
    p = _run(tmp_path, "100", "gpu_upstream", "e2e_short", MIXGRAPH_KIT_KERNELS="faithful")
    assert p.returncode == 0, p.stderr
    out = tmp_path / "out"
    assert (out / "e2e_short.log").read_text().endswith(" --kernels faithful\n")
    assert "--kernels" not in (out / "gpu_upstream.log").read_text()


def test_bad_arguments_exit_2_with_one_line(tmp_path):
    p = _run(tmp_path)
    assert p.returncode == 2 and p.stderr.startswith("usage: verify.sh SECONDS")
    p = _run(tmp_path, "60", "e2e_long")
    assert p.returncode == 2 and p.stderr == "verify.sh: unknown check 'e2e_long'\n"
