"""tools/rank-slice/device_ab.sh against the CPU stand-in server: a run split over two "device
calls" resumes from the packed run directory, and a machine whose Triton cache has not served
the configuration (empty, or warmed by another model) first serves one throwaway visit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from ab_kit import small_sweep, standin_config

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "rank-slice" / "device_ab.sh"
ARMS = """[[arm]]
name = "base"

[[arm]]
name = "cand"
"""


def _call(tmp: Path, config: Path, resume: Path, *, warmed: bool, seconds: int = 300, **env_extra):
    home, out = tmp / "home", tmp / "out"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(tmp / "runs", ignore_errors=True)  # a fresh machine: nothing but what travels
    shutil.rmtree(home, ignore_errors=True)
    cache = home / ".cache" / "sglang" / "triton"
    cache.mkdir(parents=True)
    (cache / "kernel.bin").write_text("x")  # another model's kernels: not enough to skip the visit
    if warmed:
        (cache / f"mixgraph_warmed_by_{config.stem}").touch()
    env = dict(
        os.environ,
        HOME=str(home),
        OUT=str(out),
        TMPDIR=str(tmp / "runs"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=f"{ROOT / 'python'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        **env_extra,
    )
    env.pop("SGLANG_CACHE_DIR", None)  # the marker sits in HOME's SGLang cache
    (tmp / "runs").mkdir()
    p = subprocess.run(
        ["bash", str(SCRIPT), str(config), str(resume), str(seconds)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return p, out / f"{resume.stem}.tgz", cache


def _cells(packed: Path, tmp: Path) -> list[tuple[str, str]]:
    dest = tmp / "unpacked"
    shutil.rmtree(dest, ignore_errors=True)
    with tarfile.open(packed) as tar:
        tar.extractall(dest, filter="data")
    results = json.loads(next(dest.glob("*/results.json")).read_text())
    return sorted((c["arm"], c["status"]) for c in results["cells"])


def test_a_run_split_over_two_calls_resumes_and_warms_a_cold_machine(tmp_path):
    config = standin_config(tmp_path, arms=ARMS, sweep=small_sweep("[2]"))
    resume = tmp_path / "carried" / "slice.tgz"

    # Call 1 on a cache that served this configuration: no throwaway visit, both cells packed.
    first, packed, _ = _call(tmp_path, config, resume, warmed=True)
    assert first.returncode == 0, first.stderr + first.stdout
    assert "throwaway" not in first.stdout
    assert _cells(packed, tmp_path) == [("base", "ok"), ("cand", "ok")]

    # Call 2 on a "fresh machine" with the packed run carried back: the finished cells are kept,
    # and a cache that never served this configuration gets one throwaway visit of WARM_ARM.
    resume.parent.mkdir()
    shutil.copy(packed, resume)
    second, packed2, cache = _call(tmp_path, config, resume, warmed=False, WARM_ARM="cand")
    assert second.returncode == 0, second.stderr + second.stdout
    assert "restored 2 cell files" in second.stdout
    assert (
        "one throwaway visit first" in second.stdout
        and "warm-up visit done (rc 0)" in second.stdout
    )
    assert "2 finished cells are kept" in second.stderr
    assert "arm=cand" in second.stderr.split("2 finished cells are kept")[0]  # the warm visit's arm
    assert (cache / f"mixgraph_warmed_by_{config.stem}").exists()  # the next call skips it
    assert _cells(packed2, tmp_path) == [("base", "ok"), ("cand", "ok")]


def test_usage_line_and_exit_2_without_arguments():
    p = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert p.returncode == 2 and "usage: device_ab.sh CONFIG RUN.tgz SECONDS" in p.stderr
