#!/usr/bin/env python3
"""Write a tiny GLM-5 model directory: GLM-5's attention and DSA indexer, a tiny MoE, no weights.

    python3 tools/glm5/make_tiny_glm5.py OUT_DIR [--layers N]

OUT_DIR receives config.json (``GlmMoeDsaForCausalLM``); SGLang serves it with
``--load-format dummy`` (random bf16 weights) and ``skip_tokenizer_init`` (token ids in and out,
as the end-to-end harness and the step timing run it), so no tokenizer is written.

Every attention field comes from the GLM-5-shaped config.json this repository ships
(python/sglang_mixgraph/data/glm5/config.json): hidden 6144, 64 heads, MLA with q/kv LoRA
2048/512, DSA indexer 32 heads of 128 with top-2048. The MoE shrinks to 8 routed experts (top-2)
of width 256 plus one shared expert (sigmoid scores with a correction bias, the routing fields
SGLang reads but the embedded config leaves out), the first layer stays dense (width 256), and the
quantization block, the MTP layer and all but the first N layers go (bf16, N = 4 by default;
the step timing uses ``--layers 78``). Standard library only: runs on a bare GPU machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GLM5_CONFIG = REPO / "python" / "sglang_mixgraph" / "data" / "glm5" / "config.json"

# Taken from the GLM-5 config unchanged: attention, the DSA indexer, RoPE, vocabulary, norms.
ATTENTION_FIELDS = (
    "architectures",
    "model_type",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "index_topk",
    "index_n_heads",
    "index_head_dim",
    "vocab_size",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_parameters",
    "attention_bias",
    "tie_word_embeddings",
    "n_group",
    "topk_group",
    "norm_topk_prob",
    "routed_scaling_factor",
    "hidden_act",
)

# The tiny MoE: every layer after the first routes over 8 experts; the first is dense, as
# GLM-5's first three are, so both MLP kinds run.
TINY_MOE = {
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 256,
    "intermediate_size": 256,
    "first_k_dense_replace": 1,
}

# Routing fields SGLang's DeepSeek-V2 model (which serves GLM-5) reads as plain attributes
# (``DeepseekV2MoE``, ``_is_layer_sparse``) and transformers' GLM-5 config has no default for:
# DeepSeek-V3's sigmoid scores with a correction bias, every layer after the dense ones a MoE.
ROUTING = {"topk_method": "noaux_tc", "scoring_func": "sigmoid", "moe_layer_freq": 1}

OTHER = {"num_nextn_predict_layers": 0, "torch_dtype": "bfloat16"}

DEFAULT_LAYERS = 4


def tiny_config(layers: int = DEFAULT_LAYERS) -> dict:
    """The tiny GLM-5's config.json as a dict."""
    if layers < 2:
        raise ValueError(f"--layers {layers}: at least 2 (one dense layer, then MoE layers)")
    glm5 = json.loads(GLM5_CONFIG.read_text())
    missing = [k for k in ATTENTION_FIELDS if k not in glm5]
    if missing:
        raise ValueError(f"{GLM5_CONFIG} lacks {missing}")
    cfg = {k: glm5[k] for k in ATTENTION_FIELDS}
    cfg.update(TINY_MOE, num_hidden_layers=layers, **ROUTING, **OTHER)
    return cfg


def write(out_dir: Path, layers: int = DEFAULT_LAYERS) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "config.json"
    path.write_text(json.dumps(tiny_config(layers), indent=1) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--layers", type=int, default=DEFAULT_LAYERS, help="decoder layers (GLM-5: 78)")
    args = ap.parse_args(argv)
    try:
        path = write(args.out_dir, args.layers)
    except (ValueError, OSError) as e:
        print(f"make_tiny_glm5: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path} ({args.layers} layers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
