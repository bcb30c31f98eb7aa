"""What the GPU drivers read of the bare-torch GPU machine's set-up (tools/gpu-upstream).

That folder is machine set-up, not a kit: ``device.sh`` puts its import shim on PYTHONPATH, and
the end-to-end and rank-slice drivers put ``engine/`` (stand-ins for the binary-only kernels an
Engine reaches, with its own ``sitecustomize``) first on the PYTHONPATH of the Engine processes
they start. What a driver's own process needs of it comes from here, not from ``sys.path``
edits: ``UPSTREAM_ENV``, upstream's own flags that select the kernels such a machine has;
``FAITHFUL_ENV``, the flags that select SGLang's real kernels where TileLang runs
(``KERNEL_ENV``/``KERNEL_ENGINE`` by selection name, ``KIT_KERNELS_ENV`` for the stand-ins);
``GLM5_ENV``/``GLM5_ENGINE``, the flags and Engine arguments that keep GLM-5's DSA path on
kernels the machine has; ``RADIX_CORE_ENV``, the flag that keeps the radix cache off its Rust core (built for another
torch); ``plugin_not_found()``, why an Engine started from this checkout would run without the
plugin (its entry point lives in the git-ignored egg-info, which a GPU call must carry); ``NO_MULTICAST_ENV``, the lent machines' rule that keeps NVLink multicast off in every
process; ``ENGINE_DIR``; ``engine_standins()``, that folder's module loaded from its file;
``attention_dp_engine_kwargs()``, the Engine arguments of N attention-DP ranks; and
``dp_rank_fields()`` / ``dp_step_fields()``, what the drivers' logs record of a process and of a
step under attention DP. The folder exists only in a checkout (``PYTHONPATH=python``), not in an
installed package.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

# The lent GPU machines' rule for every process started there: NVLink multicast off (NCCL's NVLS,
# torch symmetric memory and NVSHMEM), so multi-GPU runs never call cuMulticastCreate.
NO_MULTICAST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

UPSTREAM_ENV = {
    "SGLANG_DSV4_FP4_EXPERTS": "0",  # bf16 experts: the triton MoE runner, not flashinfer mxfp4
    "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH": "1",  # indexer logits in torch, not deep_gemm
    "SGLANG_OPT_DSV4_NONPAGED_INDEXER_MIN_QUERY_TOKENS": "1000000000",  # no deep_gemm fp8_mqa_logits
    "SGLANG_OPT_USE_TOPK_V2": "0",
    "SGLANG_OPT_USE_TILELANG_MHC_PRE": "0",  # mHC pre/post in torch + Triton, not TileLang
    "SGLANG_OPT_USE_TILELANG_MHC_POST": "0",
    "SGLANG_OPT_FUSE_MHC_POST_PRE": "0",  # the cross-layer fused post+pre is TileLang only
    "SGLANG_OPT_DEEPGEMM_HC_PRENORM": "0",  # hc prenorm GEMM in torch, not deep_gemm
}
# The "faithful" kernel selection: SGLang's real kernels wherever the GPU machine can run them
# (TileLang mHC pre/post and the fused post+pre, TileLang paged MQA logits, the JIT top-k v2;
# deep_gemm stays off everywhere: its hc prenorm GEMM, its FP8 GEMMs and wo_a einsum, its indexer
# metadata, which SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1 skips also when TileLang computes the
# logits). Needs TileLang on the machine (.gpu-tilelang); the Engine stand-ins follow
# KIT_KERNELS_ENV (JIT rmsnorm, Triton moe_sum_reduce, TileLang sinkhorn).
FAITHFUL_ENV = {
    "SGLANG_DSV4_FP4_EXPERTS": "0",  # the slice's experts are bf16 (or fp8): the Triton runner
    "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH": "1",  # skips deep_gemm's indexer metadata schedule
    "SGLANG_OPT_USE_TILELANG_INDEXER": "1",  # checked first: TileLang computes the logits
    "SGLANG_OPT_DSV4_NONPAGED_INDEXER": "0",  # deep_gemm.fp8_mqa_logits
    "SGLANG_OPT_USE_TOPK_V2": "1",
    "SGLANG_OPT_USE_TILELANG_MHC_PRE": "1",
    "SGLANG_OPT_USE_TILELANG_MHC_POST": "1",
    "SGLANG_OPT_FUSE_MHC_POST_PRE": "1",
    "SGLANG_OPT_DEEPGEMM_HC_PRENORM": "0",  # TileLang's prenorm GEMM instead
    "SGLANG_OPT_USE_FLASHINFER_MHC": "0",
    "SGLANG_ENABLE_JIT_DEEPGEMM": "0",  # FP8 block GEMMs on upstream's Triton kernel
    "SGLANG_OPT_FP8_WO_A_GEMM": "0",  # wo_a in bf16 (its FP8 form is deep_gemm.fp8_einsum only)
}
# Engine arguments of each selection: the JIT top-k (``sgl-kernel`` runs SGLang's JIT kernel on
# CUDA) or upstream's torch top-k; FP8 block GEMMs (an FP8 slice) on upstream's Triton GEMM.
KERNEL_ENGINE = {
    "standin": {"dsa_topk_backend": "torch"},
    "faithful": {"dsa_topk_backend": "sgl-kernel", "fp8_gemm_runner_backend": "triton"},
}
KERNEL_ENV = {"standin": UPSTREAM_ENV, "faithful": FAITHFUL_ENV}

# GLM-5 (``GlmMoeDsaForCausalLM``: DeepSeek-V2's MLA with the DSA indexer) on such a machine. The
# indexer's logits in torch instead of deep_gemm (``fp8_mqa_logits`` in prefill and
# ``fp8_paged_mqa_logits`` in decode, one switch for both: ``dsa/utils._use_torch_mqa_logits``);
# the top-k unfused, since the fused transform exists only in sgl_kernel and FlashInfer
# (``DSATopKBackend.topk_transform`` raises for torch); no top-k v2 (JIT, sgl-kernel backend only).
GLM5_ENV = {
    "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH": "1",
    "SGLANG_DSA_FUSE_TOPK": "0",
    "SGLANG_OPT_USE_TOPK_V2": "0",
    "SGLANG_ENABLE_JIT_DEEPGEMM": "0",  # the tiny model is bf16: no FP8 GEMM should want it
    # Eager extends up to this many keys would run dense MHA (``set_dsa_prefill_impl``: FA3 and
    # sgl_kernel.concat_mla_k) where a graph replay runs MLA; 0 keeps every prefill on MLA.
    "SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD": "0",
}
# Engine arguments of GLM-5 there: upstream's torch top-k; FlashMLA's sparse kernel (the
# sgl_flash_mla wheel loads on the machine's torch) for prefill and decode, since on SM90 with a
# bf16 KV cache SGLang picks FA3 for decode (``_dsa_split_backend_resolution``), which comes from
# sgl_kernel or a download; the bf16 KV cache SGLang picks on SM9x anyway, said explicitly.
GLM5_ENGINE = {
    "dsa_topk_backend": "torch",
    "dsa_prefill_backend": "flashmla_sparse",
    "dsa_decode_backend": "flashmla_sparse",
    "kv_cache_dtype": "bfloat16",
}
KIT_KERNELS_ENV = "MIXGRAPH_KIT_KERNELS"  # read by engine_standins in every Engine process
# An FP8 slice's block-128 linears: "torch" puts them on torch's block-scaled scaled_mm
# (engine_standins.torch_block_fp8_linear), else SGLang's own choice (its Triton GEMM here).
KIT_FP8_GEMM_ENV = "MIXGRAPH_KIT_FP8_GEMM"
RADIX_CORE_ENV = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"

CHECKOUT = Path(__file__).resolve().parents[3]
ENGINE_DIR = CHECKOUT / "tools" / "gpu-upstream" / "engine"
ENGINE_STANDINS = "engine_standins"  # the name the Engine processes import it by


def engine_standins() -> ModuleType:
    """``tools/gpu-upstream/engine/engine_standins.py``, imported from its file under the name the
    Engine processes use; the same module on every call. Its ``install()`` needs the shim on
    PYTHONPATH (``device.sh`` puts it there)."""
    if ENGINE_STANDINS in sys.modules:
        return sys.modules[ENGINE_STANDINS]
    path = ENGINE_DIR / f"{ENGINE_STANDINS}.py"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: the GPU machine's set-up is in a checkout of this repository; "
            "import sglang_mixgraph from its python/ folder (PYTHONPATH=python)"
        )
    spec = importlib.util.spec_from_file_location(ENGINE_STANDINS, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[ENGINE_STANDINS] = module
    spec.loader.exec_module(module)
    return module


def plugin_not_found() -> str | None:
    """None when SGLang's plugin loader would find this plugin's entry point from here, else a
    one-line reason. The entry point is in ``python/sglang_mixgraph.egg-info`` (written by
    ``pip install -e .`` and git-ignored): a GPU call that does not carry it runs every arm as
    SGLang alone, and nothing in the Engine's log says so."""
    from importlib.metadata import entry_points

    from sglang_mixgraph.resolution.resolve import PLUGIN_GROUP, PLUGIN_NAME

    if any(ep.name == PLUGIN_NAME for ep in entry_points(group=PLUGIN_GROUP)):
        return None
    egg = CHECKOUT / "python" / "sglang_mixgraph.egg-info"
    return (
        f"SGLang would not load the plugin: no entry point {PLUGIN_NAME!r} (group "
        f"{PLUGIN_GROUP}) on this machine; carry {egg.relative_to(CHECKOUT)} "
        f"(written by pip install -e .)"
    )


