"""What `plan`'s memory line reads of a resolution besides its facts (planner/memory_fit.py).

The planner takes no server arguments; this reads them once into `memory_fit.MemoryInputs`:
SGLang's ModelConfig of the deployment, the checkpoint's quantization as SGLang resolved it,
whether its routed experts stay MXFP4 (`ModelConfig.is_fp4_experts`, unless
SGLANG_DSV4_FP4_DEQUANT makes them FP8 at load), and the chunk SGLang's memory settings sized
the activation reserve from when it was before the attention-DP division, and for DeepSeek-V4
SGLang's own sizing of its pool (`dsv4_kv_pool`). Call it where the target GPU is described
(`resolve.graph_plan_of`).
"""

from __future__ import annotations

from functools import partial

from sglang_mixgraph.planner.memory_fit import MemoryInputs
from sglang_mixgraph.resolution.dsv4_kv_pool import size_dsv4_pool


def chunk_before_dp_division(server_args) -> tuple[int, int] | None:
    """(the chunk SGLang's memory settings saw, the per-rank chunk) when mem_fraction_static
    was resolved by SGLang before the attention-DP division of the chunk, else None.

    `memory_hook.handle_gpu_memory_settings` sizes the activation reserve from the chunk;
    `parallel_hook.handle_data_parallelism` divides it by the attention-DP size afterwards. The
    order is upstream's record of its decisions (`overrides.declare_resolution`)."""
    chunk = getattr(server_args, "chunked_prefill_size", None)
    seen_memory = False
    for source, fields in getattr(server_args, "_resolved_overrides", None) or ():
        if source == "_handle_gpu_memory_settings" and "mem_fraction_static" in fields:
            seen_memory = True
        if "chunked_prefill_size" in fields:
            if source == "_handle_data_parallelism" and seen_memory and chunk:
                per_rank = fields["chunked_prefill_size"]
                return (chunk, per_rank) if per_rank and per_rank < chunk else None
            chunk = fields["chunked_prefill_size"]
    return None


def read_memory_inputs(server_args) -> MemoryInputs:
    from sglang.srt.arg_groups.overrides import model_config_of
    from sglang.srt.configs.model_config import is_deepseek_v4
    from sglang.srt.environ import envs

    mc = model_config_of(server_args)
    quant = dict(getattr(mc, "hf_quant_config", None) or {})
    dequantized = is_deepseek_v4(mc.hf_config) and envs.SGLANG_DSV4_FP4_DEQUANT.get()
    return MemoryInputs(
        model_config=mc,
        quant=quant,
        method=getattr(mc, "quantization", None) or quant.get("quant_method"),
        fp4_experts=bool(getattr(mc, "is_fp4_experts", False)) and not dequantized,
        chunks_before_dp=chunk_before_dp_division(server_args),
        kv_pool=partial(size_dsv4_pool, server_args, mc) if is_deepseek_v4(mc.hf_config) else None,
    )
