"""A stand-in for `python -m sglang.launch_server`: `sglang-mixgraph demo` and the `ab` CPU tests.

It takes the launch arguments the tool passes (`--model-path`, `--host`, `--port`, the rest
ignored) and speaks the endpoints SGLang's own clients use: `/health_generate`, `/v1/models`,
`/model_info`, `/server_info`, `/flush_cache`, streamed `/generate` (sglang.benchmark.serving
with `--backend sglang`), non-streamed `/generate` with `input_ids` (the greedy token check:
`output_ids` a function of the input ids, `greedy_ids`) and `/v1/completions`
(sglang.test.run_eval's GSM8K). Latency is a
model, not a measurement: the first token after `--ttft-ms`, each further one after
`--tpot-ms` plus `--tpot-per-running-ms` per request in flight. GSM8K answers are right for every question of `--gsm8k-data` whose line index is
not a multiple of `--wrong-every`, so the expected accuracy is known. `--startup-s` delays
the start (after logging a line), like a server loading weights; `--spec-accept-length`
reports an MTP accept length in `/server_info` as a speculative-decoding server does. The model
path must be a directory with a tokenizer (bench_serving loads it; `write_model_dir` makes one).
Test hooks come from the environment
(inherited, not part of an arm): STANDIN_DIE_AFTER=N exits hard at the N-th `/generate`,
STANDIN_PID_FILE receives the pids of the server and of a child it starts in its process group,
STANDIN_WRAPPER (set by the tests' launch-prefix wrappers) is reported, when set, in
`/server_info` and in the log, so a test sees which wrapper started this server;
STANDIN_TRAP_SIGTERM=1 makes the server and its child ignore SIGTERM (the server logs
"got SIGTERM"), a shutdown that never ends: only SIGKILL stops them;
STANDIN_TOKENS_DIFFER_FROM=I makes an arm whose environment sets FLAG=1 answer other greedy ids
from output index I on, for the prompts whose first input id is even (an arm whose tokens
differ, at a place a test can compute).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# The stand-in's output ids stay below greedy_tokens' fallback vocabulary.
from sglang_mixgraph.ab.greedy_tokens import FALLBACK_VOCAB

FLAG = "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN"


def greedy_ids(input_ids: list[int], n: int) -> list[int]:
    """`n` output ids that depend on the input ids alone: a linear congruential sequence seeded
    by a position-weighted sum of them; changed from STANDIN_TOKENS_DIFFER_FROM on when asked."""
    state = sum((i + 1) * x for i, x in enumerate(input_ids)) % 2**31
    out = []
    for _ in range(n):
        state = (state * 1103515245 + 12345) % 2**31
        out.append(state % FALLBACK_VOCAB)
    differ_from = os.environ.get("STANDIN_TOKENS_DIFFER_FROM")
    if differ_from and os.environ.get(FLAG) == "1" and input_ids and input_ids[0] % 2 == 0:
        start = int(differ_from)
        out[start:] = [(x + 1) % FALLBACK_VOCAB for x in out[start:]]
    return out


def _answer_of(line: dict) -> str:
    return line["answer"].split("####")[-1].strip().replace(",", "")


class Standin:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.generate_count = 0
        self.running = 0
        self.lock = threading.Lock()
        self.answers: dict[str, tuple[int, str]] = {}
        if args.gsm8k_data:
            with open(args.gsm8k_data) as f:
                for index, text in enumerate(f):
                    line = json.loads(text)
                    self.answers[line["question"].strip()] = (index, _answer_of(line))

    def gsm8k_answer(self, prompt: str) -> str:
        question = prompt.rsplit("Question:", 1)[-1].rsplit("Answer:", 1)[0].strip()
        index, answer = self.answers.get(question, (0, "0"))
        if index % self.args.wrong_every == 0:
            answer = str(int(answer) + 1)
        return f" Some reasoning. The answer is {answer}.\n\n"


def make_handler(standin: Standin):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # a streamed body ends when the connection closes

        def log_message(self, *args):  # keep the server log to what the tests read
            pass

        def _json(self, body: dict, status: int = 200) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length) or b"{}")

        def do_GET(self):
            a = standin.args
            self.path = self.path.split("?", 1)[0]
            if self.path in ("/health", "/health_generate", "/flush_cache"):
                self._json({})
            elif self.path == "/v1/models":
                self._json({"object": "list", "data": [{"id": a.model_path, "object": "model"}]})
            elif self.path == "/model_info":
                self._json({"model_path": a.model_path, "tokenizer_path": a.model_path})
            elif self.path == "/server_info":
                wrapper = os.environ.get("STANDIN_WRAPPER")
                self._json(
                    {
                        "tp_size": a.tp_size,
                        "pp_size": 1,
                        "version": "0.0.0+standin",  # SGLang's /server_info has its __version__
                        # SGLang adds avg_spec_accept_length with speculative decoding only
                        # (scheduler_components.internal_state); bench_serving records it.
                        "internal_states": [
                            {}
                            if a.spec_accept_length is None
                            else {"avg_spec_accept_length": a.spec_accept_length}
                        ],
                        "standin": {
                            "ttft_ms": a.ttft_ms,
                            "tpot_ms": a.tpot_ms,
                            FLAG: os.environ.get(FLAG),
                            **({"wrapper": wrapper} if wrapper else {}),
                        },
                    }
                )
            else:
                self._json({"error": self.path}, 404)

        def do_POST(self):
            self.path = self.path.split("?", 1)[0]  # bench_serving's /flush_cache?timeout=...
            if self.path == "/flush_cache":
                self._json({})
            elif self.path == "/generate":
                self._generate(self._body())
            elif self.path == "/v1/completions":
                self._completion(self._body())
            else:
                self._json({"error": self.path}, 404)

        def _generate(self, body: dict) -> None:
            with standin.lock:
                standin.generate_count += 1
                if standin.generate_count == int(os.environ.get("STANDIN_DIE_AFTER", "0") or 0):
                    os._exit(3)
            if "input_ids" in body and not body.get("stream"):
                self._greedy(body)
                return
            a = standin.args
            n = int(body["sampling_params"]["max_new_tokens"])
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            with standin.lock:
                standin.running += 1
            try:
                due = time.perf_counter() + a.ttft_ms / 1000
                for i in range(1, n + 1):
                    time.sleep(max(0.0, due - time.perf_counter()))
                    chunk = {
                        "text": "tok " * i,
                        "meta_info": {"completion_tokens": i, "prompt_tokens": 8},
                    }
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    self.wfile.flush()
                    # A decode step slows down with the batch, like a real server's.
                    due += (a.tpot_ms + a.tpot_per_running_ms * standin.running) / 1000
                self.wfile.write(b"data: [DONE]\n\n")
            finally:
                with standin.lock:
                    standin.running -= 1

        def _greedy(self, body: dict) -> None:
            """One JSON answer, as SGLang's non-streamed /generate, after the modelled time."""
            a = standin.args
            ids = body["input_ids"]
            n = int(body["sampling_params"]["max_new_tokens"])
            time.sleep((a.ttft_ms + (n - 1) * a.tpot_ms) / 1000)
            out = greedy_ids(ids, n)
            self._json(
                {
                    "text": " ".join(f"w{x % 98}" for x in out),
                    "output_ids": out,
                    "meta_info": {"prompt_tokens": len(ids), "completion_tokens": n},
                }
            )

        def _completion(self, body: dict) -> None:
            text = standin.gsm8k_answer(body["prompt"])
            self._json(
                {
                    "id": "cmpl-standin",
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": standin.args.model_path,
                    "choices": [
                        {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}
                    ],
                    "usage": {"prompt_tokens": 8, "completion_tokens": 6, "total_tokens": 14},
                }
            )

    return Handler