def attention_dp_engine_kwargs(dp: int, chunk: int, running: int) -> dict:
    """``sglang.Engine`` arguments for ``dp`` attention-DP ranks on as many GPUs (tp = dp, as
    the reference deployment), each rank with ``chunk`` and ``running``: SGLang divides the
    chunked prefill and the running requests among the ranks. {} at one rank.
    ``attn_dp_size`` is 0.5.23's name for ``--dp-size N --enable-dp-attention``."""
    if dp <= 1:
        return {}
    return dict(
        tp_size=dp,
        attn_dp_size=dp,
        chunked_prefill_size=chunk * dp,
        max_running_requests=running * dp,
    )


def dp_rank_fields() -> dict:
    """This process's attention-DP rank (``{"dp_rank": r}``, upstream's
    ``get_parallel().attn_dp_rank``) when attention DP is on, else {}."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    return {"dp_rank": int(parallel.attn_dp_rank)} if parallel.attn_dp_enabled else {}


def dp_step_fields(forward_batch) -> dict:
    """The rank and the synced per-rank token counts of a step under attention DP
    (``get_parallel().attn_dp_rank``, ``ForwardBatch.global_num_tokens_cpu``), else {}."""
    counts = getattr(forward_batch, "global_num_tokens_cpu", None)
    if counts is None or len(counts) <= 1:
        return {}
    from sglang.srt.runtime_context import get_parallel

    return {
        "dp_rank": int(get_parallel().attn_dp_rank),
        "global_tokens": [int(x) for x in counts],
    }
