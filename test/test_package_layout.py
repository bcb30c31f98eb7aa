"""The layout: the package in wings by who runs the code, each module importing only its own
layer or a lower one, read from every import (function-local and importlib ones included):
core < references < runtime foundation < planner < patches < resolution < commands < test
support, and no command importing another. What SGLang loads at plugin load is the runtime wing
alone (a fresh process with its own environment counts it); core imports no SGLang however it
spells it, and the planner reads no server arguments but through deployment_facts (checked by
import, name, attribute access and annotation, each check shown to see a mutation of a real
module); nothing the server runs imports the kits or the references; no import cycle; tests,
benchmarks and tools get the kits as package modules: no `sys.path` edits, no benchmark
importing a test module or back (each import resolved to the file it finds)."""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from sglang_mixgraph.target_gpu import PLATFORM_PLUGIN_NAME

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "sglang_mixgraph"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _constant_import(node: ast.Call, constants: dict[str, str] | None = None) -> str | None:
    """The module an `importlib.import_module(X)` / `import_module(X)` / `__import__(X)` call
    imports, when X is a string literal or a module-level string constant; else None."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called not in ("import_module", "__import__") or not node.args:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.Name):
        return (constants or {}).get(arg.id)
    return None


def imports_in(
    source: str, name: str, modules: set[str] | None, *, package: bool = False
) -> set[str]:
    """The modules that the source of module `name` imports anywhere: import statements (also
    inside functions, relative ones resolved) and importlib calls on a constant name. With
    `modules`, only those of the package, each by its own name (`from pkg import mod`)."""
    tree = ast.parse(source)
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    base_package = name if package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = base_package.split(".")
                up = parts[: len(parts) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if modules is not None and full in modules else base)
        elif isinstance(node, ast.Call):
            imported = _constant_import(node, constants)
            if imported:
                found.add(imported)
    if modules is None:
        return found - {name}
    return (found & modules) - {name}


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that the module at `path` imports anywhere."""
    return imports_in(
        path.read_text(), _module_name(path), modules, package=path.name == "__init__.py"
    )


KITS, REFERENCE = "sglang_mixgraph.kits", "sglang_mixgraph.reference"


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_serving_code_imports_neither_the_kits_nor_the_references():
    """Statically, counting function-local imports: no module outside `kits/` and `reference/`
    imports either of them, and `reference/` (what the kits build on) imports no kit."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    found = []
    for name, path in sorted(paths.items()):
        if _within(name, KITS):
            continue  # a kit may import anything of the package
        banned = (KITS,) if _within(name, REFERENCE) else (KITS, REFERENCE)
        for imported in sorted(_imports(path, modules)):
            if any(_within(imported, b) for b in banned):
                found.append(f"{name} imports {imported}")
    assert found == []
    # the check sees such imports: the CPU kit runs on the torch references
    assert f"{REFERENCE}.sparse_mla" in _imports(paths[f"{KITS}.dsv4_cpu"], modules)


ROOT = PACKAGE.parents[1]


def _scripts(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def test_tests_benchmarks_and_tools_leave_the_import_path_alone():
    """PYTHONPATH (the command's, or device.sh's) is the one way a folder gets importable."""
    edits = []
    for path in _scripts("test", "benchmark", "tools"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "path"
                and isinstance(node.value, ast.Name)
                and node.value.id == "sys"
            ):
                edits.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert edits == []


def _script_imports(source: str) -> set[str]:
    """Every module a script's source imports, absolute ones (`from a.b import c`: a.b and a.b.c)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


@functools.cache
def _script_folders() -> tuple[Path, ...]:
    """The folders of test/ and benchmark/ a PYTHONPATH could add (device.sh adds some)."""
    roots = [ROOT / "test", ROOT / "benchmark"]
    return tuple(d for r in roots for d in [r, *sorted(r.rglob("*"))] if d.is_dir())


