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
