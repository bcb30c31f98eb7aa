"""`python -m sglang_mixgraph.ab.greedy_tokens`: greedy output ids of seeded prompts, to a file.

The load cells say how fast each arm serves; this cell says whether it produced the same tokens.
It builds `--prompts` prompts as token ids from `--seed` alone (`build_prompts`: lengths spread
over input_len/2 .. input_len*3/2, so the one batch they make mixes prefill chunks with decode
rows; ids below the model's vocabulary size), sends them all at once, a thread each, to SGLang's
native `/generate` with `input_ids` and greedy sampling (`temperature` 0, `ignore_eos`, so every
prompt gets exactly `--output-len` new tokens), and writes each prompt's output ids to `--out`.
A non-streamed `/generate` answers one JSON object whose `output_ids` are the generated ids:
SGLang 0.5.23's `TokenizerManager._handle_batch_output` sets it to the request's accumulated
`state.output_ids` once the request has finished (for text and token-id outputs alike), and
`http_server.serve_generate_request` returns that object as the body. The vocabulary size is
the `vocab_size` of the model directory's `config.json` (`/model_info` names the directory;
SGLang's `/model_info` has no size itself), else the ids stay below FALLBACK_VOCAB.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# Without a readable config.json: Llama-2's and Mistral-7B's 32,000 tokens, the smallest
# vocabulary of the common model families, so the ids are tokens of any of them.
FALLBACK_VOCAB = 32000


class TokensError(RuntimeError):
    """The server did not answer as SGLang's /generate does; one line."""


def length_bounds(input_len: int) -> tuple[int, int]:
    """The shortest and the longest prompt the check sends for `input_len`."""
    return max(1, input_len // 2), max(1, input_len * 3 // 2)


def prompt_lengths(prompts: int, input_len: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    low, high = length_bounds(input_len)
    return [rng.randint(low, high) for _ in range(prompts)]


def build_prompts(prompts: int, input_len: int, seed: int, vocab_size: int) -> list[list[int]]:
    """The prompts as token ids: a function of the arguments only, the same for every arm."""
    # The ids get their own stream: the lengths stay the same whatever the vocabulary.
    rng = random.Random(f"ids-{seed}")
    return [
        [rng.randrange(vocab_size) for _ in range(length)]
        for length in prompt_lengths(prompts, input_len, seed)
    ]


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, separators=(",", ":")).encode()).hexdigest()[:16]


def _request(url: str, timeout_s: float, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace").strip().splitlines()
        raise TokensError(f"{url}: HTTP {e.code}: {text[0] if text else e.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise TokensError(f"{url}: {e}") from None


def vocab_size(base_url: str, timeout_s: float) -> tuple[int, str]:
    """The model's vocabulary size and where it came from."""
    info = _request(f"{base_url}/model_info", timeout_s)
    path = Path(str(info.get("model_path") or "")) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return FALLBACK_VOCAB, f"no readable {path}: the fallback bound"
    # A multimodal model keeps its language model's size in text_config.
    for table in (config, config.get("text_config") or {}):
        size = table.get("vocab_size") if isinstance(table, dict) else None
        if isinstance(size, int) and size > 0:
            return size, str(path)
    return FALLBACK_VOCAB, f"no vocab_size in {path}: the fallback bound"


def generate(base_url: str, ids: list[int], output_len: int, timeout_s: float) -> list[int]:
    body = {
        "input_ids": ids,
        "sampling_params": {"temperature": 0, "max_new_tokens": output_len, "ignore_eos": True},
    }
    reply = _request(f"{base_url}/generate", timeout_s, body)
    out = reply.get("output_ids") if isinstance(reply, dict) else None
    if not isinstance(out, list) or not all(isinstance(i, int) for i in out):
        raise TokensError(f"{base_url}/generate: no output_ids in the reply ({str(reply)[:200]})")
    if len(out) != output_len:
        # ignore_eos: a shorter answer is the server's doing, not the prompt's.
        raise TokensError(
            f"{base_url}/generate: {len(out)} output ids for a prompt of {len(ids)} tokens, "
            f"asked for {output_len} with ignore_eos"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_mixgraph.ab.greedy_tokens")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--prompts", type=int, required=True)
    parser.add_argument("--input-len", type=int, required=True)
    parser.add_argument("--output-len", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--timeout-s", type=float, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    url = args.base_url.rstrip("/")
    started = time.monotonic()
    try:
        size, size_from = vocab_size(url, args.timeout_s)
        prompts = build_prompts(args.prompts, args.input_len, args.seed, size)
        # One thread per prompt: every request is in flight at once, one batch on the server.
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            outputs = list(
                pool.map(lambda ids: generate(url, ids, args.output_len, args.timeout_s), prompts)
            )
    except TokensError as e:
        print(f"greedy_tokens: {e}", file=sys.stderr)
        return 1
    result = {
        "prompts": args.prompts,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "seed": args.seed,
        "vocab_size": size,
        "vocab_size_from": size_from,
        "prompt_lengths": [len(p) for p in prompts],
        "prompt_digest": digest(prompts),
        "output_ids": outputs,
        "wall_s": time.monotonic() - started,
    }
    Path(args.out).write_text(json.dumps(result) + "\n")
    print(f"greedy_tokens: {len(outputs)} prompts, output digest {digest(outputs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
