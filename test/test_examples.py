"""The example configurations follow the method README.md and docs/ab.md describe.

README says each cell sends N x concurrency prompts after an M x concurrency warm-up, and
docs/ab.md's table gives the defaults (per concurrency, and the floor `min_prompts`); every
example under examples/ must send exactly that at each of its concurrencies, or say why not
in a `# method:` comment, so an example cannot drift from the documented method unnoticed.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from sglang_mixgraph.ab.config import CONCURRENCY, Sweep, parse_config

ROOT = Path(__file__).parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))


def _readme_method() -> tuple[int, int]:
    text = " ".join((ROOT / "README.md").read_text().split())
    found = re.search(
        r"Each cell sends (\d+) x concurrency prompts after an? (\d+) x concurrency warm-up", text
    )
    assert found, "README.md no longer states the prompts and warm-up per concurrency"
    return int(found[1]), int(found[2])


def _documented_defaults() -> tuple[int, int, int]:
    text = (ROOT / "docs" / "ab.md").read_text()
    prompts = re.search(r"\| `prompts_per_concurrency`, `min_prompts` \| `(\d+)`, `(\d+)` \|", text)
    warmup = re.search(r"\| `warmup_per_concurrency` \| `(\d+)` \|", text)
    assert prompts and warmup, "docs/ab.md's [sweep] table no longer gives the defaults"
    return int(prompts[1]), int(prompts[2]), int(warmup[1])


def test_readme_docs_and_config_defaults_agree():
    per_prompt, per_warmup = _readme_method()
    doc_prompts, _, doc_warmup = _documented_defaults()
    assert (per_prompt, per_warmup) == (doc_prompts, doc_warmup)
    sweep = {name: f.default for name, f in Sweep.model_fields.items()}
    assert (sweep["prompts_per_concurrency"], sweep["warmup_per_concurrency"]) == (
        doc_prompts,
        doc_warmup,
    )
    assert sweep["min_prompts"] == _documented_defaults()[1]


def test_there_are_examples():
    assert len(EXAMPLES) >= 4, EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_example_sends_the_documented_prompts_and_warm_up(path):
    text = path.read_text()
    if re.search(r"^\s*# method:", text, re.MULTILINE):
        return  # the example says why it departs from the method
    per_prompt, per_warmup = _readme_method()
    _, min_prompts, _ = _documented_defaults()
    sweep = parse_config(tomllib.loads(text)).sweep
    points = [p for p in sweep.points() if p.kind == CONCURRENCY]
    assert points, f"{path.name}: no concurrency points"
    for point in points:
        c = int(point.value)
        assert sweep.prompts(point) == max(min_prompts, per_prompt * c), (path.name, c)
        assert sweep.warmup(point) == per_warmup * c, (path.name, c)


def _arms(name: str) -> dict:
    cfg = parse_config(tomllib.loads((ROOT / "examples" / name).read_text()))
    return {a.name: (dict(a.env), tuple(a.args)) for a in cfg.arms}


SPLIT_ALWAYS = {"SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN": "1", "SGLANG_MIXGRAPH_SPLIT_POLICY": "always"}


def test_reproduction_examples_run_the_pull_requests_arms():
    """As the pull requests ran them: the split on every mixed step against no split; the
    breakable graph with the split and read-done against eager split steps; GLM-5's breakable
    graph against none, and with the empty segments dropped against without."""
    split = _arms("ab_repro_dsv4_split.toml")
    assert split == {
        "split_off": ({"SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN": "0"}, ()),
        "split_on": (SPLIT_ALWAYS, ()),
    }
    bcg = _arms("ab_repro_dsv4_bcg.toml")
    assert list(bcg) == ["split_eager", "bcg_split_rd"]
    assert bcg["split_eager"] == (SPLIT_ALWAYS, ())
    env, args = bcg["bcg_split_rd"]
    assert env == dict(
        SPLIT_ALWAYS, SGLANG_EXPERIMENTAL_FORCE_BCG="1", SGLANG_OPT_DSV4_REPLAY_READ_DONE="1"
    )
    assert args == ("--cuda-graph-bs-prefill", "512", "1024", "1536", "2048", "2560", "2816")
    glm5 = _arms("ab_repro_glm5_bcg.toml")
    assert glm5["graph_off"] == ({}, ("--cuda-graph-backend-prefill", "disabled"))
    assert glm5["bcg"] == ({}, ("--cuda-graph-backend-prefill", "breakable"))
    assert glm5["bcg_drop"] == (
        {"SGLANG_OPT_BCG_DROP_EMPTY_SEGMENTS": "1"},
        ("--cuda-graph-backend-prefill", "breakable"),
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_examples_gates_pass_only_on_what_the_data_confirm(path):
    """A gate of an example passes only when the ratio's whole 95% interval is past its bound
    (`judge = "confirmed"`), over at least two repeats so that there is an interval."""
    config = parse_config(tomllib.loads(path.read_text()))
    assert config.gates, f"{path.name}: no gate"
    for gate in config.gates:
        assert gate.judge == "confirmed", (path.name, gate.describe())
    assert config.sweep.repeats // config.sweep.visits_per_block() >= 2, path.name
