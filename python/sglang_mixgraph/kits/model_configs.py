"""config.json files of small models that the CPU tests resolve server arguments for (no weights).

``write_model(directory, config, **overrides)`` writes one; ``DENSE_LLAMA``, the default, is a
small dense Llama, a model the graph configuration is not designed for (its resolution must stay
upstream's). Used by the CLI and graph-configuration tests.
"""

from __future__ import annotations

import json
from pathlib import Path

# A small dense Llama: a model the graph configuration is not designed for.
DENSE_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
}


def write_model(directory: Path, config: dict = DENSE_LLAMA, **overrides) -> Path:
    """`directory` (created) holding `config` with `overrides` as its config.json."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({**config, **overrides}))
    return directory


# DeepSeek-V3 (671B, block-128 FP8) as its public config.json gives it (no weights).
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_nextn_predict_layers": 1,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "n_group": 8,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 129280,
    "max_position_embeddings": 163840,
    "rope_theta": 10000,
    "rope_scaling": {
        "type": "yarn",
        "factor": 40,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "quantization_config": {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "weight_block_size": [128, 128],
        "activation_scheme": "dynamic",
    },
}

# gpt-oss-120b as its public config.json gives it: MXFP4 experts, attention and embeddings in
# bf16, alternating sliding and full attention layers (no weights).
GPT_OSS_120B = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_hidden_layers": 36,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "num_local_experts": 128,
    "num_experts_per_tok": 4,
    "experts_per_token": 4,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "sliding_window": 128,
    "attention_bias": True,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "swiglu_limit": 7.0,
    "initial_context_length": 4096,
    "max_position_embeddings": 131072,
    "rope_theta": 150000,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "original_max_position_embeddings": 4096,
        "truncate": False,
    },
    "rms_norm_eps": 1e-05,
    "router_aux_loss_coef": 0.9,
    "output_router_logits": False,
    "vocab_size": 201088,
    "eos_token_id": 200002,
    "pad_token_id": 199999,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "quantization_config": {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    },
}
