"""`doctor`'s report: what is installed, what the plugin would do, and why each patch exists.

`doctor_report` gathers it: the installed versions, the GPU, whether SGLang loads the plugin,
every flag, each patch's state, its catalogue entry, every target's check and whatever its
`Patch` record adds for `doctor` (`calibration`, `doctor_caveat`, `doctor_line`), the upstream
guards. `print_doctor` prints one screen of it (every flag, the catalogues and the targets'
signatures with `verbose`). The command's front is cli/doctor.py; sglang is imported inside
the functions only.
"""

from __future__ import annotations

import os
import textwrap
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from sglang_mixgraph.resolution.plan_format import NOT_LOADED, SCHEMA_VERSION


def _dist_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _gpu_info() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"available": False, "reason": "torch is not installed"}
    if not torch.cuda.is_available():
        return {"available": False, "reason": "torch.cuda.is_available() is False"}
    major, minor = torch.cuda.get_device_capability(0)
    return {
        "available": True,
        "count": torch.cuda.device_count(),
        "name": torch.cuda.get_device_name(0),
        "capability": f"{major}.{minor}",
    }


# A patch's catalogue entry as doctor prints it: (label, key in the report).
CATALOGUE = (
    ("why", "why"),
    ("how", "how"),
    ("upstream PR", "upstream_pr"),
    ("retired by", "retired_by"),
    ("docs", "docs_page"),
)


def _patch_flags(patch, status) -> dict[str, Any]:
    """A patch's flags as JSON types them; a deferred or invalid patch keeps its status's words
    (the variable is SGLang's, or does not parse)."""
    if status.deferred is not None or status.error is not None:
        return dict(status.flag_values)
    return {flag.name: flag.get() for flag in patch.flags}


def _doctor_lines(patches) -> list:
    """The facts of the installed SGLang that patches ask `doctor` to report
    (`registry.DoctorLine`)."""
    return [p.doctor_line for p in patches if p.doctor_line is not None]


def doctor_report() -> dict[str, Any]:
    from sglang_mixgraph.flags import FLAGS, FlagValueError
    from sglang_mixgraph.patches import all_patches
    from sglang_mixgraph.registry import PINNED_SGLANG, evaluate, target_checks
    from sglang_mixgraph.resolution.resolve import plugin_load_status
    from sglang_mixgraph.resolution.upstream_guards import guard_report

    plugin = plugin_load_status()
    guards = guard_report()
    patches = []
    for patch in all_patches():
        status = evaluate(patch)
        # Read-only checks of every target, also for patches that are off.
        checks = status.checks or target_checks(patch)
        entry = {
            "id": patch.id,
            "summary": patch.summary,
            "why": patch.why,
            "how": patch.how,
            "upstream_pr": patch.upstream_pr,
            "retired_by": patch.retired_by,
            "docs_page": patch.docs_page,
            "flags": _patch_flags(patch, status),
            "switches": [flag.name for flag in patch.switches],
            # Whatever the flags say, nothing applies when SGLang does not load the plugin.
            "status": status.state if plugin.loaded else NOT_LOADED,
            "status_if_loaded": status.state,
            "reason": status.reason,
            # deferred to upstream although the user switched this plugin's patch on
            "requested_but_deferred": status.deferred is not None and status.requested,
            "targets": [
                {"target": c.target, "expected": c.expected, "found": c.found, "ok": c.ok}
                for c in checks
            ],
        }
        if patch.calibration is not None:
            entry["calibration"] = patch.calibration()
        if patch.doctor_caveat is not None and status.enabled:
            # The one caveat so far is what a switch does under speculative decoding.
            entry["speculative_warning"] = patch.doctor_caveat()
        patches.append(entry)
    flags = []
    for flag in FLAGS.values():
        entry: dict[str, Any] = {
            "name": flag.name,
            "default": flag.default,
            "accepted": list(flag.accepted),
            "set": os.environ.get(flag.name),
        }
        if flag.deferred:
            # SGLang's own flag of the same name: show what SGLang reads, never ours.
            entry["owner"] = "sglang"
            entry["value"] = os.environ.get(flag.name, flag.upstream_field.default)
        else:
            try:
                entry["value"] = flag.get()
            except FlagValueError as e:
                entry["error"] = str(e)
        flags.append(entry)
    return {
        "schema_version": SCHEMA_VERSION,
        "versions": {
            "sglang": _dist_version("sglang"),
            "sglang_pinned": PINNED_SGLANG,
            "sglang_requirement": _sglang_requirement(),
            "sglang_mixgraph": _dist_version("sglang-mixgraph"),
            "torch": _dist_version("torch"),
            "flash_mla": _dist_version("sgl-flash-mla"),
        },
        "gpu": _gpu_info(),
        "plugin": {"loaded": plugin.loaded, "reason": plugin.reason},
        "flags": flags,
        "patches": patches,
        "guards": guards,
        # Facts of the installed SGLang that patches depend on, not failures (how it keeps
        # breakable graphs' break inputs).
        **{line.key: line.read() for line in _doctor_lines(all_patches())},
        # A patch deferred to upstream fails doctor only when the user switched it on: they
        # asked for this plugin's patch and get SGLang's feature of the same name instead.
        # Unset or off, SGLang's flag is simply SGLang's, and nothing the user asked for is lost.
        "ok": all(p["status"] != "cannot apply" for p in patches)
        and not any(p["requested_but_deferred"] and plugin.loaded for p in patches)
        and all("error" not in f for f in flags)
        and all(g["ok"] for g in guards),
    }


