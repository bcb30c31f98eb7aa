"""What `plan` checks before SGLang resolves anything, so that a user's mistake gives one line
naming it instead of a traceback, a usage screen or a silent default.

- `prepare_argv`: parses the server arguments with SGLang's own argument definitions first
  (unknown option, bad value), applies them on top of a reference deployment when no
  `--model-path` is given, refuses sizes that would make SGLang build enormous CUDA-graph
  size lists (`MAX_PLAN_SIZE`, `MAX_PLAN_LIST`), a parallel size below 1, a `--model-path`
  that does not exist or is a file other than a GGUF model (the config.json itself), a
  config.json that is not a JSON object and a DeepSeek-V4 `compress_ratios` whose length
  matches no layer count (`_check_config_json`);
- `invalid_environment`: SGLang variables whose value SGLang would ignore with a warning;
- `quiet_import_warnings`: SGLang's import-time warnings about this machine, hidden.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Ceilings on what `plan` accepts. SGLang builds a prefill CUDA-graph size list with one entry
# per 512 tokens up to the chunked prefill size or --cuda-graph-max-bs-prefill
# (sglang.srt.arg_groups.cuda_graph_hook `generate_prefill_cuda_graph_batch_sizes`), and a
# decode list up to --cuda-graph-max-bs-decode (one entry per size with
# --disable-cuda-graph-padding); 10^11 tokens is a list of 195 million entries. No deployment
# captures graphs anywhere near these sizes.
MAX_PLAN_SIZE = 1 << 21  # 2,097,152 tokens (or requests) per size
MAX_PLAN_LIST = 8192  # entries in an explicit size list
_SIZE_DESTS = ("chunked_prefill_size", "cuda_graph_max_bs_prefill", "cuda_graph_max_bs_decode")
_LIST_DESTS = ("cuda_graph_bs_prefill", "cuda_graph_bs_decode")
# Numbers of ranks or nodes. SGLang's parser takes any int and its resolution checks only some of
# them (parallel_hook `handle_data_parallelism` refuses --attn-dp-size 0), so --tp 0 used to
# plan as a deployment that launch_server cannot start.
_PARALLEL_DESTS = (
    "nnodes",
    "tp_size",
    "pp_size",
    "dp_size",
    "attn_dp_size",
    "attn_cp_size",
    "dcp_size",
    "moe_dp_size",
    "ep_size",
    "dwdp_size",
    "moe_dense_tp_size",
    "shared_experts_tp_size",
)


class PlanInputError(ValueError):
    """An input `plan` cannot plan (server arguments, environment, files); the message is one line."""

    exit_code = 1


class ServerArgumentError(PlanInputError):
    """SGLang's argument parser rejects the server arguments (argparse's exit code)."""

    exit_code = 2


@contextlib.contextmanager
def quiet_import_warnings() -> Iterator[None]:
    """Hide what SGLang's layer and kernel modules warn at import about the machine we run on.

    On a machine without a GPU they warn that a quantization method or Triton is not supported
    (for example sglang.srt.layers.quantization.awq at import) or that the CUDA architecture is
    unknown (sglang.kernels.jit.utils.arch); that is about this machine, not the described GPU.
    """
    kernels = logging.getLogger("sglang.kernels")  # "Cannot detect CUDA architecture." at import
    level = kernels.level
    kernels.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", category=UserWarning, module=r"sglang\.(srt\.layers|kernels|jit_kernel)\."
            )
            yield
    finally:
        kernels.setLevel(level)


# ---------------------------------------------------------------- server arguments


@contextlib.contextmanager
def _silenced(logger: logging.Logger) -> Iterator[None]:
    """Hide what one SGLang logger says while `plan` says it in its own one line.

    `ConfigArgumentMerger._parse_yaml_config` (sglang.srt.utils.server_args_config_parser) logs
    "Failed to read config file ..." with the YAML error, four lines for a malformed file, then
    raises the same error, which `prepare_argv` reports."""
    disabled = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = disabled


class _RaisingParser(argparse.ArgumentParser):
    """SGLang's argument parser, raising instead of printing its usage screen and exiting."""

    def error(self, message: str):
        raise ServerArgumentError(" ".join(message.split()))


def sglang_parser() -> argparse.ArgumentParser:
    """SGLang's server argument parser (`ServerArgs.add_cli_args`), raising
    ServerArgumentError; `--model-path` optional (`plan` and `ab` supply it)."""
    from sglang.srt.server_args import ServerArgs

    parser = _RaisingParser(prog="sglang serve")  # as sglang.srt.server_args prepare_server_args
    ServerArgs.add_cli_args(parser)
    for action in parser._actions:
        if action.dest == "model_path":
            action.required = False  # decided below: ours to supply or to demand
    return parser


