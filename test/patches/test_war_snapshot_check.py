"""The WAR snapshot check watches every reader of the two shared tables, and side streams (CPU).

Which readers: every function of SGLang's DeepSeek-V4 backend, its ``dsv4`` modules and its
memory pool whose code names ``req_to_token`` or ``full_to_swa`` (a search of the installed
sources) is either hooked (``READERS``) or says why it needs no hook (``NOT_HOOKED``), and
docs/war-read-done.md lists each. Every hooked reader raises after a publish before it reads.
A read issued on another stream than the read-done event's fails the publish.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sglang_mixgraph.kits import dsv4_cpu as K
from sglang_mixgraph.kits.install import installed

K.import_upstream()

# Hook targets resolve at install: import them while the device probes tell the truth (CPU).
import sglang.srt.managers.scheduler  # noqa: E402, F401
import sglang.srt.model_executor.model_runner  # noqa: E402, F401
from sglang.srt.layers.attention.base_attn_backend import SharedReadEnds  # noqa: E402
from sglang.srt.model_executor.runner_utils import shared_read_event  # noqa: E402

from sglang_mixgraph import counters  # noqa: E402
from sglang_mixgraph.patches import war_snapshot_check as wc  # noqa: E402

SGLANG = Path(importlib.import_module("sglang").__file__).parent
SEARCHED = (
    "srt/layers/attention/deepseek_v4_backend.py",
    "srt/mem_cache/deepseek_v4_memory_pool.py",
    "srt/layers/attention/dsv4",
)
TABLE_NAMES = ("req_to_token", "full_to_swa")
ON = {"SGLANG_DEBUG_WAR_SNAPSHOT": "1"}
DOC = Path(__file__).resolve().parents[2] / "docs" / "war-read-done.md"

for _target, _kind, _tables in wc.READERS:  # import every reader's module now (see above)
    importlib.import_module(_target.rsplit(".", 2 if _kind == "method" else 1)[0])


def _defs(node):
    """The functions and classes directly under ``node`` (through ifs, loops, withs)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            yield child
        else:
            yield from _defs(child)


def _naming(lines: list, node, scope: list, found: set) -> None:
    """Add the dotted name of each function under ``node`` whose own lines (not those of the
    functions nested in it) name either table, as a search of the text finds them."""
    for child in _defs(node):
        inner = scope + [child.name]
        _naming(lines, child, inner, found)
        if isinstance(child, ast.ClassDef):
            continue
        own = set(range(child.lineno, child.end_lineno + 1))
        for nested in ast.walk(child):
            if nested is not child and isinstance(nested, (ast.FunctionDef, ast.AsyncFunctionDef)):
                own -= set(range(nested.lineno, nested.end_lineno + 1))
        if any(t in lines[i - 1] for i in own for t in TABLE_NAMES):
            found.add(".".join(inner))


def _functions_naming_the_tables() -> set[str]:
    """Dotted names of the functions whose own source lines name either table."""
    found = set()
    files = []
    for rel in SEARCHED:
        path = SGLANG / rel
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    for path in files:
        parts = path.relative_to(SGLANG).with_suffix("").parts
        module = "sglang." + ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        src = path.read_text()
        _naming(src.splitlines(), ast.parse(src), [module], found)
    return found


def test_every_reader_the_search_finds_is_hooked_or_explained():
    hooked = {target for target, _, _ in wc.READERS}
    assert not hooked & set(wc.NOT_HOOKED)
    found = _functions_naming_the_tables()
    assert found - hooked - set(wc.NOT_HOOKED) == set(), "a reader neither hooked nor explained"
    assert (hooked | set(wc.NOT_HOOKED)) - found == set(), "listed, but upstream has no such reader"


def test_the_page_lists_every_reader():
    text = DOC.read_text()
    for name in [t for t, _, _ in wc.READERS] + list(wc.NOT_HOOKED):
        short = ".".join(name.split(".")[-2:])
        assert f"`{short}`" in text, short