def resolve_script_import(module: str, importer: Path) -> Path | None:
    """The file or folder of the checkout an import finds, searched as Python searches: the
    importer's own folder (a script run, pytest's rootdir insertion), the checkout's root
    (`test.ab.ab_kit` as a namespace package), then the folders a PYTHONPATH could add; None
    where it finds none there (the standard library, the package, sglang)."""
    parts = module.split(".")
    for base in (importer.parent, ROOT, *_script_folders()):
        found = base.joinpath(*parts)
        for candidate in (found.with_name(found.name + ".py"), found):
            if candidate.exists() and "__pycache__" not in candidate.parts:
                return candidate
    return None


def crossing_imports(source: str, importer: Path) -> list[str]:
    """The imports of a script under benchmark/ that find a file of test/, or back."""
    other = ROOT / ("test" if (ROOT / "benchmark") in importer.parents else "benchmark")
    return sorted(
        f"{module} -> {found.relative_to(ROOT)}"
        for module in _script_imports(source)
        if (found := resolve_script_import(module, importer)) is not None
        and (found == other or other in found.parents)
    )


# Imports each added to a real script: a benchmark reaching a test module, or back, however it
# names it (the first three a rule by file stem let through).
SCRIPT_MUTATIONS = (
    ("benchmark/mixed_steady_state.py", "from test.ab import ab_kit"),
    ("benchmark/mixed_steady_state.py", "import test.advise.make_traces"),
    ("test/ab/test_ab_config.py", "from benchmark import mixed_split_inserver"),
    ("test/ab/test_ab_config.py", "import mixed_split_inserver"),
)


def test_benchmarks_and_tests_do_not_import_each_other():
    """Each import resolved to the file it finds, not matched by name; each mutation is seen."""
    crossing = [
        f"{p.relative_to(ROOT)}: {found}"
        for p in _scripts("benchmark", "test")
        for found in crossing_imports(p.read_text(), p)
    ]
    assert crossing == []
    # the resolution finds what a script really imports: a benchmark its sibling
    inserver = ROOT / "benchmark" / "mixed_steady_state.py"
    assert resolve_script_import("mixed_split_inserver", inserver) == inserver.with_name(
        "mixed_split_inserver.py"
    )
    for relative, line in SCRIPT_MUTATIONS:
        path = ROOT / relative
        assert crossing_imports(path.read_text() + f"\n{line}\n", path), line


def test_no_module_imports_one_that_imports_it_back():
    """The package's import graph has no cycle, counting function-local imports too."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: _imports(path, set(paths)) for name, path in paths.items()}

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        seen = set()
        while stack:
            node, trail = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    return trail + [start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, trail + [nxt]))
        return None

    cycles = [c for c in map(cycle_from, sorted(graph)) if c is not None]
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)
    assert "sglang_mixgraph.bcg_rules" in graph["sglang_mixgraph.patches.graph_config"]


# The wings, by who runs the code, and within them the layers, lowest first: a module imports
# only modules of its own layer or a lower one, read from every import (function-local ones
# and `importlib.import_module` of a constant name included). The runtime wing is what SGLang
# loads in every serving process (the top level, `core/`, `patches/`); the planner is imported
# by one patch hook and the commands; what the commands share (`resolution/`) sits below them;
# the commands (`cli/` the fronts, `advise/` and `ab/` their engines) sit on top, importing no
# other command (checked below); `kits/` and `reference/` are test support. The first match places a
# module: a folder by its name, any other top-level module in the runtime foundation.
RUNTIME_FOUNDATION = (
    "__init__",
    "flags",
    "counters",
    "fallback",
    "upstream_attrs",
    "target_gpu",
    "registry",
    "bcg_rules",
)
LAYERS = (
    ("core", ("core",)),  # pure logic, no SGLang (checked by import below)
    ("references", ("reference",)),  # what only tests and benchmarks run, on core at most
    ("runtime foundation", RUNTIME_FOUNDATION),  # flags, counters, the Patch machinery
    ("planner", ("planner",)),  # takes typed facts; deployment_facts alone reads the arguments
    ("patches", ("patches", "plugin")),
    ("resolution", ("resolution",)),  # what the commands share: SGLang's resolution, plan inputs
    ("commands", ("cli", "advise", "ab")),
    ("test support", ("kits",)),
)
RUNTIME_WING = ("core", "runtime foundation", "patches")


def layer_of(name: str) -> int:
    """The index in LAYERS of a package module (`sglang_mixgraph.x.y`); KeyError if none."""
    rest = name.removeprefix("sglang_mixgraph").removeprefix(".") or "__init__"
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(rest == p or rest.startswith(p + ".") for p in prefixes):
            return index
    raise KeyError(f"{name} is in no layer of LAYERS: place it")


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{name} ({LAYERS[layer_of(name)][0]}) imports {imported} ({LAYERS[layer_of(imported)][0]})"
        for name, imports in sorted(graph.items())
        for imported in sorted(imports)
        if layer_of(imported) > layer_of(name)
    ]


def _package_graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: _imports(path, set(paths)) for name, path in paths.items()}


def test_the_top_level_holds_only_what_sglang_loads():
    """`ls python/sglang_mixgraph` shows the wings: the runtime's own modules and folders."""
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert modules == set(RUNTIME_FOUNDATION) | {"plugin"}
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == {
        "core",
        "patches",
        "planner",
        "resolution",
        "cli",
        "advise",
        "ab",
        "kits",
        "reference",
        "data",
    }


