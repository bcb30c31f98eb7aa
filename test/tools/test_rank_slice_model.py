"""The one-rank slice model directory (tools/rank-slice/make_slice_model.py).

The generator runs on a bare GPU machine (standard library and `tokenizers` only) and writes a
config whose attention is DeepSeek-V4-Pro's (the embedded config) with a tiny MoE, plus a
synthetic tokenizer that SGLang's own loaders, its DeepSeek-V4 chat encoder, the random-id
benchmark dataset and the GSM8K prompts work with.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tool_scripts import load

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "rank-slice" / "make_slice_model.py"
PRO = json.loads((ROOT / "python/sglang_mixgraph/data/dsv4_pro/config.json").read_text())
VOCAB = 129280

# Everything of DeepSeek-V4-Pro's attention (and what shapes it: hidden size, RoPE, the
# hyper-connections, the vocabulary) that the slice keeps unchanged.
PRO_FIELDS = (
    "architectures",
    "model_type",
    "hidden_size",
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

GSM8K_LIKE = (
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as "
    "many clips in May. How many clips did Natalia sell altogether in April and May?\n"
    "Answer: Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether "
    "in April and May.\n#### 72\n\nQuestion: Weng earns $12 an hour for babysitting. "
    "Yesterday, she just did 50 minutes of babysitting. How much did she earn?\nAnswer:"
)

# Runs the generator as a user would, with SGLang, torch and transformers made unimportable.
BARE_RUN = textwrap.dedent(
    """
    import runpy, sys
    BLOCKED = {"sglang", "sglang_mixgraph", "torch", "transformers", "numpy"}
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"blocked on a bare machine: {name}")
    sys.meta_path.insert(0, Block())
    script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")
    """
)


def _bare_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BARE_RUN, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def slice_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rank_slice") / "dsv4_pro_slice"
    proc = _bare_run(str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "61 layers" in proc.stdout
    return out


@pytest.fixture(scope="module")
def config(slice_dir) -> dict:
    return json.loads((slice_dir / "config.json").read_text())


@pytest.fixture(scope="module")
def tokenizer(slice_dir):
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    return get_tokenizer(str(slice_dir))


# ----------------------------------------------------------------------------- config


def test_the_generator_runs_without_sglang_torch_or_transformers(slice_dir):
    written = {p.name for p in slice_dir.iterdir()}
    assert written == {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    }


def test_attention_is_deepseek_v4_pro(config):
    for field in PRO_FIELDS:
        assert config[field] == PRO[field], field
    assert config["num_hidden_layers"] == PRO["num_hidden_layers"] == 61
    assert config["compress_ratios"] == PRO["compress_ratios"][:61]
    # the shape the embedded config describes
    assert (config["hidden_size"], config["num_attention_heads"], config["head_dim"]) == (
        7168,
        128,
        512,
    )
    assert (config["qk_nope_head_dim"], config["qk_rope_head_dim"]) == (448, 64)
    assert (config["kv_lora_rank"], config["q_lora_rank"], config["o_lora_rank"]) == (
        512,
        1536,
        1024,
    )
    assert (config["o_groups"], config["sliding_window"], config["window_size"]) == (16, 128, 128)
    assert (config["index_topk"], config["index_n_heads"], config["index_head_dim"]) == (
        1024,
        64,
        128,
    )
    assert config["hc_mult"] == 4 and config["vocab_size"] == VOCAB
    assert config["rope_scaling"]["type"] == "yarn" and config["rope_scaling"]["factor"] == 16


def test_the_layer_mix_is_pro_s(config):
    ratios = config["compress_ratios"]
    assert len(ratios) == config["num_hidden_layers"] == 61
    assert (ratios.count(0), ratios.count(4), ratios.count(128)) == (2, 30, 29)


def test_the_moe_is_tiny_bf16_and_there_is_no_mtp_layer(config):
    assert config["n_routed_experts"] == 8 and config["num_experts_per_tok"] == 2
    assert config["moe_intermediate_size"] == 256 and config["n_shared_experts"] == 1
    assert config["n_group"] == config["topk_group"] == 1
    assert config["scoring_func"] == "sqrtsoftplus" and config["first_k_dense_replace"] == 0
    assert "quantization_config" not in config
    assert config["num_nextn_predict_layers"] == 0
    assert config["torch_dtype"] == "bfloat16"
    assert (config["bos_token_id"], config["eos_token_id"]) == (0, 1)


def test_sglang_loads_the_config_with_every_field_its_model_reads(slice_dir):
    from sglang.srt.utils.hf_transformers_utils import get_config

    hf = get_config(str(slice_dir), trust_remote_code=False)
    assert hf.architectures == ["DeepseekV4ForCausalLM"]
    # read as plain attributes by SGLang's DeepSeek-V4 layers; the DeepSeek-V3 config class
    # SGLang loads DeepSeek-V4 with has no defaults for them
    assert (hf.hc_sinkhorn_iters, hf.hc_eps, hf.hc_mult) == (20, 1e-6, 4)
    assert hf.q_head_norm is True and hf.hc_pre_from_prev_sublayer is False
    assert hf.compress_ratios == PRO["compress_ratios"][:61]
    assert (hf.n_group, hf.topk_group, hf.n_routed_experts) == (1, 1, 8)
    assert hf.scoring_func == "sqrtsoftplus" and hf.routed_scaling_factor == 1.5


def test_layers_keeps_the_first_n_layers_and_ratios():
    gen = load("make_slice_model")
    config = gen.build_config(gen.load_pro_config(), layers=5)
    assert config["num_hidden_layers"] == 5
    assert config["compress_ratios"] == PRO["compress_ratios"][:5] == [0, 0, 4, 128, 4]
    assert {k: config[k] for k in PRO_FIELDS} == {k: PRO[k] for k in PRO_FIELDS}


@pytest.mark.parametrize("layers", ["0", "62"])
def test_layers_outside_pro_s_are_refused(tmp_path, layers):
    proc = _bare_run(str(tmp_path / "out"), "--layers", layers)
    assert proc.returncode != 0
    assert "--layers must be between 1 and 61" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_the_transformers_self_check_passes(tmp_path):
    gen = load("make_slice_model")
    assert gen.main([str(tmp_path / "small"), "--layers", "4", "--check"]) == 0
    config = json.loads((tmp_path / "small" / "config.json").read_text())
    assert config["compress_ratios"] == [0, 0, 4, 128]


# ----------------------------------------------------------------------------- plan


def _plan(model: Path, *extra: str) -> dict:
    script = Path(sys.executable).with_name("sglang-mixgraph")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    proc = subprocess.run(
        [str(script), "plan", "--model-path", str(model), *extra, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


PLAN_ARGS = (
    "--tp",
    "1",
    "--enable-mixed-chunk",
    "--chunked-prefill-size",
    "2816",
    "--max-running-requests",
    "256",
    "--target-gpu",
    "H200",
)


@pytest.fixture(scope="module")
def plan(slice_dir) -> dict:
    return _plan(slice_dir, *PLAN_ARGS)


def test_plan_resolves_a_deepseek_v4_deployment_of_one_rank(plan):
    assert plan["assumed_gpu"]["name"] == "H200"
    assert plan["model_class_note"] is None
    assert plan["graph"]["model"] == ["DeepseekV4ForCausalLM"]
    assert plan["attention_backend"] == "dsv4"
    assert (
        plan["graph"]["deployment"]["tp_size"],
        plan["graph"]["deployment"]["attn_dp_size"],
        plan["graph"]["deployment"]["dp_attention"],
    ) == (1, 1, False)
    assert plan["graph"]["deployment"]["enable_mixed_chunk"] is True
    assert plan["graph"]["deployment"]["chunked_prefill_per_rank"] == 2816
    assert plan["graph"]["deployment"]["running_per_rank"] == 256


# Slow tier (about 10 s, a fresh process); the slice's plan runs in the fast tier.
@pytest.mark.slow
def test_plan_with_the_triton_moe_runner_the_readme_recommends(slice_dir, plan):
    # Without a quantization_config SGLang still assumes DeepSeek-V4's FP4 routed experts
    # and picks the MXFP4 runner on an H200; the bf16 slice needs Triton.
    assert plan["moe_runner_backend"] == "flashinfer_mxfp4"
    triton = _plan(slice_dir, *PLAN_ARGS, "--moe-runner-backend", "triton")
    assert triton["moe_runner_backend"] == "triton"
    assert triton["attention_backend"] == "dsv4"


# ----------------------------------------------------------------------------- tokenizer


def test_sglang_s_loader_gives_the_whole_vocabulary_with_config_s_bos_and_eos(tokenizer, config):
    from transformers import PreTrainedTokenizerFast

    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    assert len(tokenizer) == tokenizer.vocab_size == config["vocab_size"] == VOCAB
    assert tokenizer.bos_token_id == config["bos_token_id"]
    assert tokenizer.eos_token_id == config["eos_token_id"]
    assert tokenizer.model_max_length == config["max_position_embeddings"]


def test_gsm8k_text_round_trips(tokenizer):
    ids = tokenizer.encode(GSM8K_LIKE)
    assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1
    assert tokenizer.decode(ids, skip_special_tokens=True) == GSM8K_LIKE
    assert tokenizer.decode(ids[1:]) == GSM8K_LIKE
    # one token per character of ordinary text
    assert len(ids) == len(GSM8K_LIKE) + 1
    other = "Préférez-vous 3½ € ou “quotes” — naïve café 数学 🙂"
    assert tokenizer.decode(tokenizer.encode(other, add_special_tokens=False)) == other


def test_every_id_decodes_and_random_ids_keep_their_length(tokenizer):
    every = list(range(VOCAB))
    assert isinstance(tokenizer.decode(every), str)
    assert isinstance(tokenizer.decode(every, skip_special_tokens=True), str)
    rng = random.Random(0)
    ids = [rng.randrange(VOCAB) for _ in range(8192)]
    back = tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False)
    assert len(back) == len(ids)
    # only the 256 byte tokens can come back as another id (the character they spell)
    byte_ids = {tokenizer.convert_tokens_to_ids(f"<0x{b:02X}>") for b in range(256)}
    assert all(a == b or a in byte_ids for a, b in zip(ids, back, strict=True))


def test_the_random_ids_benchmark_dataset_sends_prompts_of_the_asked_length(tokenizer):
    from sglang.benchmark.datasets.random import sample_random_requests

    rows = sample_random_requests(
        input_len=1024,
        output_len=16,
        num_prompts=4,
        range_ratio=1.0,
        tokenizer=tokenizer,
        dataset_path="",
        random_sample=False,  # --dataset-name random-ids
        return_text=True,
    )
    for row in rows:
        # the server encodes the text again and adds BOS
        assert len(tokenizer.encode(row.prompt)) == row.prompt_len + 1 == 1024


def test_the_chat_template_renders_deepseek_v4_s_chat_layout(tokenizer):
    messages = [
        {"role": "system", "content": "Solve the problem."},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "5"},
        {"role": "user", "content": [{"type": "text", "text": "And 4 + 4?"}]},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<｜begin▁of▁sentence｜>Solve the problem.<｜User｜>What is 2 + 3?"
        "<｜Assistant｜></think>5<｜end▁of▁sentence｜><｜User｜>And 4 + 4?<｜Assistant｜></think>"
    )
    ids = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    assert tokenizer.decode(ids) == text and ids.count(tokenizer.bos_token_id) == 1


def test_sglang_s_deepseek_v4_chat_encoder_works_and_agrees_with_the_template(slice_dir, tokenizer):
    # /v1/chat/completions of a DeepseekV4 architecture goes through this encoder, not the
    # template (the GSM8K eval's default chat API included)
    from sglang.srt.entrypoints.openai.chat_encoding import (
        encode_simple_chat,
        resolve_chat_encoding_spec,
    )
    from sglang.srt.utils.hf_transformers_utils import get_config

    hf = get_config(str(slice_dir), trust_remote_code=False)
    spec = resolve_chat_encoding_spec(hf_config=hf, tokenizer=tokenizer)
    assert spec == "dsv4"
    messages = [
        {"role": "system", "content": "Solve the problem."},
        {"role": "user", "content": GSM8K_LIKE},
        {"role": "assistant", "content": "72"},
        {"role": "user", "content": "What is 2 + 3?"},
    ]
    ids = encode_simple_chat(tokenizer=tokenizer, spec=spec, messages=messages)
    assert ids == tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    # what the server encodes at start-up (thinking on, empty message)
    thinking = encode_simple_chat(
        tokenizer=tokenizer,
        spec=spec,
        messages=[{"role": "user", "content": ""}],
        thinking_mode="thinking",
    )
    assert tokenizer.decode(thinking).endswith("<｜User｜><｜Assistant｜><think>")


def test_every_special_token_of_deepseek_v4_s_prompt_format_is_in_the_vocabulary(
    tokenizer,
):
    import deepseek_recipe
    from sglang.srt.parser.deepseek_recipe_renderer import (
        IMAGE_TOKEN,
        TASK_TOKENS,
        DeepSeekRecipe,
    )

    spelled = deepseek_recipe.SpecialTokens(image=IMAGE_TOKEN)
    names = [n for n in dir(deepseek_recipe.SpecialToken) if n[0].isupper()]
    assert len(names) >= 18
    added = tokenizer.get_added_vocab()
    for name in names:
        assert spelled.token(getattr(deepseek_recipe.SpecialToken, name)) in added, name
    for token in TASK_TOKENS.values():
        assert token in added
    # a tool-call prompt needs the DSML token
    recipe = DeepSeekRecipe.from_hf_tokenizer("dsv4", tokenizer)
    tool = {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}}},
        },
    }
    ids = recipe.encode(
        {"messages": [{"role": "user", "content": "1+1?"}], "thinking": False, "tools": [tool]}
    )
    assert tokenizer.convert_tokens_to_ids("｜DSML｜") in ids
