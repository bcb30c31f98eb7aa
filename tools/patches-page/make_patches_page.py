"""Writes docs/patches.md: every patch of the plugin, read from its `Patch` declaration.

For each patch of `sglang_mixgraph.patches.all_patches()`: its switches and the flags that tune
it (name, values, default, from the `Flag` objects), why upstream needs it, how it works, the
upstream pull request it mirrors, what retires it, its reference page, and the commands that
read it. Those come from the declaration too: `doctor` reads every patch's catalogue and target
checks (and, where a patch declares them, its cost model's calibration, its caveat, a fact of
the installed SGLang), `plan` its state and, where `explain` or `explain_if_on` is set, what it
or its switches do in the planned deployment;
the capture-memory estimate reads `capture_effects`; `advise` prices the patches its verdicts
name; `ab` checks every flag an arm sets. test/tools/test_patches_page.py fails when the page
is not what this script writes.

    python tools/patches-page/make_patches_page.py
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "patches.md"
COMMAND = "python tools/patches-page/make_patches_page.py"
PULL_URL = "https://github.com/sgl-project/sglang/pull/"


def advised() -> dict[str, list[str]]:
    """The titles of `advise`'s verdicts by the patch each prices: its verdicts for a model it
    does not know, which name every patch it prices and nothing else."""
    from sglang_mixgraph.advise.verdicts import Inputs, all_verdicts

    unknown = Inputs(facts=SimpleNamespace(architectures=()), gpu=None, steps=[], model=None)
    titles: dict[str, list[str]] = {}
    for verdict in all_verdicts(unknown):
        titles.setdefault(verdict.patch, []).append(verdict.title)
    return titles


def _is_bool(flag) -> bool:
    from sglang_mixgraph.flags import StrictEnvBool

    return isinstance(flag.field, StrictEnvBool)


def _values(flag) -> str:
    if _is_bool(flag):
        return "`0`/`1`"
    shown = ", ".join(f"`{v}`" for v in flag.accepted)
    return f"{shown} ({flag.field.accepted_help})" if flag.field.accepted_help else shown


def _default(flag) -> str:
    if _is_bool(flag):
        return "1" if flag.default else "0"
    return str(flag.default)


def _bool_words(flag) -> tuple[list[str], list[str]]:
    """The words a boolean flag reads as on, and as off."""
    on = [v for v in flag.accepted if flag.field.parse(v)]
    return on, [v for v in flag.accepted if not flag.field.parse(v)]


def on_by_default(patch) -> bool:
    return any(f.field.parse(f.off_value) != f.default for f in patch.switches)


def _docs_link(patch) -> str:
    target = os.path.relpath(ROOT / patch.docs_page, PAGE.parent)
    return f"[{patch.docs_page}]({target})"


def _linked_prs(text: str) -> str:
    return re.sub(r"\bPR #(\d+)\b", lambda m: f"[{m.group(0)}]({PULL_URL}{m.group(1)})", text)


def _pr_cell(patch) -> str:
    number = patch.upstream_pr_number
    return f"[#{number}]({PULL_URL}{number})" if number is not None else "none"


def readers(patch, advise_titles: Iterable[str]) -> list[str]:
    """What each command reads of the patch, one line each."""
    from sglang_mixgraph.patches.graph_config import PREFILL_BUCKETS

    targets = len(patch.hooks) + len(patch.reads)
    lines = [
        f"`doctor`: its state, its switches and the check of the {targets} upstream "
        f"target{'s' if targets != 1 else ''} it hooks or reads against the installed SGLang; "
        "`doctor --verbose` adds why, how, the upstream PR, what retires it and its page"
    ]
    if patch.calibration is not None:
        lines.append(
            "`doctor --verbose`: where its cost model's coefficients come from on this "
            "machine's GPU (`--json` always has it)"
        )
    if patch.doctor_caveat is not None:
        lines.append(
            "`doctor`, while it is on: a warning of what the switches set would do under "
            "speculative decoding"
        )
    if patch.doctor_line is not None:
        lines.append(
            f"`doctor`: a line on the installed SGLang it depends on "
            f'("{patch.doctor_line.label}: ...")'
        )
    if patch.explain is not None:
        lines.append(
            "`plan`: its state in the planned deployment and what it does there (acts, or falls "
            "back and why); switched off, what each switch would do there"
        )
    elif patch.explain_if_on is not None:
        lines.append(
            "`plan`: its state in the planned deployment; switched off, what each switch would "
            "do there (read from the planned graphs)"
        )
    else:
        lines.append(
            "`plan`: its state in the planned deployment; switched off, what its switches "
            "would turn on"
        )
    if patch.capture_effects is not None:
        lines.append(
            "`plan`'s capture-memory estimate counts what it changes in a breakable capture, "
            f"as does the server's own estimate at startup under `{PREFILL_BUCKETS.name}="
            "auto`"
        )
    titles = list(advise_titles)
    if titles:
        lines.append(
            "`advise`: prices it on a profiled server "
            f"({', '.join(titles)} verdict{'s' if len(titles) > 1 else ''})"
        )
    lines.append(
        "`ab`: an arm may set its flags; `ab` checks their names and values before it starts "
        "a server"
    )
    return lines


def _flag_line(flag, switch: bool) -> str:
    role = f"switch, off at `{flag.off_value}`" if switch else "tunes it"
    return f"- `{flag.name}` ({role}): {_values(flag)}; default `{_default(flag)}`. {flag.doc}"


def _sentence(text: str) -> str:
    """The text as a sentence: a plain first word capitalised (never a code name such as
    `eager_on_graph`), one full stop."""
    text = text.rstrip(".")
    if re.match(r"[a-z]+'?s?\b(?![_.(])", text):
        text = text[0].upper() + text[1:]
    return f"{text}."


def patch_section(patch, advise_titles: Iterable[str] = ()) -> str:
    flags = [_flag_line(f, True) for f in patch.switches] + [
        _flag_line(f, False) for f in patch.flags[patch.switch_count :]
    ]
    either = (
        " Each switch turns it on; it is off only with every switch at its off value."
        if patch.switch_count > 1
        else ""
    )
    pr = _linked_prs(patch.upstream_pr) if patch.upstream_pr else "none: it mirrors no upstream PR"
    return "\n".join(
        [
            f"## `{patch.id}`",
            "",
            _sentence(patch.summary),
            "",
            f"**{'Switches' if patch.switch_count > 1 else 'Switch'}"
            f"{' and flags' if len(patch.flags) > patch.switch_count else ''}.**{either}",
            "",
            *flags,
            "",
            f"**Why.** {_sentence(patch.why)}",
            "",
            f"**How.** {_sentence(patch.how)}",
            "",
            f"**Upstream PR.** {_sentence(pr)}",
            "",
            f"**Retired when.** {_sentence(patch.retired_by)}",
            "",
            f"**Reference page.** {_docs_link(patch)}.",
            "",
            "**Read by.**",
            "",
            *(f"- {line}" for line in readers(patch, advise_titles)),
        ]
    )


def render(patches, advise_by_patch: Mapping[str, Iterable[str]]) -> str:
    """The whole page for `patches`, with `advise`'s verdict titles by patch id."""
    on, off = _bool_words(next(f for p in patches for f in p.flags if _is_bool(f)))
    rows = [
        f"| [`{p.id}`](#{p.id}) | {', '.join(f'`{f.name}`' for f in p.switches)} | "
        f"{'on' if on_by_default(p) else 'off'} | {_pr_cell(p)} | {_docs_link(p)} |"
        for p in patches
    ]
    intro = [
        "# Patches",
        "",
        f"<!-- Generated by `{COMMAND}` from each patch's declaration (`PATCH` in "
        "`python/sglang_mixgraph/patches/`); edit the declaration, then run the command. -->",
        "",
        "Every patch of sglang-mixgraph: the environment variables that switch it on and tune "
        "it, why upstream SGLang needs it, how it works, the upstream pull request it mirrors, "
        "the upstream change that retires it, its reference page, and what each "
        "`sglang-mixgraph` command reads of it. The README's [flag table](../README.md#flags) "
        "has every flag in one list.",
        "",
        "Flags are parsed strictly: a value outside the accepted ones stops startup with a "
        "message naming the variable; an empty value means unset."
        f" Booleans accept {'/'.join(on)} for on and {'/'.join(off)} for off.",
        "",
        "| patch | switch | by default | upstream PR | reference page |",
        "|---|---|---|---|---|",
        *rows,
    ]
    sections = [patch_section(p, advise_by_patch.get(p.id, ())) for p in patches]
    return "\n\n".join(["\n".join(intro), *sections]) + "\n"


def current_page() -> str:
    """The page as the installed patches and `advise` declare it now."""
    from sglang_mixgraph.patches import all_patches

    return render(all_patches(), advised())


def main() -> None:
    PAGE.write_text(current_page())
    print(f"wrote {PAGE.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
