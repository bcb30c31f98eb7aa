"""`sglang-mixgraph ab` greedy token check: `[tokens]`, its cells, its report section.

The configuration and the plan are checked without a server; the runs go against the CPU
stand-in, whose greedy output ids are a function of the input ids, and which answers other ids
for the arm that sets FLAG when STANDIN_TOKENS_DIFFER_FROM asks it to: the report must say
16/16 where the arms agree, and how many differ and from where when one does not. A finished
token cell is not measured again, a damaged one is; the cell runs after the visit's load cells
on the same server, and `--dry-run` lists it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from ab_kit import FLAG, Recorder, pids_alive, standin_config

from sglang_mixgraph.ab import cli as ab_cli
from sglang_mixgraph.ab import greedy_tokens, runner
from sglang_mixgraph.ab.config import ConfigError, parse_config, read_toml
from sglang_mixgraph.ab.results import first_difference
from sglang_mixgraph.ab.tools import TOKENS_MODULE
from sglang_mixgraph.resolution.serving_client import BENCH_MODULE

ARMS = f"""
[[arm]]
name = "base"

[[arm]]
name = "flip"
env = {{ {FLAG} = "1" }}
"""
SWEEP = """concurrencies = [1]
dataset = "random-ids"
input_len = 8
output_len = 2
num_prompts = 2
warmup_requests = 1
repeats = 2"""
TOKENS = """
[tokens]
enabled = true
input_len = 16
output_len = 8
"""
PROMPTS = 16  # the default


@pytest.fixture(autouse=True)
def _offline_and_pids(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("STANDIN_PID_FILE", str(tmp_path / "pids"))
    monkeypatch.delenv("STANDIN_TOKENS_DIFFER_FROM", raising=False)
    yield
    assert pids_alive(tmp_path / "pids") == [], "a server process outlived the run"


def _raw(**tokens) -> dict:
    return {
        "server": {"model_path": "/m"},
        "arm": [{"name": "U"}, {"name": "E"}, {"name": "L"}],
        "sweep": {"concurrencies": [4, 8], "repeats": 2},
        "gsm8k": {"enabled": False},
        "tokens": tokens,
    }


def _run(config: Path, run_dir: Path, recorder: Recorder) -> int:
    return ab_cli.main(["run", str(config), "--run-dir", str(run_dir)], invoker=recorder)


# ---------------------------------------------------------------- configuration and plan


def test_tokens_is_off_by_default_and_its_defaults():
    t = parse_config(_raw()).tokens
    assert (t.enabled, t.prompts, t.input_len, t.output_len, t.seed, t.arms, t.timeout_s) == (
        False, 16, 512, 32, 0, (), 300.0,
    )  # fmt: skip
    visits = runner.plan(parse_config({**_raw(), "tokens": {}}))
    assert {c.kind for v in visits for c in v.cells} == {"bench"}


def test_every_visit_of_a_listed_arm_ends_with_a_tokens_cell():
    visits = runner.plan(parse_config(_raw(enabled=True, arms=["U", "L"])))
    assert [(v.arm.name, v.repeat, [c.kind for c in v.cells]) for v in visits] == [
        ("U", 0, ["bench", "bench", "tokens"]),
        ("E", 0, ["bench", "bench"]),
        ("L", 0, ["bench", "bench", "tokens"]),
        ("L", 1, ["bench", "bench", "tokens"]),
        ("E", 1, ["bench", "bench"]),
        ("U", 1, ["bench", "bench", "tokens"]),
    ]
    cells = [c for v in visits for c in v.cells if c.kind == "tokens"]
    # One cell per visit: the repeat is in its key, its file and its label.
    assert len({c.key for c in cells}) == 4
    assert cells[0].stem == f"tokens/U_r0_{cells[0].key}"
    assert cells[0].label() == "tokens arm=U repeat=1"
    assert runner.raw_path(Path("/r"), cells[0]) == Path(f"/r/tokens/U_r0_{cells[0].key}.json")
    # --accuracy-only runs GSM8K alone.
    only = {**_raw(enabled=True), "gsm8k": {"threshold": 0.5}}
    visits = runner.plan(parse_config(only, accuracy_only=True), accuracy_only=True)
    assert {c.kind for v in visits for c in v.cells} == {"gsm8k"}


@pytest.mark.parametrize(
    "tokens, message",
    [
        ({"enabled": "yes"}, "[tokens] enabled: expected true/false, got 'yes'"),
        ({"prompts": 0}, "[tokens] prompts: must be at least 1, got 0"),
        ({"input_len": 0}, "[tokens] input_len: must be at least 1, got 0"),
        ({"output_len": 1.5}, "[tokens] output_len: expected an integer, got 1.5"),
        ({"seed": -1}, "[tokens] seed: must be at least 0, got -1"),
        ({"timeout_s": 0}, "[tokens] timeout_s: must be at least 1, got 0"),
        ({"arms": ["X"]}, "[tokens] arms: no arm named 'X'"),
        (
            {"prompt": 4},
            "[tokens]: unknown key 'prompt' (known: arms, enabled, input_len, output_len, "
            "prompts, seed, timeout_s)",
        ),
    ],
)
def test_bad_tokens_values_are_one_line_errors_naming_the_key(tokens, message):
    with pytest.raises(ConfigError) as e:
        parse_config(_raw(**tokens))
    assert str(e.value) == message


# ---------------------------------------------------------------- the prompts


def test_prompts_are_the_seeds_alone_and_within_the_vocabulary(tmp_path, monkeypatch):
    prompts = greedy_tokens.build_prompts(50, 100, 7, 1000)
    assert prompts == greedy_tokens.build_prompts(50, 100, 7, 1000)
    assert prompts != greedy_tokens.build_prompts(50, 100, 8, 1000)
    lengths = [len(p) for p in prompts]
    assert min(lengths) >= 50 and max(lengths) <= 150 and len(set(lengths)) > 10
    assert all(0 <= i < 1000 for p in prompts for i in p)
    # The vocabulary: the model directory's config.json (text_config for a multimodal one),
    # else the fallback bound.
    monkeypatch.setattr(greedy_tokens, "_request", lambda *a, **k: {"model_path": str(tmp_path)})
    assert greedy_tokens.vocab_size("http://h:1", 5)[0] == greedy_tokens.FALLBACK_VOCAB
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 1234}}))
    assert greedy_tokens.vocab_size("http://h:1", 5) == (1234, str(tmp_path / "config.json"))
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_dry_run_lists_a_tokens_cell_per_visit(tmp_path, capsys):
    config = tmp_path / "ab.toml"
    config.write_text(
        '[[arm]]\nname = "base"\nurl = "http://h:1"\n[[arm]]\nname = "flip"\nurl = "http://h:2"\n'
        f"[sweep]\n{SWEEP}\n[gsm8k]\nenabled = false\n{TOKENS}"
    )
    run_dir = tmp_path / "run"
    assert ab_cli.main(["run", str(config), "--dry-run", "--run-dir", str(run_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    cells = [line for line in lines if line.startswith("  tokens ")]
    assert [line.split(":")[0] for line in cells] == [
        "  tokens arm=base repeat=1",
        "  tokens arm=flip repeat=1",
        "  tokens arm=flip repeat=2",
        "  tokens arm=base repeat=2",
    ]
    first = runner.plan(parse_config(read_toml(config)))[0].cells[-1]
    assert cells[0].endswith(
        f"{sys.executable} -m {TOKENS_MODULE} --base-url http://h:1 --prompts 16 --input-len 16 "
        f"--output-len 8 --seed 0 --timeout-s 300 --out {run_dir / first.stem}.json"
    )
    # Each visit's tokens cell comes after its load cell.
    assert lines.index(cells[0]) > lines.index(next(x for x in lines if "arm=base concurr" in x))
    assert "for 8 cells" in next(x for x in lines if x.startswith("estimate: "))


# ---------------------------------------------------------------- runs


def _tokens_rows(run_dir: Path) -> list[tuple[str, int, int | None]]:
    results = json.loads((run_dir / "results.json").read_text())
    return [(v["arm"], v["visit"], v["equal"]) for v in results["tokens"]["visits"]]


def test_equal_tokens_each_after_its_visits_load_cells_and_kept_on_resume(tmp_path, capsys):
    config = standin_config(tmp_path, arms=ARMS, sweep=SWEEP, extra=TOKENS)
    run_dir = tmp_path / "run"
    recorder = Recorder()
    assert _run(config, run_dir, recorder) == 0
    # Per visit, its load cell then its tokens cell, on the same server.
    modules = [module for module, _ in recorder.calls]
    assert modules == [BENCH_MODULE, TOKENS_MODULE] * 4
    for visit in runner.plan(parse_config(read_toml(config))):
        bench, tokens = (runner.read_record(run_dir, c) for c in visit.cells)
        assert tokens["started"] >= bench["started"] + bench["wall_s"]
        assert tokens["server_url"] == bench["server_url"]
    assert _tokens_rows(run_dir) == [
        ("base", 1, 16),
        ("base", 2, 16),
        ("flip", 1, 16),
        ("flip", 2, 16),
    ]
    report = (run_dir / "report.md").read_text()
    assert "## Greedy tokens" in report and "The reference is `base`'s first visit" in report
    assert "| `base` | 1 | 16/16 (the reference) | - |" in report
    assert "| `flip` | 2 | 16/16 | - |" in report
    assert "Every arm's visits gave the same output ids as its first visit." in report
    assert json.loads((run_dir / "results.json").read_text())["tokens"]["visits_of_an_arm_agree"]
    assert "tokens arm=flip repeat=2: 16 prompts, output ids digest " in capsys.readouterr().err

    # Resumed: nothing is measured again.
    idle = Recorder()
    assert _run(config, run_dir, idle) == 0 and idle.calls == []
    # A damaged raw output is measured again, alone, and kept aside.
    cell = runner.plan(parse_config(read_toml(config)))[2].cells[-1]  # flip, repeat 2
    raw = runner.raw_path(run_dir, cell)
    raw.write_text(raw.read_text()[:40])
    again = Recorder()
    assert _run(config, run_dir, again) == 0
    assert "finished but damaged" in capsys.readouterr().err
    assert [module for module, _ in again.calls] == [TOKENS_MODULE]
    assert raw.with_name(raw.name + ".damaged").exists()


def test_an_arm_that_differs_and_a_visit_that_differs_from_its_own_arm(tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_TOKENS_DIFFER_FROM", "3")
    config = standin_config(tmp_path, arms=ARMS, sweep=SWEEP, extra=TOKENS)
    run_dir = tmp_path / "run"
    assert _run(config, run_dir, Recorder()) == 0  # the check informs, it does not judge
    # The stand-in changes the prompts whose first id is even, from output index 3 on.
    prompts = greedy_tokens.build_prompts(PROMPTS, 16, 0, greedy_tokens.FALLBACK_VOCAB)
    changed = sum(p[0] % 2 == 0 for p in prompts)
    assert 0 < changed < PROMPTS
    same = PROMPTS - changed
    assert _tokens_rows(run_dir) == [
        ("base", 1, 16), ("base", 2, 16), ("flip", 1, same), ("flip", 2, same),
    ]  # fmt: skip
    report = (run_dir / "report.md").read_text()
    where = f"{changed} prompts, from index 3 (median 3, latest 3)"
    assert f"| `flip` | 1 | {same}/16 | {where} |" in report
    assert "Every arm's visits gave the same output ids as its first visit." in report

    # A visit that differs from its own arm's first: the server is not deterministic here.
    (raw,) = [p for p in run_dir.glob("tokens/base_r1_*") if p.suffixes == [".json"]]
    result = json.loads(raw.read_text())
    result["output_ids"][4][5] += 1
    raw.write_text(json.dumps(result))
    assert ab_cli.main(["report", str(run_dir)]) == 0
    report = (run_dir / "report.md").read_text()
    assert "| `base` | 2 | 15/16 | 1 prompt, from index 5 |" in report
    assert "- `base` visit 2: 15/16 equal to visit 1; 1 prompt, from index 5" in report
    assert (
        "So the server itself is not deterministic under this batching; differences between "
        "arms mean nothing beyond that." in report
    )
    tokens = json.loads((run_dir / "results.json").read_text())["tokens"]
    assert tokens["visits_of_an_arm_agree"] is False
    within = tokens["within_arm"]
    assert within["flip"]["differing_visits"] == []
    assert within["base"]["differing_visits"] == [
        {"visit": 2, "equal": 15, "total": 16, "differing": [{"prompt": 4, "first_index": 5}]}
    ]
