"""`plan --preset NAME`: the embedded reference deployments, each a config.json without weights.

``dsv4_pro`` (the default): ``data/dsv4_pro/config.json``, DeepSeek-V4-Pro-shaped, on 8 GPUs: tp 8
with attention DP over 8 ranks, MegaMoE, mixed chunk, 256 running requests and 2816 prefill
tokens per rank. SGLang takes both sizes globally and divides by the attention-DP size
(sglang.srt.arg_groups.parallel_hook `handle_data_parallelism`; `max_running_requests //
attn_dp_size` in sglang.srt.model_executor.pool_configurator), so they are given times 8.
``glm5``: ``data/glm5/config.json`` has GLM-5's shape from the public model card
(GlmMoeDsaForCausalLM, 78 layers, hidden 6144, MLA with q/kv LoRA 2048/512, DSA indexer 32 heads
x 128 with top-2048, 256 routed experts top-8 with one shared, block-128 FP8 weights), launched
on one 8-GPU node, tensor parallel, mixed chunked prefill. `plan` without --model-path plans a
preset with the user's server arguments applied on top.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

DATA = Path(__file__).parents[1] / "data"
DSV4_MODEL_DIR = DATA / "dsv4_pro"
GLM5_MODEL_DIR = DATA / "glm5"
MEGA_MOE_CAP_ENV = "SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK"


@dataclass(frozen=True)
class Preset:
    """One embedded deployment: its server arguments, the environment it is planned under (set
    only where the user has not set the variable) and a line that names it."""

    argv: list[str]
    description: str
    env: dict[str, str] = field(default_factory=dict)


REFERENCE_DP = 8
DSV4_PRO = Preset(
    argv=[
        "--model-path",
        str(DSV4_MODEL_DIR),
        "--tp",
        "8",
        "--attn-dp-size",
        str(REFERENCE_DP),
        "--enable-mixed-chunk",
        "--moe-a2a-backend",
        "megamoe",
        "--chunked-prefill-size",
        str(2816 * REFERENCE_DP),
        "--max-running-requests",
        str(256 * REFERENCE_DP),
    ],
    description="a DeepSeek-V4-Pro-shaped config.json, no weights",
    env={MEGA_MOE_CAP_ENV: "2816"},
)
GLM5 = Preset(
    argv=[
        "--model-path",
        str(GLM5_MODEL_DIR),
        "--tp",
        "8",
        "--enable-mixed-chunk",
        "--chunked-prefill-size",
        "8192",
        "--max-running-requests",
        "128",
    ],
    description="a GLM-5-shaped config.json (FP8, no weights) on one 8-GPU node, tp 8",
)
DEFAULT_PRESET = "dsv4_pro"
PRESETS = {DEFAULT_PRESET: DSV4_PRO, "glm5": GLM5}