def _option(parser: argparse.ArgumentParser, dest: str) -> str:
    for action in parser._actions:
        if action.dest == dest and action.option_strings:
            return action.option_strings[0]
    return "--" + dest.replace("_", "-")


@dataclass
class ServerArgv:
    argv: list[str]  # what SGLang's parser gets
    on_reference: bool  # the user's arguments were applied on top of the reference deployment
    user_argv: list[str]


def prepare_argv(user_argv: list[str], reference_argv: list[str] | None = None) -> ServerArgv:
    """Check the server arguments before SGLang resolves them; raise PlanInputError.

    Without `--model-path` (and a reference given), the arguments are appended to
    `reference_argv`: argparse keeps the last value of an option, so each one given replaces
    the reference's value.
    """
    with quiet_import_warnings():
        parser = sglang_parser()
    argv = list(user_argv)
    if "--config" in argv:
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

        try:
            with _silenced(logging.getLogger(ConfigArgumentMerger.__module__)):
                argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
        except Exception as e:  # a missing file, bad YAML: the user's input, said in one line
            raise PlanInputError(f"--config: {' '.join(str(e).split())}") from None
    ns = parser.parse_args(argv)
    on_reference = False
    if ns.model_path is None:
        if reference_argv is None:
            raise ServerArgumentError("the following arguments are required: --model-path/--model")
        argv = list(reference_argv) + argv
        ns = parser.parse_args(argv)
        on_reference = True
    _check_sizes(parser, ns)
    _check_parallel_sizes(parser, ns)
    _check_model_path(ns.model_path)
    return ServerArgv(argv=argv, on_reference=on_reference, user_argv=list(user_argv))


