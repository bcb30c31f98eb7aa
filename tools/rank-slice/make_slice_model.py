#!/usr/bin/env python3
"""Write the one-rank slice model directory: DeepSeek-V4-Pro's attention, a tiny MoE, no weights.

    python3 tools/rank-slice/make_slice_model.py OUT_DIR [--layers N] [--check]

OUT_DIR receives config.json, generation_config.json, tokenizer.json and tokenizer_config.json
(with a chat template). SGLang serves it with `--load-format dummy` (random bf16 weights).

Every attention field is read at run time from the DeepSeek-V4-Pro-shaped config.json this
repository ships (python/sglang_mixgraph/data/dsv4_pro/config.json), so the slice follows that
file. The MoE is shrunk to 8 routed experts (top-2) of width 256 plus one shared expert; there
is no quantization_config (bf16) and no MTP layer. `--layers N` keeps the first N layers and
the first N compress ratios.

The tokenizer is synthetic and covers the model's whole vocabulary (129,280 ids): a
character-level BPE with no merges and byte fallback. Any text encodes (a character outside the
table becomes its UTF-8 bytes) and decodes back unchanged, and every id decodes without error
to text that encodes back to one token, so random-id prompts keep their length. It carries
DeepSeek-V4's special tokens (BOS, EOS, User, Assistant, think, DSML, ...), which SGLang's
DeepSeek-V4 chat encoder needs.

Needs only the standard library and `tokenizers` (no SGLang, no torch), so it runs on a bare
GPU machine. `--check` also loads the result with `transformers` and checks it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRO_CONFIG = REPO / "python" / "sglang_mixgraph" / "data" / "dsv4_pro" / "config.json"

# Taken from DeepSeek-V4-Pro's config unchanged (num_hidden_layers and compress_ratios follow
# --layers). Everything about attention, the hyper-connections, RoPE and the vocabulary.
ATTENTION_FIELDS = (
    "architectures",
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "kv_lora_rank",
    "q_lora_rank",
    "o_lora_rank",
    "o_groups",
    "sliding_window",
    "compress_ratios",
    "compress_rope_theta",
    "index_topk",
    "index_n_heads",
    "index_head_dim",
    "vocab_size",
    "max_position_embeddings",
    "rope_theta",
    "rope_scaling",
    "hc_mult",
)

# DeepSeek-V4 fields the Pro config leaves to the model's defaults but SGLang's DeepSeek-V4
# model reads as plain attributes (SGLang loads the config as a DeepSeek-V3 config, which has
# no such defaults). Values are DeepSeek-V4's defaults; a value in the Pro config wins.
V4_DEFAULTS = {
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "hc_pre_from_prev_sublayer": False,
    "q_head_norm": True,
}

# The tiny MoE. DeepSeek-V4 routes every token over all experts with sqrtsoftplus scores (no
# group limit): n_group = topk_group = 1 keeps SGLang's grouped fields consistent with that.
# first_k_dense_replace 0: every layer is a MoE layer, as in DeepSeek-V4.
TINY_MOE = {
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 256,
    "intermediate_size": 256,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sqrtsoftplus",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "first_k_dense_replace": 0,
    "moe_layer_freq": 1,
    "ep_size": 1,
    "hidden_act": "silu",
}

OTHER = {
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
    "use_cache": True,
    "num_nextn_predict_layers": 0,
    "torch_dtype": "bfloat16",
}

# ----------------------------------------------------------------------------- tokenizer

BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
THINK_START, THINK_END = "<think>", "</think>"
# Special tokens of DeepSeek-V4's prompt format: the chat roles, the DSML tool-call marker,
# the image placeholder and the grounding tags, and the quick-instruction task tokens. The
# think tokens are not special (they stay in decoded text, for reasoning parsers).
CHAT_SPECIALS = (
    "<｜System｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜latest_reminder｜>",
    "｜DSML｜",
    "<｜deepseek_image｜>",
    "<｜image｜>",
    "<｜ref｜>",
    "<｜/ref｜>",
    "<｜box｜>",
    "<｜/box｜>",
    "<｜point｜>",
    "<｜/point｜>",
    "<｜polygon｜>",
    "<｜/polygon｜>",
    "<｜action｜>",
    "<｜query｜>",
    "<｜authority｜>",
    "<｜domain｜>",
    "<｜title｜>",
    "<｜read_url｜>",
)

# Single characters that get a token of their own, in id order, until the vocabulary is full:
# ASCII, Latin, punctuation, currency, the replacement character, then CJK, Hangul and the
# supplementary private-use planes as filler. Characters not listed encode as UTF-8 bytes.
CHAR_RANGES = (
    (0x09, 0x0A),
    (0x0D, 0x0D),
    (0x20, 0x7E),
    (0xA0, 0x17F),
    (0x2010, 0x2027),
    (0x2030, 0x205E),
    (0x20A0, 0x20C0),
    (0xFFFD, 0xFFFD),
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0xAC00, 0xD7A3),
    (0xF0000, 0xFFFFD),
    (0x100000, 0x10FFFD),
)

CHAT_TEMPLATE = (
    "{%- macro text(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content -%}{%- for part in content -%}"
    "{%- if part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] in ('system', 'developer') -%}{{ text(message['content']) }}"
    "{%- elif message['role'] == 'user' -%}<｜User｜>{{ text(message['content']) }}"
    "{%- elif message['role'] == 'assistant' -%}"
    "<｜Assistant｜></think>{{ text(message['content']) }}<｜end▁of▁sentence｜>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "<｜Assistant｜>{{ '<think>' if thinking is defined and thinking else '</think>' }}"
    "{%- endif -%}"
)


def _token_chars():
    for first, last in CHAR_RANGES:
        for code in range(first, last + 1):
            yield chr(code)


def build_vocab(vocab_size: int) -> dict[str, int]:
    """Token -> id for ids 0 .. vocab_size-1: BOS, EOS, PAD, 256 byte tokens, the chat
    specials, the think tokens, then single characters."""
    tokens = [BOS, EOS, PAD]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    tokens += [*CHAT_SPECIALS, THINK_START, THINK_END]
    if vocab_size < len(tokens) + 128:
        raise SystemExit(f"vocab_size {vocab_size} is too small for the synthetic tokenizer")
    tokens += itertools.islice(_token_chars(), vocab_size - len(tokens))
    _expect(len(tokens) == vocab_size, f"the character table fills {vocab_size} ids")
    vocab = {token: i for i, token in enumerate(tokens)}
    _expect(len(vocab) == vocab_size, "every token string is unique")
    return vocab


def build_tokenizer(vocab_size: int):
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    vocab = build_vocab(vocab_size)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True))
    # No normalizer and no pre-tokenizer: the text is split into characters as it is.
    tokenizer.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in (BOS, EOS, PAD, *CHAT_SPECIALS)]
    )
    tokenizer.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t in (THINK_START, THINK_END)]
    )
    # Like DeepSeek's tokenizers: BOS in front of every encoded text, no EOS.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return tokenizer


# ----------------------------------------------------------------------------- config


def load_pro_config(path: Path = PRO_CONFIG) -> dict:
    return json.loads(path.read_text())


# Pro's checkpoint format for its dense projections: FP8 e4m3 weights in 128 x 128 blocks, each
# with its scale, activations quantized per token group of 128 at run time.
FP8_BLOCK_QUANT = {
    "quant_method": "fp8",
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "weight_block_size": [128, 128],
}


def build_config(pro: dict, layers: int | None = None, fp8: bool = False) -> dict:
    """The slice's config.json content from DeepSeek-V4-Pro's config; ``fp8`` gives it Pro's
    block-128 FP8 ``quantization_config``."""
    missing = [k for k in ATTENTION_FIELDS if k not in pro]
    if missing:
        raise SystemExit(f"{PRO_CONFIG} lacks {', '.join(missing)}")
    total = pro["num_hidden_layers"]
    n = total if layers is None else layers
    if not 1 <= n <= total:
        raise SystemExit(f"--layers must be between 1 and {total} (DeepSeek-V4-Pro's layers)")
    config = {k: pro[k] for k in ATTENTION_FIELDS}
    config["num_hidden_layers"] = n
    # Pro's list has one more entry, for its MTP layer; the slice has no MTP layer.
    config["compress_ratios"] = list(pro["compress_ratios"][:n])
    if len(config["compress_ratios"]) != n:
        raise SystemExit(f"{PRO_CONFIG} has fewer compress_ratios than layers")
    # SGLang's DeepSeek-V4 code reads the window under both names.
    config["window_size"] = pro["sliding_window"]
    for key, default in V4_DEFAULTS.items():
        config[key] = pro.get(key, default)
    config.update(TINY_MOE)
    config.update(OTHER)
    config["bos_token_id"] = 0
    config["eos_token_id"] = 1
    if fp8:
        config["quantization_config"] = dict(FP8_BLOCK_QUANT)
    return config


def layer_mix(config: dict) -> dict[int, int]:
    """compress ratio -> number of layers (0: sliding window only, 4: c4, 128: c128)."""
    mix: dict[int, int] = {}
    for ratio in config["compress_ratios"]:
        mix[ratio] = mix.get(ratio, 0) + 1
    return dict(sorted(mix.items()))


# ----------------------------------------------------------------------------- writing


def write_model(out_dir: Path, layers: int | None = None, fp8: bool = False) -> dict:
    config = build_config(load_pro_config(), layers, fp8)
    tokenizer = build_tokenizer(config["vocab_size"])
    bos, eos = (
        tokenizer.id_to_token(config["bos_token_id"]),
        tokenizer.id_to_token(config["eos_token_id"]),
    )
    _expect((bos, eos) == (BOS, EOS), f"ids of BOS/EOS in config.json spell {bos!r}/{eos!r}")
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_json(out_dir / "config.json", config)
    _write_json(
        out_dir / "generation_config.json",
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]},
    )
    tokenizer.save(str(out_dir / "tokenizer.json"))
    _write_json(
        out_dir / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOS,
            "pad_token": PAD,
            "unk_token": None,
            "add_bos_token": True,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": config["max_position_embeddings"],
            "chat_template": CHAT_TEMPLATE,
        },
    )
    return config


def _expect(condition: bool, what: str) -> None:
    if not condition:
        raise SystemExit(f"make_slice_model.py: check failed: {what}")


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


SAMPLE = (
    "Question: Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning "
    "and bakes muffins for her friends every day with 4. She sells the remainder at the "
    "farmers' market daily for $2 per fresh duck egg. How much in dollars does she make "
    "every day at the farmers' market?\nAnswer: 16 - 3 - 4 = 9; 9 * 2 = 18.\n\n"
)


def check_tokenizers(out_dir: Path, vocab_size: int) -> None:
    """Round trip and decoding of every id with the `tokenizers` library alone."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    _expect(tok.get_vocab_size(with_added_tokens=True) == vocab_size, "vocabulary size")
    ids = tok.encode(SAMPLE).ids
    _expect(ids[0] == 0, "encoded text starts with BOS")
    _expect(tok.decode(ids) == SAMPLE, "text -> ids -> text gives the text back")
    every = list(range(vocab_size))
    tok.decode(every, skip_special_tokens=False)
    tok.decode(every, skip_special_tokens=True)


