"""The layout: what the server runs imports neither `sglang_mixgraph.kits` nor
`sglang_mixgraph.reference` (tests and benchmarks only), no module imports one that imports it
back, every module imports only its own layer or a lower one (core < facts < planner < patches
< plugin and commands; the planner takes typed facts, never the server arguments), and tests, benchmarks and tools get the kits as package modules: no `sys.path`
edits, no benchmark importing a test module or the other way round."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path


def test_serving_code_does_not_import_the_references():
    code = textwrap.dedent(
        """
        import sys
        from sglang_mixgraph.patches import all_patches
        from sglang_mixgraph.patches.mixed_split import forward, plan, state  # noqa: F401
        from sglang_mixgraph import cli, graph_plan, plugin  # noqa: F401
        assert all_patches()
        print(sorted(m for m in sys.modules if m.startswith("sglang_mixgraph.")))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = proc.stdout
    assert "sglang_mixgraph.core.mixed_boundary" in loaded  # the test can see imports
    assert "sglang_mixgraph.reference" not in loaded
    assert "sglang_mixgraph.kits" not in loaded


PACKAGE = Path(__file__).resolve().parents[1] / "python" / "sglang_mixgraph"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that `path` imports anywhere (also inside functions)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in modules else base)
    return (found & modules) - {name}


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


# The layers, lowest first: a module imports only modules of its own layer or a lower one, so
# a server argument read by the CLI or a hook travels down to the patch and the planner as a
# fact and nothing reaches back up. The first matching prefix places a module.
LAYERS = (
    ("core", ("core",)),  # pure logic, no SGLang
    ("references", ("reference",)),  # what only tests and benchmarks run, on core at most
    (
        "foundation",  # what every layer above shares: flags, counters, the Patch machinery
        ("__init__", "flags", "counters", "fallback", "upstream_attrs", "target_gpu", "registry"),
    ),
    # reads SGLang's resolving server arguments into typed facts (and upstream's BCG rules)
    ("facts", ("deployment_facts", "bcg_rules")),
    ("planner", ("graph_plan", "prefill_settlement")),  # takes the facts, never the arguments
    ("patches", ("patches",)),
    (
        "plugin and commands",
        (
            "plugin",
            "resolve",
            "plan_inputs",
            "resolution_errors",
            "presets",
            "dsa_surface",
            "upstream_guards",
            "cli",
            "ab",
            "advise",
            "kits",
        ),
    ),
)


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


def test_every_module_imports_only_its_own_layer_or_lower():
    """core < facts < planner < patches < plugin and commands, read statically from every import,
    function-local ones included."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    unplaced = []
    for name in sorted(paths):
        try:
            layer_of(name)
        except KeyError as e:
            unplaced.append(str(e))
    assert unplaced == []
    graph = {name: _imports(path, set(paths)) for name, path in paths.items()}
    assert layer_violations(graph) == []
    # the check sees a function-local import that goes down (a patch's hook asks the planner)
    assert "sglang_mixgraph.prefill_settlement" in graph["sglang_mixgraph.patches.graph_config"]
    # and would name one that goes up, as the planner reading a patch once did
    reaching_up = {"sglang_mixgraph.graph_plan": {"sglang_mixgraph.patches.live_width_indexer"}}
    assert layer_violations(reaching_up) == [
        "sglang_mixgraph.graph_plan (planner) imports "
        "sglang_mixgraph.patches.live_width_indexer (patches)"
    ]


# How a module reads SGLang's server arguments: upstream's resolution views, or a parameter.
ARGUMENT_READERS = ("resolving_view", "resolved_view", "model_config_of")


def argument_reads(path: Path) -> list[str]:
    """Where the module at `path` reads server arguments: a `server_args` parameter, a
    `server_args` attribute or name, or one of upstream's resolution views."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            found += [f"{node.name}({a.arg})" for a in params if a.arg == "server_args"]
        elif isinstance(node, ast.Name) and node.id == "server_args":
            found.append(f"line {node.lineno}: server_args")
        elif isinstance(node, ast.Attribute) and node.attr == "server_args":
            found.append(f"line {node.lineno}: .server_args")
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += [f"imports {a.name}" for a in node.names if a.name in ARGUMENT_READERS]
    return found


def test_the_planner_takes_facts_not_server_arguments():
    """A server argument reaches the planner only as a typed fact: no planner module names
    `server_args` or imports upstream's resolution views (deployment_facts reads them)."""
    planner = [
        p for p in sorted(PACKAGE.glob("*.py")) if LAYERS[layer_of(_module_name(p))][0] == "planner"
    ]
    assert {p.stem for p in planner} == {"graph_plan", "prefill_settlement"}
    reads = {p.name: argument_reads(p) for p in planner}
    assert reads == {p.name: [] for p in planner}
    # the check sees each way of reading them
    assert argument_reads(PACKAGE / "deployment_facts.py")
    assert any("(server_args)" in r for r in argument_reads(PACKAGE / "bcg_rules.py"))


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
