"""What software and hardware a cell was measured with, recorded in every cell's record.

`environment()` is this tool's side of the run: the installed SGLang, sglang-mixgraph and
torch versions (package metadata, nothing imported), the git commit of the sglang-mixgraph
checkout when it is installed from one (with `dirty` when it has uncommitted changes), a digest
of the package's own files, this machine's GPUs (names, count and driver, from NVML through
pynvml, else `nvidia-smi`; none when neither is here) and its host CPU (model and logical CPUs:
noted, never compared, since a host-bound arm's speed follows it from machine to machine). The
code that ran is keyed by the digest, not the commit: a copy without git (a checkout sent to a
GPU machine) or with uncommitted edits is still told apart, editing the plugin's code always
voids its cells and a docs-only commit voids nothing. A finished cell is reused on resume only
when its record holds the same versions (`same`): after an upgrade, a rebuilt kit or a new
commit, the cells are measured again unless `--reuse-cells` says otherwise. A GPU inventory
that could not be read (nvidia-smi failing) is unknown, not different: it never voids a cell.
Records written before versions existed have none and are measured again too. The server's
own SGLang version, which a launch prefix or an attached server can make differ from this
environment's, is what bench_serving recorded from `/server_info` (`server_version`).
`machine_id()` names the machine's run (host and boot), which a ratio's two cells must share.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

PACKAGES = (("sglang", "sglang"), ("sglang_mixgraph", "sglang-mixgraph"), ("torch", "torch"))
# The fields compared on resume; `code` is derived (`code_identity`).
COMPARED = ("sglang", "sglang_mixgraph", "torch", "code", "gpus")
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _gpus() -> dict[str, Any]:
    """This machine's GPUs: names and the driver from NVML (pynvml, which SGLang requires),
    else from `nvidia-smi`; `count` None with an `error` when neither could say (unknown)."""
    try:
        return _nvml_gpus()
    except _NoNvml:
        return _smi_gpus()


class _NoNvml(Exception):
    """pynvml or the NVML library is missing here: nvidia-smi is asked instead."""


def _nvml_gpus() -> dict[str, Any]:
    try:
        import pynvml
    except ImportError:
        raise _NoNvml from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        raise _NoNvml from None
    except pynvml.NVMLError as e:
        return {"count": None, "names": [], "error": f"NVML: {e}"}
    try:
        names = [
            _text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
            for i in range(pynvml.nvmlDeviceGetCount())
        ]
        return {
            "count": len(names),
            "names": names,
            "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
        }
    except pynvml.NVMLError as e:
        return {"count": None, "names": [], "error": f"NVML: {e}"}
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _text(value: str | bytes) -> str:
    # Older pynvml returns bytes; a name is never trusted to be UTF-8.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _smi_gpus() -> dict[str, Any]:
    if shutil.which("nvidia-smi") is None:
        return {"count": 0, "names": []}
    try:
        # Bytes, decoded leniently: a driver's stray non-UTF-8 byte is no reason to stop.
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {"count": None, "names": [], "error": "nvidia-smi did not answer"}
    if out.returncode != 0:
        return {"count": None, "names": [], "error": f"nvidia-smi exited {out.returncode}"}
    rows = [line.strip() for line in _text(out.stdout).splitlines() if line.strip()]
    names = [row.rpartition(",")[0].strip() or row for row in rows]
    drivers = sorted({row.rpartition(",")[2].strip() for row in rows if "," in row})
    gpus: dict[str, Any] = {"count": len(names), "names": names}
    if drivers:
        gpus["driver"] = ", ".join(drivers)
    return gpus


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
CPUINFO = Path("/proc/cpuinfo")


def _cpu() -> dict[str, Any]:
    """The host CPU: the first `model name` of /proc/cpuinfo (None where there is none) and
    the logical CPU count."""
    model = None
    try:
        for line in CPUINFO.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                model = " ".join(value.split())
                break
    except OSError:
        pass
    return {"model": model, "count": os.cpu_count()}


def machine_id() -> str:
    """`HOST-BOOT`: the host name and this boot's id, so a lent machine's every run is its own."""
    try:
        boot = BOOT_ID.read_text().strip().replace("-", "")[:8]
    except OSError:
        boot = "noboot"
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "host"
    return f"{host}-{boot}"


def source_digest(root: Path) -> str:
    """sha256 over the package's Python and data files (relative paths and contents)."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".json", ".toml")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def environment() -> dict[str, Any]:
    env: dict[str, Any] = {key: _version(dist) for key, dist in PACKAGES}
    commit = _git("rev-parse", "HEAD")
    env["git_commit"] = commit
    if commit is not None:
        env["dirty"] = bool(_git("status", "--porcelain", "--untracked-files=no"))
    env["source_digest"] = source_digest(PACKAGE_ROOT)
    env["gpus"] = _gpus()
    env["cpu"] = _cpu()
    return env