def check_transformers(out_dir: Path, config: dict) -> None:
    """The directory as `transformers` loads it (what SGLang's loaders build on)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out_dir), clean_up_tokenization_spaces=False)
    _expect(len(tok) == config["vocab_size"], f"transformers sees {len(tok)} tokens")
    _expect(
        (tok.bos_token_id, tok.eos_token_id) == (config["bos_token_id"], config["eos_token_id"]),
        "transformers' BOS/EOS ids equal config.json's",
    )
    ids = tok.encode(SAMPLE)
    _expect(ids[0] == tok.bos_token_id, "transformers adds BOS")
    _expect(tok.decode(ids, skip_special_tokens=True) == SAMPLE, "transformers round trip")
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], tokenize=False, add_generation_prompt=True
    )
    expected = f"{BOS}<｜User｜>What is 2 + 3?<｜Assistant｜></think>"
    _expect(prompt == expected, f"chat template renders {prompt!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="make_slice_model.py",
        description="Write the one-rank slice model directory (config.json and a tokenizer).",
    )
    parser.add_argument("out_dir", type=Path, help="directory to write (created if missing)")
    parser.add_argument(
        "--layers", type=int, help="keep the first N layers (default: all of DeepSeek-V4-Pro's)"
    )
    parser.add_argument(
        "--fp8",
        action="store_true",
        help="Pro's block-128 FP8 quantization_config (SGLang fills dummy FP8 weights)",
    )
    parser.add_argument(
        "--check", action="store_true", help="also load the result with transformers and check it"
    )
    args = parser.parse_args(argv)
    config = write_model(args.out_dir, args.layers, args.fp8)
    check_tokenizers(args.out_dir, config["vocab_size"])
    if args.check:
        check_transformers(args.out_dir, config)
    mix = ", ".join(f"{count} x c{ratio}" for ratio, count in layer_mix(config).items())
    print(
        f"{args.out_dir}: DeepSeek-V4-Pro attention, {config['num_hidden_layers']} layers "
        f"({mix}; c0 = sliding window only), MoE {config['n_routed_experts']} experts "
        f"top-{config['num_experts_per_tok']} of {config['moe_intermediate_size']} + "
        f"{config['n_shared_experts']} shared, vocab {config['vocab_size']}, "
        f"{'fp8 block-128' if args.fp8 else 'bf16'}, no MTP"
        + ("; checked with transformers" if args.check else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