def test_every_module_imports_only_its_own_layer_or_lower():
    """Read statically from every import, function-local and importlib ones included."""
    unplaced = []
    for name in sorted(_package_graph()):
        try:
            layer_of(name)
        except KeyError as e:
            unplaced.append(str(e))
    assert unplaced == []
    graph = _package_graph()
    assert layer_violations(graph) == []
    # the check sees a function-local import that goes down (a patch's hook asks the planner)
    assert (
        "sglang_mixgraph.planner.prefill_settlement"
        in graph["sglang_mixgraph.patches.graph_config"]
    )


# The commands: `cli/<name>.py` is a command's front, `ab/` and `advise/` the engines behind
# two of them; `demo` runs the A/B tool against its stand-in, so its engine is ab's. The
# dispatcher (`cli/__init__.py`, `__main__.py`) imports every front; no front imports another
# front or another command's engine, and no engine imports a front or the other engine: what
# two commands share lives below them, in `resolution/`.
COMMAND_ENGINES = {"ab": "ab", "advise": "advise", "demo": "ab", "plan": None, "doctor": None}
DISPATCHER = ("sglang_mixgraph.cli", "sglang_mixgraph.cli.__main__")


def _command_part(name: str) -> str | None:
    """`cli.X` for a front, `ab` or `advise` for an engine's module, None outside the commands."""
    rest = name.removeprefix("sglang_mixgraph.")
    top, _, sub = rest.partition(".")
    if top == "cli" and sub:
        return f"cli.{sub.partition('.')[0]}"
    return top if top in ("ab", "advise") else None


def command_crossings(graph: dict[str, set[str]]) -> list[str]:
    """Each import from one command into another (the dispatcher importing a front excepted)."""
    found = []
    for name, imports in sorted(graph.items()):
        own = _command_part(name)
        if own is None or name in DISPATCHER:
            continue
        allowed = {own}
        if own.startswith("cli."):
            allowed.add(COMMAND_ENGINES.get(own.removeprefix("cli.")))
        for imported in sorted(imports):
            part = _command_part(imported)
            if part is not None and part not in allowed:
                found.append(f"{name} imports {imported}")
    return found


# Edits that make one command import another, each added to a real module's source.
COMMAND_MUTATIONS = {
    "cli/plan.py": "from sglang_mixgraph.cli.doctor import doctor_report",  # front -> front
    "cli/advise.py": "from sglang_mixgraph.ab.config_schema import validated",  # -> other engine
    "ab/arm_plans.py": "from sglang_mixgraph.cli import plan",  # engine -> front
    "advise/capture.py": "from sglang_mixgraph.ab.tools import bench_argv",  # engine -> engine
    "ab/runner.py": "importlib.import_module('sglang_mixgraph.advise.steps')",
}


