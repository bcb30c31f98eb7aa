"""`python -m sglang_mixgraph.ab.gsm8k_eval`: SGLang's GSM8K eval as its CI runs it, to a file.

SGLang's CI gates DeepSeek-V4 and GLM-5 on `sglang.test.run_eval.run_eval` with
`eval_name="gsm8k"`, `api="completion"` and `max_tokens=512` (the registered 8-GPU model
tests, and the `run_eval` backend of `sglang.test.kits.eval_accuracy_kit.GSM8KMixin`): a
few-shot prompt sent to `/v1/completions`, the last number of the answer compared with the
reference. That function returns its metrics but its command line writes them only to a fixed
/tmp name; this wrapper passes the same arguments and writes the returned dict (`score` is the
accuracy) to `--out`, so each arm's result lands in its run directory. `--data-path` points
it at a local GSM8K `test.jsonl` for clusters without internet access.
0.5.23 marks `run_eval` deprecated in favour of `sglang.test.sgl_eval_utils.run_sgl_eval`, yet
its own kit still gates GSM8K through `run_eval` (`GSM8KMixin.gsm8k_backend = "run_eval"`;
`run_sgl_eval` serves only `SGL_EVAL_BENCHMARKS`): that one needs the `sgl-eval` package
(SGLang's test extra), asks through the chat API and has no few-shot completion or local data.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_mixgraph.ab.gsm8k_eval")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--num-examples", type=int, required=True)
    parser.add_argument("--num-shots", type=int, required=True)
    parser.add_argument("--num-threads", type=int, required=True)
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--data-path")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    from sglang.test.run_eval import run_eval

    metrics = run_eval(
        SimpleNamespace(
            base_url=args.base_url,
            host=None,
            port=None,
            model=None,
            eval_name="gsm8k",
            api="completion",
            max_tokens=args.max_tokens,
            num_examples=args.num_examples,
            num_threads=args.num_threads,
            num_shots=args.num_shots,
            gsm8k_data_path=args.data_path,
        )
    )
    Path(args.out).write_text(json.dumps(metrics, indent=2, default=float) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