def _sglang_requirement() -> str:
    """The plugin's requirement on SGLang from its metadata, e.g. "sglang<0.5.24,>=0.5.23"."""
    import re
    from importlib.metadata import requires

    from sglang_mixgraph.registry import PINNED_SGLANG

    try:
        found = [r for r in requires("sglang-mixgraph") or () if re.match(r"sglang\b(?!-)", r)]
    except PackageNotFoundError:
        found = []
    return found[0] if found else f"sglang=={PINNED_SGLANG} (the plugin's metadata is missing)"


def print_doctor(report: dict[str, Any], verbose: bool = False) -> None:
    """One screen: versions, GPU, plugin, the flags set, a line per patch and per guard; with
    `verbose` every flag, each patch's catalogue entry and every target's signature."""
    from sglang_mixgraph.patches import all_patches

    v = report["versions"]
    print(
        f"sglang {v['sglang']} (requires {v['sglang_requirement']}), "
        f"sglang-mixgraph {v['sglang_mixgraph']}, "
        f"torch {v['torch']}, flash_mla {v['flash_mla']}"
    )
    gpu = report["gpu"]
    print(
        "GPU: "
        + (
            f"{gpu['count']}x {gpu['name']} (SM {gpu['capability']})"
            if gpu["available"]
            else f"none ({gpu['reason']})"
        )
    )
    plugin = report["plugin"]
    if plugin["loaded"]:
        print(f"Plugin: loaded ({plugin['reason']})")
    else:
        print(f"Plugin: NOT LOADED: {plugin['reason']}; no patch applies and SGLang runs unpatched")
    _print_flags(report["flags"], verbose)
    print("Patches (state, switches, upstream targets checked):")
    if not report["patches"]:
        print("  (none)")
    for p in report["patches"]:
        _print_patch(p, verbose)
    print("Upstream guards (what the plugin relies on under breakable graphs):")
    for g in report["guards"]:
        print(f"  [{'ok ' if g['ok'] else 'BAD'}] {g['name']}: {g['what']}")
        for problem in g["problems"]:
            print(f"      {problem}")
    for line in _doctor_lines(all_patches()):
        print(f"{line.label}: {report[line.key]}")
    print(
        "OK"
        if report["ok"]
        else "PROBLEMS: an enabled patch cannot apply or is switched on but deferred to upstream, "
        "a flag is invalid or an upstream guard fails"
    )


def _print_flags(flags: list[dict[str, Any]], verbose: bool) -> None:
    """Every flag with `verbose`; else only those set in the environment or invalid."""
    shown = [f for f in flags if verbose or f["set"] is not None or "error" in f]
    if verbose:
        print("Flags:")
    elif shown:
        print(
            f"Flags set ({len(flags) - len(shown)} others at their defaults; --verbose lists all):"
        )
    else:
        print(f"Flags: all {len(flags)} at their defaults (--verbose lists them)")
    for f in shown:
        value = f"ERROR: {f['error']}" if "error" in f else repr(f["value"])
        if f.get("owner") == "sglang":
            value += " (SGLang's own flag: the patch owning it defers to upstream)"
        if f["set"] == "":  # as README's flag section says: empty means unset
            value += " (set empty: unset, the default applies)"
        print(f"  {f['name']} = {value}")


def _print_patch(p: dict[str, Any], verbose: bool) -> None:
    status = p["status"]
    if status == NOT_LOADED:
        status += f" (if loaded: {p['status_if_loaded']})"
    switches = ", ".join(f"{name}={p['flags'].get(name)!r}" for name in p["switches"])
    bad = [t for t in p["targets"] if not t["ok"]]
    targets = f"{len(p['targets']) - len(bad)}/{len(p['targets'])} targets ok"
    print(f"  {p['id']}: {status} ({switches}); {targets}")
    if verbose:
        print(f"      {p['summary']}")
        for label, key in CATALOGUE:
            if p[key]:
                print(
                    textwrap.fill(
                        f"{label}: {p[key]}",
                        100,
                        initial_indent="      ",
                        subsequent_indent="        ",
                        break_on_hyphens=False,
                    )
                )
        if p.get("calibration"):
            from sglang_mixgraph.core.split_cost_model import calibration_lines

            for line in calibration_lines(p["calibration"], indent="      "):
                print(line)
    if p["reason"]:
        for line in p["reason"].splitlines():
            print(f"      {line}")
    if p.get("speculative_warning"):
        print(f"      WARNING: {p['speculative_warning']}")
    for t in p["targets"] if verbose else bad:
        mark = "ok " if t["ok"] else "BAD"
        print(f"      [{mark}] {t['target']}: {t['found']}")