def test_no_command_imports_another():
    """The fronts and engines of the commands import no other command (read as the layer rule
    reads imports); the check sees each kind of crossing, added to a real module."""
    graph = _package_graph()
    fronts = {p.stem for p in (PACKAGE / "cli").glob("*.py")} - {"__init__", "__main__"}
    assert fronts == set(COMMAND_ENGINES)  # cli/ holds the fronts alone, one per command
    assert command_crossings(graph) == []
    assert "sglang_mixgraph.ab.cli" in graph["sglang_mixgraph.cli.ab"]  # a front its engine
    modules = set(graph)
    for relative, line in COMMAND_MUTATIONS.items():
        path = PACKAGE / relative
        name = _module_name(path)
        mutated = path.read_text() + f"\n\ndef _mutant():\n    import importlib\n    {line}\n"
        assert command_crossings({name: imports_in(mutated, name, modules)}), line


# Imports the plugin must never make, each as a line of source that a mutation adds to
# plugin.py's `register` (the loading path of every serving process): the layer rule names each.
PLUGIN_MUTATIONS = {
    "import sglang_mixgraph.ab.runner": "sglang_mixgraph.ab.runner",
    "from sglang_mixgraph.cli import plan": "sglang_mixgraph.cli.plan",
    "from sglang_mixgraph.kits.install import install_patches": "sglang_mixgraph.kits.install",
    "importlib.import_module('sglang_mixgraph.advise.report')": "sglang_mixgraph.advise.report",
    "importlib.import_module(_NAME)": "sglang_mixgraph.cli.doctor",
}


def test_the_layer_rule_sees_each_way_the_plugin_could_reach_up():
    path = PACKAGE / "plugin.py"
    modules = set(_package_graph())
    source = path.read_text()
    anchor = "def register() -> None:\n"
    assert anchor in source
    for line, imported in PLUGIN_MUTATIONS.items():
        mutated = source.replace(anchor, anchor + f"    import importlib\n    {line}\n")
        mutated += "\n_NAME = 'sglang_mixgraph.cli.doctor'\n"
        graph = {"sglang_mixgraph.plugin": imports_in(mutated, "sglang_mixgraph.plugin", modules)}
        assert [v for v in layer_violations(graph) if imported in v], line
    # and the planner reaching up to a patch, as it once did
    reaching_up = {
        "sglang_mixgraph.planner.graph_plan": {"sglang_mixgraph.patches.live_width_indexer"}
    }
    assert layer_violations(reaching_up) == [
        "sglang_mixgraph.planner.graph_plan (planner) imports "
        "sglang_mixgraph.patches.live_width_indexer (patches)"
    ]


# What a fresh serving process gets of the test process's environment: where Python finds its
# commands and the package, a home and a temporary folder; nothing of SGLang's or the plugin's
# variables (the suite selects the described-GPU platform, SGLANG_PLATFORM, which would load
# the platform plugin's module too), but the plugin allowlist a deployment sets.
SERVING_ENV_KEEPS = ("PATH", "PYTHONPATH", "HOME", "TMPDIR")
SERVING_ENV = {"SGLANG_PLUGINS": "mixgraph"}


def serving_env(parent: dict[str, str]) -> dict[str, str]:
    return {**{k: parent[k] for k in SERVING_ENV_KEEPS if k in parent}, **SERVING_ENV}


_LOAD_PLUGINS = textwrap.dedent(
    """
    import sys
    from sglang.srt.plugins import load_plugins
    load_plugins()
    print(" ".join(sorted(m for m in sys.modules if m.startswith("sglang_mixgraph"))))
    """
)


