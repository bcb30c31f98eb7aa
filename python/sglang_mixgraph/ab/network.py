"""What a run would fetch from the network, and how a failed cell's log shows a failed fetch.

SGLang 0.5.23's tools download what they are not given:
- the GSM8K eval (`sglang.test.simple_eval_mixed_prefix_gsm8k.GSM8KEval`, which
  `sglang.test.run_eval` runs for `gsm8k`) downloads the test set from GitHub unless it is
  given a data path (`[gsm8k] data_path`, `--gsm8k-data`);
- bench_serving's `random` dataset (`sglang.benchmark.datasets.random.sample_random_requests`)
  draws its text from ShareGPT, downloaded from the Hugging Face hub unless `dataset_path` is a
  JSON file, and `sharegpt` (`sample_sharegpt_requests`) does when `dataset_path` is empty;
- a model path that is not a local directory is a hub id: the server downloads the weights and
  bench_serving the tokenizer (`sglang.benchmark.utils.get_tokenizer`).
`fetches` lists them (`--dry-run` prints them); with `--offline` (`[run] offline`) each one is
an error before anything starts. `failed_fetch` reads a failed cell's log for the marks of a
fetch that failed and names the setting that avoids it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sglang_mixgraph.ab.config import Config

# bench_serving datasets that download ShareGPT without a dataset_path.
SHAREGPT_DATASETS = ("random", "sharegpt")
# What a download that failed leaves in a tool's output: the hosts, huggingface_hub's errors
# (also under HF_HUB_OFFLINE=1) and the resolver's. A local server's errors name none of them.
MARKS = (
    "huggingface.co",
    "raw.githubusercontent.com",
    "LocalEntryNotFoundError",
    "OfflineModeIsEnabled",
    "HF_HUB_OFFLINE",
    "name resolution",
    "Network is unreachable",
)


@dataclass(frozen=True)
class Fetch:
    kind: str  # "gsm8k", "dataset" or "model": which cells need it
    what: str
    avoid: str  # the setting that makes it local

    def line(self) -> str:
        return f"needs network: {self.what} (to avoid it: {self.avoid})"


def local_path(text: str) -> bool:
    """Written as a path (absolute, `.`, `~`), not as a hub id `org/name`."""
    return text.startswith(("/", ".", "~"))


def fetches(config: Config, *, accuracy_only: bool = False) -> list[Fetch]:
    found = []
    g, sw, s = config.gsm8k, config.sweep, config.server
    if g.enabled and not g.data_path:
        found.append(
            Fetch(
                "gsm8k",
                "the GSM8K test set from raw.githubusercontent.com (SGLang's eval downloads it)",
                "[gsm8k] data_path or --gsm8k-data, a local test.jsonl",
            )
        )
    if not accuracy_only and sw.dataset in SHAREGPT_DATASETS and not sw.dataset_path:
        found.append(
            Fetch(
                "dataset",
                f"ShareGPT from the Hugging Face hub (bench_serving's dataset {sw.dataset!r} "
                "draws its prompts from it)",
                '[sweep] dataset_path, a local ShareGPT JSON file, or dataset = "random-ids"',
            )
        )
    model = s.model_path
    launched = any(a.url is None for a in config.arms)
    if launched and model and not local_path(model) and not Path(model).is_dir():
        found.append(
            Fetch(
                "model",
                f"the model {model!r} from the Hugging Face hub (the server downloads its "
                "weights, bench_serving its tokenizer)",
                "[server] model_path, a local directory",
            )
        )
    return found


def failed_fetch(config: Config, cell_kind: str, log_text: str) -> Fetch | None:
    """The fetch a failed cell's log shows failing (None: no mark of the network in it, or a
    token check, which downloads nothing: a host it cannot resolve is the server's)."""
    if cell_kind == "tokens" or not any(mark in log_text for mark in MARKS):
        return None
    kinds = ("gsm8k", "model") if cell_kind == "gsm8k" else ("dataset", "model")
    needed = [f for f in fetches(config) if f.kind in kinds]
    # Both ShareGPT and the tokenizer come from the hub: the traceback says which failed.
    if "sharegpt" not in log_text.lower():
        needed = [f for f in needed if f.kind != "dataset"] or needed
    if needed:
        return needed[0]
    return Fetch(cell_kind, "a download", "local paths for the data and the model")