@pytest.fixture
def pool_world():
    with K.reference_world():
        wc.PUBLISHED.clear()
        wc.READS.clear()
        yield K.World(K.Step(prefill=[(58, 13)], decode=[], seed=5))
        wc.PUBLISHED.clear()
        wc.READS.clear()


class _Event:
    def record(self):
        pass


def _model_runner(world, pass_id=1):
    spec = SimpleNamespace(supports_prefill_shared_read_done=lambda: True)
    return SimpleNamespace(
        attn_backend=world.backend,
        spec_algorithm=spec,
        shared_read_done_event=None,
        forward_pass_id=pass_id,
    )


def _publish(model_runner):
    shared_read_event.maybe_publish_prefill_shared_read_done(
        model_runner, SharedReadEnds.PRE_REPLAY, SimpleNamespace(Event=_Event)
    )


def _violations():
    return counters.snapshot()["events"].get(wc.PATCH_ID, {}).get("violations", 0)


def _hooked(target: str):
    module, _, name = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name), False
    except ModuleNotFoundError:
        mod, cls = module.rsplit(".", 1)
        return getattr(getattr(importlib.import_module(mod), cls), name), True


def test_every_hooked_reader_raises_after_a_publish_before_it_reads(pool_world):
    """Called after the publish, each reader raises before its body runs (the arguments are
    not even valid for it: its body would fail otherwise)."""
    with installed((wc.PATCH,), ON):
        runner = _model_runner(pool_world)
        _publish(runner)
        assert wc.PUBLISHED.active() == "forward #1 (DeepseekV4AttnBackend)"
        before = _violations()
        for target, _kind, tables in wc.READERS:
            fn, is_method = _hooked(target)
            with pytest.raises(wc.WarSnapshotViolation) as e:
                fn(object(), "not an argument") if is_method else fn("not an argument")
            short = ".".join(target.split(".")[-2:])
            assert f"{short} read {tables} after forward #1" in str(e.value)
        assert _violations() == before + len(wc.READERS)


def test_a_read_on_another_stream_than_the_events_fails_the_publish(pool_world, monkeypatch):
    """A read issued before the publish on a side stream is not ordered by the event (recorded
    on the forward's stream): the publish raises, naming the reader and both streams. Reads on
    the event's stream pass, and a new forward or the barrier forgets the reads before it."""
    stream = {"now": "forward-stream"}
    monkeypatch.setattr(wc, "_current_stream", lambda: stream["now"])
    slots = torch.arange(4)
    with installed((wc.PATCH,), ON):
        pool = pool_world.pool
        pool.translate_loc_from_full_to_swa(slots)  # on the forward's stream
        runner = _model_runner(pool_world)
        _publish(runner)
        assert wc.PUBLISHED.active() is not None  # same stream: published and marked

        wc.before_war_barrier(None)
        stream["now"] = "side-stream"
        pool.translate_loc_from_full_to_swa(slots)
        stream["now"] = "forward-stream"
        runner = _model_runner(pool_world, pass_id=2)
        before = _violations()
        with pytest.raises(wc.WarSnapshotViolation) as e:
            _publish(runner)
        assert (
            "DeepSeekV4TokenToKVPool.translate_loc_from_full_to_swa read its table on stream "
            "side-stream, but forward #2 published the WAR read-done event on stream "
            "forward-stream, which does not order that read"
        ) in str(e.value)
        assert _violations() == before + 1 and wc.PUBLISHED.active() is None

        for forget in (wc.before_forward, wc.before_war_barrier):
            stream["now"] = "side-stream"
            pool.translate_loc_from_full_to_swa(slots)  # a previous forward's read
            forget(None)
            stream["now"] = "forward-stream"
            runner = _model_runner(pool_world, pass_id=3)
            _publish(runner)
            assert wc.PUBLISHED.active() == "forward #3 (DeepseekV4AttnBackend)"
            wc.before_war_barrier(None)


def test_the_new_forward_hook_is_model_runners_forward():
    hooks = {h.target: h for h in wc.PATCH.hooks}
    hook = hooks[f"{wc.MODEL_RUNNER}.forward"]
    assert hook.fn is wc.before_forward and hook.hook_type.name == "BEFORE"