def code_identity(versions: dict[str, Any]) -> str | None:
    """The plugin's files (`source D`); the commit for records written before digests."""
    digest, commit = versions.get("source_digest"), versions.get("git_commit")
    if digest is not None:
        return f"source {str(digest)[:12]}"
    return None if commit is None else f"commit {str(commit)[:12]}"


def gpus_known(value: Any) -> bool:
    """Whether a GPU inventory was read (no GPU is known too); a failed one is unknown."""
    return isinstance(value, dict) and value.get("count") is not None


def _gpu_identity(value: Any) -> Any:
    """What is compared of a GPU inventory: the count and the names (the driver is noted)."""
    if not gpus_known(value):
        return None
    return {"count": value["count"], "names": sorted(value.get("names") or [])}


def comparable(versions: dict[str, Any] | None) -> dict[str, Any] | None:
    if not isinstance(versions, dict):
        return None
    return {
        **{key: versions.get(key) for key in COMPARED},
        "code": code_identity(versions),
        "gpus": _gpu_identity(versions.get("gpus")),
    }


def same(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    """Measured with the same versions: every compared field equal, except that an unknown
    GPU inventory (nvidia-smi failed, then or now) is no difference: unknown is not other."""
    return comparable(old) is not None and not differences(old, new)


def differences(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """`name old -> new` for each compared field that differs (old None: not recorded)."""
    if comparable(old) is None:
        return ["versions not recorded"]
    a, b = comparable(old), comparable(new)
    shown = {**a, "gpus": old.get("gpus")}, {**b, "gpus": new.get("gpus")}
    return [
        f"{k} {describe_field(k, shown[0][k])} -> {describe_field(k, shown[1][k])}"
        for k in COMPARED
        if a[k] != b[k] and not (k == "gpus" and None in (a[k], b[k]))
    ]


def describe_field(key: str, value: Any) -> str:
    if key == "gpus":
        if not gpus_known(value):
            error = value.get("error") if isinstance(value, dict) else None
            return f"unknown ({error})" if error else "unknown"
        if not value["count"]:
            return "no GPU"
        names = sorted(set(value.get("names") or []))
        driver = f", driver {value['driver']}" if value.get("driver") else ""
        return f"{value['count']} x {', '.join(names) or '?'}{driver}"
    if key == "code":
        return "not recorded" if value is None else str(value)
    if key == "cpu":
        if not isinstance(value, dict):
            return "not recorded"
        count = f" ({value['count']} CPUs)" if value.get("count") else ""
        return f"{value.get('model') or 'unknown model'}{count}"
    return "?" if value is None else str(value)


def describe(versions: dict[str, Any] | None) -> str:
    """One line: `sglang 0.5.23, sglang-mixgraph 0.1.0, torch 2.9.1, commit abc, 8 x H200`."""
    if not isinstance(versions, dict):
        return "not recorded (cells written before versions were recorded)"
    parts = [f"{dist} {describe_field(key, versions.get(key))}" for key, dist in PACKAGES]
    commit = versions.get("git_commit")
    if commit is not None:
        parts.append(f"commit {str(commit)[:12]}" + (" (dirty)" if versions.get("dirty") else ""))
    if versions.get("source_digest"):
        parts.append(f"source {str(versions['source_digest'])[:12]}")
    parts.append(f"GPUs: {describe_field('gpus', versions.get('gpus'))}")
    if "cpu" in versions:
        parts.append(f"CPU: {describe_field('cpu', versions['cpu'])}")
    return ", ".join(parts)
