"""The DeepSeek-V4 KV tokens SGLang sizes from a byte budget: `plan`'s memory line for V4.

SGLang sizes the V4 pool with `pool_configurator.DSV4PoolConfigurator.calculate_pool_sizes`:
the budget less the request-scoped pools (c128 compress state per request slot, a capped SWA
pool), divided by the bytes one full-attention token costs (its c4 and c128 compressed rows,
the c4 indexer row, and `swa_full_tokens_ratio` of an SWA row with its c4 compress state),
page-aligned, less the pages the low-ratio caches reserve. That class reads the server
arguments through SGLang's runtime context and the model runner's `KVCacheConfigurator`, so
this publishes the resolved arguments for the call (restoring the context after) and hands it
the few configurator fields it reads. Nothing is allocated: it runs on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any


@dataclass(frozen=True)
class Dsv4Pool:
    """What SGLang would size on one GPU from a budget (`MemoryPoolConfig`'s token counts)."""

    full_tokens: int  # max_total_num_tokens: the full-attention (c4/c128) token capacity
    swa_tokens: int  # swa_max_total_num_tokens
    bytes_per_full_token: float  # the configurator's coefficient (SWA share included)


def _largest_stage(num_layers: int, pp_size: int) -> tuple[int, int]:
    """The pipeline stage with the most layers (`distributed.utils.get_pp_indices`): the one
    the memory line's weights figure charges."""
    from sglang.srt.distributed.utils import get_pp_indices

    stages = [get_pp_indices(num_layers, rank, pp_size) for rank in range(pp_size)]
    return max(stages, key=lambda s: s[1] - s[0])


def size_dsv4_pool(server_args, model_config, budget_bytes: int) -> Dsv4Pool:
    """SGLang's V4 pool sizes for `budget_bytes` of KV budget on one GPU, under the resolved
    `server_args` (ModelRunner's `init_kv_cache_configurator` fields, as it fills them)."""
    from sglang.srt.model_executor.pool_configurator import DSV4PoolConfigurator
    from sglang.srt.runtime_context import (
        get_context,
        get_model,
        get_parallel,
        get_schedule,
        get_spec,
    )
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    context = get_context()
    # upstream's scoped override saves and restores the whole published context
    scope = context.override_server_args()
    scope.install()
    try:
        context.set_server_args(server_args)
        pp = max(1, int(get_parallel().pp_size))
        start, end = _largest_stage(int(model_config.num_hidden_layers), pp)
        kvc: Any = SimpleNamespace(
            kv_cache_dtype_str=get_model().kv_cache_dtype,
            model_config=model_config,
            spec_algorithm=SpeculativeAlgorithm.from_string(get_spec().speculative_algorithm),
            spec_aux_config=SimpleNamespace(dspark_num_stages=None, dflash_draft_num_layers=None),
            layer_info=SimpleNamespace(start_layer=start, end_layer=end),
            pp_size=pp,
            pp_group=SimpleNamespace(rank_in_group=0),
            # `load_model_utils.resolve_sliding_window_size`: V4 is hybrid SWA
            sliding_window_size=model_config.sliding_window_size,
            page_size=get_schedule().page_size,
            attn_dp_size=get_parallel().attn_dp_size,
        )
        configurator = DSV4PoolConfigurator(kvc)
        config = configurator.calculate_pool_sizes(budget_bytes, kvc.page_size)
    finally:
        scope.restore()
    return Dsv4Pool(
        full_tokens=int(config.max_total_num_tokens),
        swa_tokens=int(config.swa_max_total_num_tokens),
        bytes_per_full_token=float(configurator.bytes_per_full_token),
    )
