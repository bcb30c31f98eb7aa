"""The layout: the package in wings by who runs the code, each module importing only its own
layer or a lower one, read from every import (function-local and importlib ones included):
core < references < runtime foundation < planner < patches < commands < test support. What
SGLang loads at plugin load is the runtime wing alone (a fresh process counts it); core imports
no SGLang and the planner reads no server arguments but through deployment_facts (checked by
import, name and attribute access, each check shown to see a mutation); nothing the server runs
imports the kits or the references; no import cycle; tests, benchmarks and tools get the kits
as package modules: no `sys.path` edits, no benchmark importing a test module or back."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

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


def _top_level_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.partition(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.partition(".")[0])
    return names


def test_benchmarks_and_tests_do_not_import_each_other():
    benchmarks, tests = _scripts("benchmark"), _scripts("test")
    bench_names, test_names = {p.stem for p in benchmarks}, {p.stem for p in tests}
    crossing = [
        f"{p.relative_to(ROOT)} imports {sorted(_top_level_imports(p) & other)}"
        for paths, other in ((benchmarks, test_names), (tests, bench_names))
        for p in paths
        if _top_level_imports(p) & other
    ]
    assert crossing == []


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
# by one patch hook and the commands; the commands (`cli/`, `advise/`) and the A/B tool
# (`ab/`) sit on top; `kits/` and `reference/` are test support. The first match places a
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


def test_loading_the_plugin_imports_only_the_runtime_wing():
    """What SGLang's `load_plugins()` imports of the package in a fresh process: runtime-wing
    modules only, and how many (a new one is a decision: raise the count with its reason)."""
    code = textwrap.dedent(
        """
        import sys
        from sglang.srt.plugins import load_plugins
        load_plugins()
        print(" ".join(sorted(m for m in sys.modules if m.startswith("sglang_mixgraph"))))
        """
    )
    env = {**os.environ, "SGLANG_PLUGINS": "mixgraph"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = proc.stdout.split()
    assert "sglang_mixgraph.plugin" in loaded and "sglang_mixgraph.patches.graph_config" in loaded
    wing = {LAYERS[layer_of(m)][0] for m in loaded}
    assert wing <= set(RUNTIME_WING), sorted(
        m for m in loaded if LAYERS[layer_of(m)][0] not in RUNTIME_WING
    )
    assert len(loaded) == LOADED_AT_PLUGIN_LOAD


# The package's modules SGLang's load_plugins() imports: the package and 8 top-level modules,
# the patches' 11 and the 9 of core they use at import (capture_memory for the effects on
# capture memory that two patches declare).
LOADED_AT_PLUGIN_LOAD = 29


# SGLang and its kernel package, by top-level name: what core/ never imports, statically or at
# run time (FlashMLA's own package is not SGLang: the decode tail calls it lazily on the GPU).
SGLANG_PACKAGES = ("sglang", "sgl_kernel")


def sglang_imports(source: str, name: str) -> list[str]:
    """The SGLang modules a module's source imports, however it spells it: an import
    statement, `importlib.import_module` / `__import__` of a constant, or `sys.modules[...]`."""
    found = []
    for imported in imports_in(source, name, None):
        if imported.partition(".")[0] in SGLANG_PACKAGES:
            found.append(imported)
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "modules"
            and isinstance(node.slice, ast.Constant)
            and str(node.slice.value).partition(".")[0] in SGLANG_PACKAGES
        ):
            found.append(f"sys.modules[{node.slice.value!r}]")
    return found


CORE_MUTATIONS = (
    "import sglang.srt.utils",
    "from sglang.srt.layers import attention",
    "importlib.import_module('sglang.srt.server_args')",
    "__import__('sgl_kernel')",
    "sys.modules['sglang.srt.server_args']",
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
            target.read_text() + f"\n\ndef _mutant():\n    import importlib, sys\n    {line}\n"
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
