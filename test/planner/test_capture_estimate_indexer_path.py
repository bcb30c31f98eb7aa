"""The capture estimate counts the c4 indexer's per-head torch logits only where SGLang computes
them in torch.

SGLang's DeepSeek-V4 indexer (`C4IndexerBackendMixin.forward_c4_indexer`) takes the first of FP4
DeepGEMM, TileLang, AITER and torch; SGLang's SM120 defaults and the project's GPU machine set
both TileLang and the torch switch, and TileLang runs. Counting the torch logits there made the
estimate of a one-rank DeepSeek-V4 on an H100 15.4 GiB for 10 buckets where SGLang's own capture
of 45 buckets took 4.53 GiB, and switched the `auto` graph off with the memory to spare.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

import sglang_mixgraph
from sglang_mixgraph.core.capture_memory import ACTIVATION_BYTES_PER_TOKEN
from sglang_mixgraph.planner.deployment_facts import read_deployment
from sglang_mixgraph.resolution.resolve import resolve
from sglang_mixgraph.target_gpu import described_gpu

DSV4 = str(Path(sglang_mixgraph.__file__).parent / "data" / "dsv4_pro")
# One rank of the reference deployment on one GPU, as the project's slice runs it.
ONE_RANK = [
    "--model-path",
    DSV4,
    "--tp",
    "1",
    "--enable-mixed-chunk",
    "--chunked-prefill-size",
    "2816",
    "--max-running-requests",
    "256",
    "--context-length",
    "8192",
    "--mem-fraction-static",
    "0.75",
]
PATH_FLAGS = (
    "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH",
    "SGLANG_OPT_USE_TILELANG_INDEXER",
    "SGLANG_OPT_USE_AITER_INDEXER",
)


@pytest.fixture
def indexer_flags(monkeypatch):
    monkeypatch.setenv("SGLANG_MIXGRAPH_PREFILL_BUCKETS", "auto")
    for name in PATH_FLAGS:
        monkeypatch.delenv(name, raising=False)

    def set_(*names, argv=(), gpu="H100"):
        for name in PATH_FLAGS:
            if name in names:
                monkeypatch.setenv(name, "1")
            else:
                monkeypatch.delenv(name, raising=False)
        resolution = resolve([*ONE_RANK, *argv], gpu=gpu)
        with described_gpu(gpu):
            return resolution, read_deployment(resolution.server_args).shape.sparse

    return set_


FP4_INDEXER = ("--enable-deepseek-v4-fp4-indexer",)  # SGLang allows it from SM100 on


@pytest.mark.parametrize(
    "flags, argv, gpu, in_torch",
    [
        ((), (), "H100", False),  # DeepGEMM's kernel
        (("SGLANG_FP8_PAGED_MQA_LOGITS_TORCH",), (), "H100", True),
        (
            ("SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", "SGLANG_OPT_USE_TILELANG_INDEXER"),
            (),
            "H100",
            False,
        ),
        (("SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", "SGLANG_OPT_USE_AITER_INDEXER"), (), "H100", False),
        (("SGLANG_FP8_PAGED_MQA_LOGITS_TORCH",), (), "B300", True),
        (("SGLANG_FP8_PAGED_MQA_LOGITS_TORCH",), FP4_INDEXER, "B300", False),
    ],
)
def test_torch_logits_only_where_the_torch_path_runs(indexer_flags, flags, argv, gpu, in_torch):
    _, sparse = indexer_flags(*flags, argv=argv, gpu=gpu)
    assert sparse.torch_logits is in_torch
    assert (sparse.torch_logits_peak_bytes_per_token() > 0) is in_torch


def _kernel_choice_order() -> list[str]:
    """The env switches `forward_c4_indexer` tests, in the order its if/elif chain tests them."""
    from sglang.srt.layers.attention.dsv4.indexer import C4IndexerBackendMixin

    tree = ast.parse(textwrap.dedent(inspect.getsource(C4IndexerBackendMixin.forward_c4_indexer)))
    order = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            chain = node
            while isinstance(chain, ast.If):
                names = [
                    n.attr
                    for n in ast.walk(chain.test)
                    if isinstance(n, ast.Attribute) and n.attr in PATH_FLAGS
                ]
                if any(isinstance(n, ast.ImportFrom) for n in ast.walk(chain)) and names:
                    order += [n for n in names if n not in order]
                chain = chain.orelse[0] if len(chain.orelse) == 1 else None
            if order:
                return order
    return order


def test_upstream_tests_tilelang_and_aiter_before_torch():
    """The rule above holds only while upstream picks TileLang and AITER before torch."""
    assert _kernel_choice_order() == list(PATH_FLAGS[1:]) + [PATH_FLAGS[0]]


def test_one_rank_on_an_h100_keeps_the_auto_graph_with_tilelang_logits(indexer_flags):
    """With TileLang's logits the estimate is the pool's activations plus small terms and fits;
    with torch's it is refused, and the refusal names what dominated and how to force it."""
    kept, sparse = indexer_flags(
        "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", "SGLANG_OPT_USE_TILELANG_INDEXER"
    )
    assert not sparse.torch_logits
    said = [
        m
        for m in kept.messages("sglang_mixgraph")
        if "CUDA graph kept on" in m or "CUDA graph disabled" in m
    ]
    assert len(said) == 1 and "kept on" in said[0], said
    refused, in_torch = indexer_flags("SGLANG_FP8_PAGED_MQA_LOGITS_TORCH")
    said = [
        m
        for m in refused.messages("sglang_mixgraph")
        if "CUDA graph kept on" in m or "CUDA graph disabled" in m
    ]
    assert len(said) == 1 and "disabled" in said[0], said
    pool = 2816 * ACTIVATION_BYTES_PER_TOKEN
    peak = pool + 2816 * in_torch.torch_logits_peak_bytes_per_token()
    assert f"{peak / (1 << 30):.1f} GiB the largest bucket's activations" in said[0]
    assert said[0].rstrip(".").endswith("or capture anyway with SGLANG_EXPERIMENTAL_FORCE_BCG=1")
