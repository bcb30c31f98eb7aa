"""split_view: the mixed split's fallbacks read only what `SplitView` declares, and both facts
types they are given (the planner's, advise's) provide all of it.

Each fallback's source is read (its attribute reads on the view it is given, by `ast`), and each
is run on an object that has the declared fields and nothing else; the reader is shown to see a
fallback reading a field the protocol does not declare.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import typing
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_mixgraph.advise.server import ServerFacts
from sglang_mixgraph.patches.mixed_split.state import FALLBACKS
from sglang_mixgraph.planner.deployment_facts import Deployment
from sglang_mixgraph.planner.graph_plan import GraphPlan
from sglang_mixgraph.planner.split_view import SplitDeployment, SplitFacts, SplitView

WHOLE = "<passed on whole>"


def protocol_fields(protocol: type) -> set[str]:
    """The attributes a protocol of split_view declares (its properties)."""
    return {name for name, v in vars(protocol).items() if isinstance(v, property)}


DECLARED = {f"facts.{name}" for name in protocol_fields(SplitFacts)} | (
    protocol_fields(SplitView) - {"facts"}
)


def _definition(fn) -> ast.Lambda | ast.FunctionDef:
    """The lambda or def that compiled to `fn`, found in its file by its first line."""
    tree = ast.parse(Path(inspect.getsourcefile(fn)).read_text())
    line = fn.__code__.co_firstlineno
    found = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Lambda | ast.FunctionDef)
        and min([n.lineno] + [d.lineno for d in getattr(n, "decorator_list", [])]) == line
        and n.args.args
        and n.args.args[0].arg == fn.__code__.co_varnames[0]
    ]
    assert len(found) == 1, (fn, line, found)
    return found[0]


def view_reads(fn) -> set[str]:
    """What `fn` reads of the view it is given: `gpu_sm_major`, `facts.<field>`, or WHOLE where
    it hands the view (or its facts) to anything that could read more."""
    node = _definition(fn)
    param = node.args.args[0].arg
    parents = {child: parent for parent in ast.walk(node) for child in ast.iter_child_nodes(parent)}
    reads = set()
    for name in ast.walk(node):
        if not (isinstance(name, ast.Name) and name.id == param):
            continue
        first = parents.get(name)
        if not (isinstance(first, ast.Attribute) and first.value is name):
            reads.add(WHOLE)
        elif first.attr != "facts":
            reads.add(first.attr)
        else:
            second = parents.get(first)
            ok = isinstance(second, ast.Attribute) and second.value is first
            reads.add(f"facts.{second.attr}" if ok else WHOLE)
    return reads


DEPLOYMENT_WIDE = [f for f in FALLBACKS if f.deployment is not None]


@pytest.mark.parametrize("fallback", DEPLOYMENT_WIDE, ids=lambda f: f.key)
def test_a_fallback_reads_only_what_the_view_declares(fallback):
    reads = view_reads(fallback.deployment)
    assert reads and reads <= DECLARED, reads - DECLARED


def test_the_reader_sees_a_fallback_reading_an_undeclared_field():
    """The mutation: a fallback reading a field only the planner's facts have (draft_tokens),
    one reading the plan's prefill graph, one handing the view to a helper."""
    assert view_reads(lambda plan: plan.facts.draft_tokens > 1) == {"facts.draft_tokens"}
    assert view_reads(lambda plan: plan.prefill.backend == "breakable") == {"prefill"}
    assert view_reads(lambda plan: bool(vars(plan.facts))) == {WHOLE}
    assert view_reads(lambda plan: bool(plan) and plan.gpu_sm_major == 9) == {
        WHOLE,
        "gpu_sm_major",
    }
    assert not {"facts.draft_tokens", "prefill", WHOLE} & DECLARED


def _strict_views():
    """Views with the declared fields and nothing else, over values each fallback tests."""
    values = {
        "model_type": (None, "deepseek_v4", "deepseek_v41"),
        "dsv4_attn_backend": (None, "trtllm", "flashmla_mega"),
        "speculative_algorithm": (None, "EAGLE", "NEXTN", "EAGLE3", "STANDALONE"),
        "context_parallel": (False, True),
        "hisparse": (False, True),
    }
    assert set(values) == protocol_fields(SplitFacts)
    for combo in itertools.product(*values.values()):
        facts = SimpleNamespace(**dict(zip(values, combo, strict=True)))
        for sm in (None, 9, 12):
            yield SimpleNamespace(facts=facts, gpu_sm_major=sm)


def test_every_fallback_runs_on_the_declared_fields_alone():
    assert protocol_fields(SplitView) == {"facts", "gpu_sm_major"}
    held = set()
    for view in _strict_views():
        for fallback in DEPLOYMENT_WIDE:
            if fallback.deployment(view):
                held.add(fallback.key)
    assert held == {f.key for f in DEPLOYMENT_WIDE} - {"spec_online_c128"}  # its env is unset


def _annotations(cls) -> dict[str, object]:
    hints = typing.get_type_hints(cls)
    hints |= {
        name: typing.get_type_hints(v.fget)["return"]
        for name, v in vars(cls).items()
        if isinstance(v, property)
    }
    return hints


@pytest.mark.parametrize("facts_type", [ServerFacts, Deployment])
def test_advise_and_the_planner_facts_provide_every_field(facts_type):
    """Each declared field is a field of both facts types, of the declared type."""
    declared = _annotations(SplitFacts)
    provided = {f.name for f in fields(facts_type)}
    assert set(declared) <= provided, set(declared) - provided
    hints = typing.get_type_hints(facts_type)
    assert {name: hints[name] for name in declared} == declared


def test_advise_and_the_planner_hand_a_view():
    assert {"facts", "gpu_sm_major"} <= {f.name for f in fields(GraphPlan)}
    assert {f.name for f in fields(SplitDeployment)} == protocol_fields(SplitView)
    offline = ServerFacts.offline(1, None, {"architectures": ["DeepseekV4ForCausalLM"]})
    view = SplitDeployment(offline, 9)
    assert not any(f.deployment(view) for f in DEPLOYMENT_WIDE)