def write_model_dir(path: Path) -> Path:
    """A directory bench_serving can load a tokenizer from: a word-level vocabulary."""
    # Imported here: the server itself needs neither, and transformers takes seconds to import.
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "tok": 1, **{f"w{i}": i + 2 for i in range(98)}}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]").save_pretrained(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--tpot-ms", type=float, default=10.0)
    parser.add_argument("--tpot-per-running-ms", type=float, default=0.0)
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--gsm8k-data")
    parser.add_argument("--wrong-every", type=int, default=4)
    parser.add_argument("--startup-s", type=float, default=0.0)
    parser.add_argument("--spec-accept-length", type=float)
    args, _ = parser.parse_known_args()  # SGLang server arguments of the config are ignored
    trap = os.environ.get("STANDIN_TRAP_SIGTERM") == "1"
    if trap:
        # A server whose shutdown takes long: SIGTERM is noted in the log and changes nothing,
        # for it and its child; only SIGKILL stops them.
        def noted(signum, frame):
            print("stand-in: got SIGTERM, still running", flush=True)

        signal.signal(signal.SIGTERM, noted)
    pid_file = os.environ.get("STANDIN_PID_FILE")
    if pid_file:
        ignore = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " if trap else ""
        child = subprocess.Popen([sys.executable, "-c", ignore + "import time; time.sleep(600)"])
        with open(pid_file, "a") as f:
            f.write(f"{os.getpid()} {child.pid}\n")
    if args.startup_s:
        # A slow start (weights, graph capture) before the port opens, with a log line.
        print(f"stand-in: loading weights for {args.startup_s:g} s", flush=True)
        time.sleep(args.startup_s)
    # The default listen backlog (5) would make the 6th simultaneous connection wait for a
    # SYN retry (about a second), which is no part of the latency model.
    ThreadingHTTPServer.request_queue_size = 1024
    server = ThreadingHTTPServer((args.host, args.port), make_handler(Standin(args)))
    server.daemon_threads = True
    wrapper = os.environ.get("STANDIN_WRAPPER")
    through = f" (started through wrapper {wrapper})" if wrapper else ""
    print(f"stand-in serving on {args.host}:{args.port}{through}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