def _check_sizes(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    def too_large(what: str, value: int) -> PlanInputError:
        return PlanInputError(
            f"{what} {value} is larger than plan accepts (at most {MAX_PLAN_SIZE}): SGLang builds "
            f"a CUDA-graph size list up to it"
        )

    for dest in _SIZE_DESTS:
        value = getattr(ns, dest, None)
        if isinstance(value, int) and value > MAX_PLAN_SIZE:
            raise too_large(_option(parser, dest), value)
    lists = {_option(parser, d): getattr(ns, d, None) for d in _LIST_DESTS}
    for phase, settings in (getattr(ns, "cuda_graph_config", None) or {}).items():
        if isinstance(settings, dict):
            if isinstance(settings.get("max_bs"), int) and settings["max_bs"] > MAX_PLAN_SIZE:
                raise too_large(f"--cuda-graph-config {phase} max_bs", settings["max_bs"])
            lists[f"--cuda-graph-config {phase} bs"] = settings.get("bs")
    for what, values in lists.items():
        if not isinstance(values, (list, tuple)):
            continue
        if len(values) > MAX_PLAN_LIST:
            raise PlanInputError(
                f"{what} lists {len(values)} sizes; plan accepts at most {MAX_PLAN_LIST}"
            )
        big = [v for v in values if isinstance(v, int) and v > MAX_PLAN_SIZE]
        if big:
            raise too_large(what, max(big))


def _check_parallel_sizes(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    for dest in _PARALLEL_DESTS:
        value = getattr(ns, dest, None)
        if isinstance(value, int) and value < 1:
            counted = "nodes" if dest == "nnodes" else "ranks"
            raise PlanInputError(
                f"{_option(parser, dest)} {value} is below 1: it is a number of {counted}"
            )


# Ceilings on a config.json's sizes, checked before SGLang loads it. While SGLang loads the
# config (sglang.srt.utils.hf_transformers.config `get_config`), transformers builds lists with
# one entry per layer (configuration_glm_moe_dsa `GlmMoeDsaConfig.__post_init__`: indexer_types,
# mlp_layer_types, layer_types), each entry validated by huggingface_hub's strict dataclasses:
# 10^8 layers never returned. Each ceiling is far above any released model's.
MAX_CONFIG_LAYERS = 4096
_MAX_WIDTH = 1 << 20  # hidden, intermediate, head and LoRA dimensions
_MAX_HEADS = 1 << 14
_LAYERS = "num_hidden_layers"
_CONFIG_LIMITS = {
    _LAYERS: MAX_CONFIG_LAYERS,
    "num_nextn_predict_layers": MAX_CONFIG_LAYERS,
    "hidden_size": _MAX_WIDTH,
    "intermediate_size": _MAX_WIDTH,
    "moe_intermediate_size": _MAX_WIDTH,
    "head_dim": _MAX_WIDTH,
    "q_lora_rank": _MAX_WIDTH,
    "kv_lora_rank": _MAX_WIDTH,
    "num_attention_heads": _MAX_HEADS,
    "num_key_value_heads": _MAX_HEADS,
    "index_n_heads": _MAX_HEADS,
    "vocab_size": 1 << 24,
    "n_routed_experts": 1 << 16,
    "num_experts": 1 << 16,
    "num_local_experts": 1 << 16,
}
# Lists with one entry per layer, then one per MTP layer.
_PER_LAYER_LISTS = ("compress_ratios", "layer_types", "indexer_types", "mlp_layer_types")
_MAX_PER_LAYER_ENTRIES = 2 * MAX_CONFIG_LAYERS


def _config_sections(data: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The config and each sub-config one level down (a multimodal model's text_config),
    with the prefix that names a key in it."""
    yield "", data
    for key, value in data.items():
        if isinstance(value, dict):
            yield f"{key}.", value


def _check_config_sizes(config: Path, data: dict[str, Any]) -> None:
    """Every size within its ceiling (`_CONFIG_LIMITS`), every per-layer list bounded."""
    for prefix, section in _config_sections(data):
        for key, limit in _CONFIG_LIMITS.items():
            value = section.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > limit:
                # the layer count is what SGLang's loading walks (the comment on the limits)
                why = "; SGLang's config loading builds lists that long" if key == _LAYERS else ""
                raise PlanInputError(
                    f"{config}: {prefix}{key} is {value}, more than plan accepts (at most "
                    f"{limit}){why}"
                )
        for key in _PER_LAYER_LISTS:
            entries = section.get(key)
            if isinstance(entries, list) and len(entries) > _MAX_PER_LAYER_ENTRIES:
                raise PlanInputError(
                    f"{config}: {prefix}{key} has {len(entries)} entries, more than plan accepts "
                    f"(at most {_MAX_PER_LAYER_ENTRIES}: one per layer and MTP layer)"
                )


def _check_architectures(config: Path, data: dict[str, Any]) -> None:
    """`architectures` is a list of class names: SGLang iterates it (model_loader.utils
    `get_model_architecture`) and reads its first entry (configs.model_config `_hf_arch`), so a
    string would be read letter by letter."""
    archs = data.get("architectures")
    if isinstance(archs, str):
        raise PlanInputError(
            f'{config}: "architectures" is the string {json.dumps(archs)}; it must be a list of '
            f"class names: {json.dumps([archs])}"
        )
    if archs is not None and not (
        isinstance(archs, list) and all(isinstance(a, str) and a for a in archs)
    ):
        raise PlanInputError(
            f'{config}: "architectures" must be a list of class names such as '
            f'["LlamaForCausalLM"], got {json.dumps(archs)[:80]}'
        )


# SGLang's DeepSeek-V4 architectures (sglang.srt.configs.model_config `is_deepseek_v4`) and
# the compress ratios its layers accept (models.deepseek_v4 attention `__init__`,
# mem_cache.deepseek_v4_memory_pool `collect_sources_by_ratio`).
_DSV4_ARCHS = ("DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN", "DeepseekV4ForCausalLMDSpark")
_DSV4_RATIOS = (0, 1, 2, 4, 128)


def _check_config_json(config: Path) -> None:
    """The model's config.json is a JSON object, and a DeepSeek-V4 one is self-consistent.

    Not an object: SGLang's config loading calls `.get` on it and fails with an
    AttributeError deep inside (sglang.srt.utils.hf_transformers.config).

    DeepSeek-V4 `compress_ratios` (one entry per layer, then one per MTP layer): SGLang never
    checks its length. Shorter than `num_hidden_layers`, every layer past the list has no ratio
    (transformers' config validation or the layer's `config.compress_ratios[layer_id]` fails).
    Longer than `num_hidden_layers + num_nextn_predict_layers`, SGLang builds its layers from
    the first `num_hidden_layers` entries but counts every ratio-4 entry of the whole list as
    an indexer layer (`configs.model_config.get_num_indexer_layers`, which sizes the indexer
    top-k capturer), so the deployment would run with counts that match no model. Both are
    refused here in one line.

    Before SGLang reads it: `architectures` a list of class names (`_check_architectures`) and
    every size within a ceiling (`_check_config_sizes`), so that loading it stays bounded.
    """
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise PlanInputError(f"{config} is not valid JSON: {' '.join(str(e).split())}") from None
    if not isinstance(data, dict):
        raise PlanInputError(
            f"{config} holds a JSON {_json_kind(data)}, not an object: a model config.json is "
            '{"architectures": [...], ...}'
        )
    _check_architectures(config, data)
    _check_config_sizes(config, data)
    archs = data.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs else None
    if arch not in _DSV4_ARCHS or "NextN" in str(arch):
        return
    layers, nextn = data.get("num_hidden_layers"), data.get("num_nextn_predict_layers", 0)
    ratios = data.get("compress_ratios")
    if not isinstance(layers, int) or not isinstance(nextn, int):
        return  # SGLang's config classes say what is wrong with these
    if not isinstance(ratios, list) or not all(
        isinstance(r, int) and not isinstance(r, bool) for r in ratios
    ):
        raise PlanInputError(
            f"{config}: compress_ratios must be a list of integers, one per layer "
            f"(DeepSeek-V4), got {json.dumps(ratios)[:80]}"
        )
    bad = sorted({r for r in ratios[:layers] if r not in _DSV4_RATIOS})
    if bad:
        raise PlanInputError(
            f"{config}: compress_ratios holds {', '.join(map(str, bad))}; SGLang's DeepSeek-V4 "
            f"layers accept {', '.join(map(str, _DSV4_RATIOS))} and would fail building the model"
        )
    if len(ratios) < layers:
        raise PlanInputError(
            f"{config}: compress_ratios has {len(ratios)} entries for num_hidden_layers={layers}; "
            f"layers {len(ratios)}..{layers - 1} have no compress ratio and SGLang fails "
            "building the model"
        )
    if len(ratios) > layers + nextn:
        counted = sum(1 for r in ratios if r == 4)
        built = sum(1 for r in ratios[:layers] if r == 4)
        raise PlanInputError(
            f"{config}: compress_ratios has {len(ratios)} entries, more than num_hidden_layers="
            f"{layers} plus num_nextn_predict_layers={nextn}; SGLang would build {built} indexer "
            f"layers from the first {layers} but count {counted} (get_num_indexer_layers counts "
            "the whole list)"
        )


def _json_kind(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


def _check_model_file(path: Path, model_path: str) -> None:
    """A file is a model only as a GGUF file (sglang.srt.utils.hf_transformers.common
    `check_gguf_file`, which SGLang's config loading asks); any other file, the model's
    config.json itself included, would be planned as a directory and fail at launch."""
    from sglang.srt.utils.hf_transformers.common import check_gguf_file

    if check_gguf_file(path):
        return
    if path.name == "config.json":
        raise PlanInputError(
            f"--model-path {model_path} is the model's config.json, not its directory: pass the "
            f"directory that holds it (--model-path {path.parent})"
        )
    raise PlanInputError(
        f"--model-path {model_path} is a file, not a model directory (a file is a model only as "
        "GGUF): pass the directory that holds the model's config.json"
    )


_REPO_ID = re.compile(r"[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?")


def _check_model_path(model_path: str) -> None:
    path = Path(os.path.expanduser(model_path))
    if path.is_file():
        _check_model_file(path, model_path)
        return
    if path.exists():
        if path.is_dir() and not any((path / n).is_file() for n in ("config.json", "params.json")):
            if not any(path.glob("*.gguf")):
                raise PlanInputError(
                    f"--model-path {model_path} has no config.json (plan reads the model's config.json)"
                )
        if path.is_dir() and (path / "config.json").is_file():
            _check_config_json(path / "config.json")
        return
    looks_like_repo_id = (
        _REPO_ID.fullmatch(model_path) is not None
        and ".." not in model_path
        and "--" not in model_path
    )
    if not looks_like_repo_id:
        raise PlanInputError(
            f"--model-path {model_path} does not exist (give a local model directory with its "
            "config.json, or a Hugging Face repo id)"
        )


# ---------------------------------------------------------------- environment


def invalid_environment() -> list[str]:
    """One line per SGLang environment variable whose value SGLang would not accept.

    Upstream's `EnvField.get()` (sglang.srt.environ) warns and falls back to the default on a
    value its `parse` rejects, so a typo silently becomes the default. This plugin's flags are
    strict and say so themselves (flags.FlagValueError).
    """
    from sglang.srt.environ import EnvField, Envs

    from sglang_mixgraph.flags import FLAGS, FlagValueError
    from sglang_mixgraph.patches import all_patches

    all_patches()  # every patch's flags are registered in SGLang's envs
    problems = []
    for name, env_field in vars(Envs).items():
        if not isinstance(env_field, EnvField) or name not in os.environ:
            continue
        if name in FLAGS:
            try:
                FLAGS[name].get()
            except FlagValueError as e:
                problems.append(" ".join(str(e).split()))
            continue
        value = os.environ[name]
        try:
            env_field.parse(value)
        except NotImplementedError:
            continue
        except Exception as e:
            shown = "<hidden>" if getattr(env_field, "secret", False) else repr(value)
            default = env_field.default
            fallback = "" if callable(default) else f" {default!r}"
            problems.append(
                f"{name}={shown} is not a valid value ({' '.join(str(e).split())}); SGLang would "
                f"warn and use its default{fallback} instead"
            )
    return problems