def _start_loading_the_plugin(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _LOAD_PLUGINS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _loaded(proc: subprocess.Popen) -> list[str]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return out.split()


def test_loading_the_plugin_imports_only_the_runtime_wing():
    """What SGLang's `load_plugins()` imports of the package in a fresh process: runtime-wing
    modules only, and how many (a new one is a decision: raise the count with its reason). The
    child's environment is set, not inherited: a parent that selected a platform (the mutation,
    run beside it) loads one module more, which the count would flag."""
    inheriting = {**os.environ, "SGLANG_PLATFORM": PLATFORM_PLUGIN_NAME, **SERVING_ENV}
    assert serving_env(inheriting) == serving_env({**os.environ, "SGLANG_PLATFORM": ""})
    procs = [_start_loading_the_plugin(serving_env(os.environ))]
    procs.append(_start_loading_the_plugin(inheriting))
    loaded, mutated = (_loaded(p) for p in procs)
    assert len(mutated) == LOADED_AT_PLUGIN_LOAD + 1, mutated  # the count sees an inherited one
    assert set(mutated) - set(loaded) == {"sglang_mixgraph.target_gpu"}
    assert "sglang_mixgraph.plugin" in loaded and "sglang_mixgraph.patches.graph_config" in loaded
    wing = {LAYERS[layer_of(m)][0] for m in loaded}
    assert wing <= set(RUNTIME_WING), sorted(
        m for m in loaded if LAYERS[layer_of(m)][0] not in RUNTIME_WING
    )
    assert len(loaded) == LOADED_AT_PLUGIN_LOAD


# The package's modules SGLang's load_plugins() imports: the package and 7 top-level modules
# (target_gpu, the platform plugin's, only where SGLANG_PLATFORM selects it), the patches' 14
# (their package and 13 modules) and the 10 of core they use at import (core's package and 9
# modules: capture_effects for the effects on capture memory that patches declare,
# compress_events for the compress-plan cap, row_views for wo_a in the attention break).
LOADED_AT_PLUGIN_LOAD = 32


# SGLang and its kernel package, by top-level name: what core/ never imports, statically or at
# run time (FlashMLA's own package is not SGLang: the decode tail calls it lazily on the GPU).
SGLANG_PACKAGES = ("sglang", "sgl_kernel")


def _names_sglang(value: object) -> bool:
    return isinstance(value, str) and value.partition(".")[0] in SGLANG_PACKAGES


def sglang_imports(source: str, name: str) -> list[str]:
    """The SGLang modules a module's source imports, however it spells it: an import
    statement, an SGLang module's name (a literal or a module constant) handed to any call or
    subscript (`importlib.util.find_spec`, `sys.modules.get`, `getattr(importlib, ...)(...)`),
    or any use of the import machinery by name (`importlib.util`, `getattr(importlib, ...)`,
    `sys.modules`), whatever the module it reaches."""
    tree = ast.parse(source)
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    found = [i for i in imports_in(source, name, None) if _names_sglang(i)]
    found += [
        i for i in imports_in(source, name, None) if i in ("importlib.util", "importlib.machinery")
    ]

    def value_of(node: ast.AST) -> object:
        if isinstance(node, ast.Constant):
            return node.value
        return constants.get(node.id) if isinstance(node, ast.Name) else None

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            args = [*node.args, *(k.value for k in node.keywords)]
            found += [
                f"line {node.lineno}: {value_of(a)!r}" for a in args if _names_sglang(value_of(a))
            ]
            if (
                isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and node.args
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id in ("importlib", "sys")
            ):
                found.append(f"line {node.lineno}: getattr({node.args[0].id}, ...)")
        elif isinstance(node, ast.Subscript) and _names_sglang(value_of(node.slice)):
            found.append(f"line {node.lineno}: [{value_of(node.slice)!r}]")
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and (node.value.id, node.attr)
            in (("importlib", "util"), ("importlib", "import_module"), ("sys", "modules"))
        ):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return found


