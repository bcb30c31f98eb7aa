"""tools/rank-slice/device_ab.sh against the CPU stand-in server: a run split over two "device
calls" on two "machines" resumes from the packed run directory, one block per machine, each
machine first serving the configuration's discarded warm visit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from ab_kit import small_sweep, standin_config

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "rank-slice" / "device_ab.sh"
ARMS = """[[arm]]
name = "base"

[[arm]]
name = "cand"
"""


def _call(tmp: Path, config: Path, resume: Path, *ab_args: str, seconds: int = 300):
    out = tmp / "out"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(tmp / "runs", ignore_errors=True)  # a fresh machine: nothing but what travels
    env = dict(
        os.environ,
        OUT=str(out),
        TMPDIR=str(tmp / "runs"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=f"{ROOT / 'python'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    )
    (tmp / "runs").mkdir()
    p = subprocess.run(
        ["bash", str(SCRIPT), str(config), str(resume), str(seconds), *ab_args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return p, out / f"{resume.stem}.tgz"


def _cells(packed: Path, tmp: Path) -> list[tuple[str, str]]:
    dest = tmp / "unpacked"
    shutil.rmtree(dest, ignore_errors=True)
    with tarfile.open(packed) as tar:
        tar.extractall(dest, filter="data")
    results = json.loads(next(dest.glob("*/results.json")).read_text())
    return sorted((c["arm"], c["status"]) for c in results["cells"])


# Slow tier (about 75 s): device_ab.sh end to end over two stand-in machines; ab's blocks over
# machines run in the fast tier in test_ab_blocks.py.
@pytest.mark.slow
def test_a_run_split_over_two_machines_resumes_one_block_each_after_a_warm_visit(tmp_path):
    sweep = small_sweep("[2]").replace("repeats = 1", 'block = ["base", "cand"]\nblocks = 2')
    config = standin_config(tmp_path, arms=ARMS, sweep=sweep + '\nwarm_visit = "cand"')
    resume = tmp_path / "carried" / "slice.tgz"

    # Call 1 on machine m1: its warm visit, then block 1; block 2 is left (INCOMPLETE, exit 1).
    first, packed = _call(tmp_path, config, resume, "--machine", "m1", "--max-blocks", "1")
    assert "device_ab: ab exited 1" in first.stdout, first.stderr + first.stdout
    assert "machine m1 has served nothing of this run: one warm visit of 'cand'" in first.stderr
    assert _cells(packed, tmp_path) == [("base", "missing"), ("base", "ok"), ("cand", "missing"), ("cand", "ok")]  # fmt: skip

    # Call 2 on machine m2 with the packed run carried back: block 1 kept, m2's warm visit,
    # block 2 measured there.
    resume.parent.mkdir()
    shutil.copy(packed, resume)
    second, packed2 = _call(tmp_path, config, resume, "--machine", "m2", "--max-blocks", "1")
    assert "device_ab: ab exited 0" in second.stdout, second.stderr + second.stdout
    assert "restored 2 cell files" in second.stdout
    assert "2 finished cells are kept" in second.stderr
    assert "machine m2 has served nothing of this run" in second.stderr
    assert _cells(packed2, tmp_path) == [("base", "ok")] * 2 + [("cand", "ok")] * 2


def test_usage_line_and_exit_2_without_arguments():
    p = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert p.returncode == 2 and "usage: device_ab.sh CONFIG RUN.tgz SECONDS" in p.stderr


@pytest.mark.parametrize("fp8", [True, False])
def test_a_missing_slice_model_is_built_at_the_configurations_precision(tmp_path, fp8):
    """A configuration that runs the kit's FP8 GEMM stand-in gets an FP8 slice model, any
    other a bf16 one (the run itself is not the point here: its server cannot start)."""
    model = tmp_path / "model"
    env = '[server.env]\nMIXGRAPH_KIT_FP8_GEMM = "torch"\n' if fp8 else ""
    config = tmp_path / "ab.toml"
    config.write_text(f'[server]\nmodel_path = "{model}"\n{env}')
    _call(tmp_path, config, tmp_path / "carried" / "slice.tgz", seconds=5)
    built = json.loads((model / "config.json").read_text())
    assert ("quantization_config" in built) is fp8
