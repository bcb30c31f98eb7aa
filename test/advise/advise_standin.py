"""A stand-in for a running SGLang server's endpoints that `sglang-mixgraph advise` calls.

A ThreadingHTTPServer in a thread of the test: GET `/server_info` and `/model_info` answer the
JSON the test gives; POST `/start_profile` records the request and, as SGLang does, has the
"ranks" write `<profile_id>-<rank>.trace.json.gz` into its `output_dir`: the recorded traces of
one scenario (test/advise/traces/<scenario>/). When they are written is the mode: "auto" soon
after the start (a server with traffic reaching `num_steps`), "on_stop" at `/stop_profile` (no
traffic), "on_traffic" after the first POST `/generate` (the load's), "elsewhere" never (a
server writing on another host), "broken" a truncated file. "missing" answers 404 for the
profiling endpoints (a server without them), "refuse" 400, "busy" 500. `stop_delay_s` is how
long `/stop_profile` takes to answer (SGLang answers once the ranks have written). With `log`
set, `/start_profile` appends to that file what SGLang's log shows of a profile: its start line
with the profile id, prefill batch lines `profiled_gap_ms` apart, and the stop line.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TRACES = Path(__file__).resolve().parent / "traces"
SERVER_INFO = Path(__file__).resolve().parent / "server_info_dsv4.json"


def batch_line(gap_ms: float, running: int = 8, queued: int = 40, graph: bool = False) -> str:
    """A prefill batch line as SGLang logs it: its tokens over the time since the last."""
    return (
        f"[t] Prefill batch, #new-seq: 1, #new-token: 1024, #cached-token: 0, full token usage: "
        f"0.10, #running-req: {running}, #queue-req: {queued}, #pending-token: 0, cuda graph: "
        f"{graph}, input throughput (token/s): {1024 / gap_ms * 1000:.2f}"
    )


def recorded_server_info() -> dict:
    return json.loads(SERVER_INFO.read_text())


class Standin:
    def __init__(self, scenario: str, mode: str, server_info: dict, model_info: dict):
        self.scenario, self.mode = scenario, mode
        self.server_info, self.model_info = server_info, model_info
        self.requests: list[tuple[str, str, dict | None]] = []
        self.pending: dict | None = None  # the start request whose traces are not written yet
        self.stop_delay_s = 0.0
        self.log: Path | None = None
        self.profiled_gap_ms = 400.0
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> Standin:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def paths(self, method: str | None = None) -> list[str]:
        return [p for m, p, _ in self.requests if method is None or m == method]

    def write_traces(self) -> None:
        body, self.pending = self.pending, None
        if body is None:
            return
        out = Path(body["output_dir"])
        out.mkdir(parents=True, exist_ok=True)
        for trace in sorted((TRACES / self.scenario).glob("*.trace.json.gz")):
            target = out / f"{body['profile_id']}-{trace.name}"
            if self.mode == "broken":
                target.write_bytes(trace.read_bytes()[: trace.stat().st_size // 2])
            else:
                shutil.copyfile(trace, target)

    def log_profile(self, profile_id: str) -> None:
        lines = [
            f"[t] Profiling starts. Traces will be saved to: x (with profile id: {profile_id})"
        ]
        lines += [batch_line(self.profiled_gap_ms)] * 8 + ["[t] Stop profiling..."]
        with self.log.open("a") as f:
            f.write("\n".join(lines) + "\n")

    def _handler(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, body) -> None:
                data = (json.dumps(body) if not isinstance(body, str) else body).encode()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # caller gave up
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def do_GET(self):
                standin.requests.append(("GET", self.path, None))
                answers = {"/server_info": standin.server_info, "/model_info": standin.model_info}
                if self.path in answers:
                    self._send(200, answers[self.path])
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                standin.requests.append(("POST", self.path, body))
                mode = standin.mode
                if self.path in ("/start_profile", "/stop_profile"):
                    if mode == "missing":
                        return self._send(404, {"detail": "Not Found"})
                    if mode == "refuse":
                        return self._send(400, "profile request rejected: bad output_dir\n")
                    if mode == "busy":
                        return self._send(500, "Internal Server Error")
                if self.path == "/start_profile":
                    standin.pending = body
                    if standin.log is not None:
                        standin.log_profile(body["profile_id"])
                    if mode in ("auto", "broken"):
                        threading.Timer(0.1, standin.write_traces).start()
                    return self._send(200, "Start profiling.\n")
                if self.path == "/stop_profile":
                    time.sleep(standin.stop_delay_s)
                    if mode == "on_stop":
                        standin.write_traces()
                    return self._send(200, "Stop profiling. This will take some time.\n")
                if self.path == "/generate":
                    if mode == "on_traffic":
                        standin.write_traces()
                    return self._send(200, {"text": ""})
                return self._send(404, {"detail": "Not Found"})

        return Handler