CORE_MUTATIONS = (
    "import sglang.srt.utils",
    "from sglang.srt.layers import attention",
    "importlib.import_module('sglang.srt.server_args')",
    "__import__('sgl_kernel')",
    "sys.modules['sglang.srt.server_args']",
    # the roundabout ways, each once let through
    "importlib.util.find_spec('sglang.srt.utils').loader.load_module()",
    "getattr(importlib, 'import_module')('sglang.srt.server_args')",
    "sys.modules.get('sglang.srt.server_args')",
    "sys.modules.get(_UPSTREAM)",  # a module constant
    "getattr(importlib, 'import_' + 'module')(name)",  # a name built at run time
    "from importlib.util import find_spec",
)


def test_core_imports_no_sglang():
    """Statically, every core module; the check sees each spelling (a mutation of a core module
    adds it inside a function); and at run time importing all of core loads no SGLang."""
    core = sorted((PACKAGE / "core").glob("*.py"))
    assert {p.name: sglang_imports(p.read_text(), _module_name(p)) for p in core} == {
        p.name: [] for p in core
    }
    target = PACKAGE / "core" / "mixed_boundary.py"
    for line in CORE_MUTATIONS:
        mutated = (
            target.read_text()
            + f"\n\ndef _mutant(name):\n    import importlib, sys\n    {line}\n"
            + "\n_UPSTREAM = 'sglang.srt.managers.scheduler'\n"
        )
        assert sglang_imports(mutated, _module_name(target)), line
    names = " ".join(_module_name(p) for p in core)
    code = (
        f"import importlib, sys\nfor n in {names!r}.split(): importlib.import_module(n)\n"
        f"print(sorted(m for m in sys.modules if m.partition('.')[0] in {SGLANG_PACKAGES!r}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-2000:]


# How a module could read SGLang's server arguments: the names of the arguments object, its
# class and upstream's getters of the global one, and the project's resolution views.
ARGUMENT_NAMES = (
    "server_args",
    "ServerArgs",
    "get_server_args",
    "get_global_server_args",
    "resolving_view",
    "resolved_view",
    "model_config_of",
)
ARGUMENT_MODULES = ("sglang.srt.server_args",)


def argument_reads(source: str) -> list[str]:
    """Where a module's source reaches server arguments: a name, attribute, parameter, import
    or annotation (a string one too) among ARGUMENT_NAMES, or an import of ARGUMENT_MODULES."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            params = args.posonlyargs + args.args + args.kwonlyargs
            found += [
                f"line {node.lineno}: parameter {a.arg}" for a in params if a.arg in ARGUMENT_NAMES
            ]
        elif isinstance(node, ast.Name) and node.id in ARGUMENT_NAMES:
            found.append(f"line {node.lineno}: {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in ARGUMENT_NAMES:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.alias) and (
            node.name.rpartition(".")[2] in ARGUMENT_NAMES or node.name in ARGUMENT_MODULES
        ):
            found.append(f"imports {node.name}")
        elif isinstance(node, ast.ImportFrom) and node.module in ARGUMENT_MODULES:
            found.append(f"imports from {node.module}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            words = set(node.value.replace("[", " ").replace("]", " ").replace(".", " ").split())
            if "ServerArgs" in words and len(node.value) < 80:  # a string annotation
                found.append(f"line {node.lineno}: {node.value!r}")
        elif isinstance(node, ast.Call) and _constant_import(node) in ARGUMENT_MODULES:
            found.append(f"line {node.lineno}: imports {_constant_import(node)}")
    return found


PLANNER_MUTATIONS = (
    "get_server_args()",  # upstream's global getter
    "sglang.srt.server_args.get_global_server_args()",  # a module-attribute access
    "deployment.server_args.chunked_prefill_size",
    "from sglang.srt.server_args import ServerArgs",
    "importlib.import_module('sglang.srt.server_args')",
    "from sglang_mixgraph.planner.deployment_facts import resolving_view",
)


def unannotated_parameters(source: str) -> list[str]:
    """The parameters of a module's functions that carry no annotation (`self`, `cls` aside):
    what the annotation check cannot read, so that a renamed one would pass unseen."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Lambda):
            found += [f"line {node.lineno}: lambda {a.arg}" for a in node.args.args]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
            found += [
                f"line {node.lineno}: {node.name}({p.arg})"
                for p in params
                if p.annotation is None and p.arg not in ("self", "cls")
            ]
    return found


# A parameter renamed away from ARGUMENT_NAMES, each added to a real planner module: seen as
# unannotated, or by its annotation.
RENAMED_PARAMETERS = (
    "def _mutant(args):\n    return args.chunked_prefill_size\n",
    "def _mutant(facts, *, args=None): ...\n",
    "_mutant = lambda args: args.cuda_graph_max_bs\n",
    "def _mutant(args: ServerArgs): ...\n",
    "def _mutant(args: 'sglang.srt.server_args.ServerArgs'): ...\n",
    "def _mutant(args: Optional[ServerArgs]): ...\n",
)


def test_planner_parameters_are_annotated_and_read_by_annotation():
    """Every parameter of a planner function but deployment_facts' carries its type, so the
    argument check reads what it takes by annotation, not by the parameter's name."""
    planner = sorted((PACKAGE / "planner").glob("*.py"))
    missing = {
        p.stem: unannotated_parameters(p.read_text())
        for p in planner
        if p.stem != "deployment_facts" and unannotated_parameters(p.read_text())
    }
    assert missing == {}
    body = (PACKAGE / "planner" / "memory_fit.py").read_text()
    for mutation in RENAMED_PARAMETERS:
        mutated = body + "\n\n" + mutation
        assert unannotated_parameters(mutated) or argument_reads(mutated), mutation


def test_the_planner_takes_facts_not_server_arguments():
    """A server argument reaches the planner only as a typed fact: no planner module but
    deployment_facts (which reads them into a Deployment) names them, imports them or their
    module, or takes them as a parameter, renamed or annotated; each mutation is seen."""
    planner = sorted((PACKAGE / "planner").glob("*.py"))
    readers = {p.stem for p in planner if argument_reads(p.read_text())}
    assert readers == {"deployment_facts"}
    target = PACKAGE / "planner" / "graph_plan.py"
    body = target.read_text()
    for line in PLANNER_MUTATIONS:
        mutated = body + f"\n\ndef _mutant(deployment):\n    import importlib\n    {line}\n"
        assert argument_reads(mutated), line
    for signature in ("def _mutant(args: ServerArgs): ...", "def _mutant(args: 'ServerArgs'): ..."):
        assert argument_reads(body + "\n\n" + signature + "\n"), signature
    assert argument_reads(body + "\n\ndef _mutant(server_args): ...\n")


def test_every_core_module_has_its_test_file():
    """test/ mirrors the package: core/<name>.py is tested in test/core/test_<name>.py (the
    patches' tests are checked with their pages, test/test_docs.py)."""
    tests = ROOT / "test" / "core"
    missing = [
        f"core/{p.name} has no test/core/test_{p.name}"
        for p in sorted((PACKAGE / "core").glob("*.py"))
        if p.name != "__init__.py" and not (tests / f"test_{p.name}").is_file()
    ]
    assert missing == []


def test_attribute_names_on_upstream_objects_are_defined_once():
    """Every prefixed attribute name the plugin sets on upstream objects is a constant of
    `upstream_attrs`, each a distinct name; no other module spells one out as a string."""
    from sglang_mixgraph import upstream_attrs

    package = Path(upstream_attrs.__file__).parent
    names = {k: v for k, v in vars(upstream_attrs).items() if k.isupper()}
    assert names and len(set(names.values())) == len(names)
    spelled = []
    for path in package.rglob("*.py"):
        if path.name == "upstream_attrs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.lstrip("_").startswith("mixgraph_")
                and node.value != "mixgraph_target"  # the platform plugin's entry point name
            ):
                spelled.append(f"{path.relative_to(package)}:{node.lineno} {node.value!r}")
    assert spelled == []
