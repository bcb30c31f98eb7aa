"""The running server, over HTTP: its answers, and what they say of the deployment.

`Server` makes the calls (stdlib urllib, no client library) and turns every failure into an
`AdviseError` of one line: a URL that does not answer, a server that is not SGLang, a refused
key. `ServerFacts.read` reads what the plan of a patch needs from SGLang 0.5.23's `/server_info`
(the resolved server arguments, `ServerArgs.resolved_dict` via `build_server_info` in
sglang.srt.utils.common, with `cuda_graph_config`'s per-phase backend and buckets) and
`/model_info` (the model's architectures and `model_type`). The names of the fields it reads
are checked against a real resolution in the tests.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import urllib.parse
from dataclasses import dataclass

TIMEOUT_S = 10.0  # every call's whole time: connect, request, headers and body
MAX_REPLY_BYTES = 64 << 20  # no SGLang answer advise reads comes near it
# The `/server_info` fields read: resolved server arguments (`ServerArgs.resolved_dict`), and
# what the endpoint adds to them.
RESOLVED_KEYS = (
    "model_path",
    "tp_size",
    "pp_size",
    "dp_size",
    "attn_dp_size",
    "enable_mixed_chunk",
    "chunked_prefill_size",
    "dsv4_attn_backend",
    "speculative_algorithm",
    "attn_cp_size",
    "enable_prefill_cp",
    "enable_hisparse",
    "disable_cuda_graph",
    "cuda_graph_config",
    "max_running_requests",
    "page_size",
    "moe_a2a_backend",
    "cuda_graph_bs_prefill",
    "cuda_graph_max_bs_prefill",
)
ENDPOINT_KEYS = ("version", "launch_command")
# What every SGLang /server_info holds: without them the server is something else.
REQUIRED_KEYS = ("version", "model_path", "tp_size")


class AdviseError(Exception):
    """A one-line reason advise cannot answer; `code` is the exit status (1, or 2 for the
    command line)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Reply:
    status: int
    text: str

    def first_line(self, limit: int = 160) -> str:
        line = self.text.strip().splitlines()[0] if self.text.strip() else ""
        return line[:limit]


class Server:
    """HTTP calls to one SGLang server; `api_key` is sent as a bearer token. Every call is over
    within `timeout_s` whatever the other end does (a port that is not HTTP, headers and then
    nothing): a timer shuts the socket down at the deadline."""

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float | None = None):
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = TIMEOUT_S if timeout_s is None else timeout_s

    def call(
        self, method: str, path: str, body: dict | None = None, timeout_s: float | None = None
    ) -> Reply:
        """One request; any HTTP status comes back as a Reply, a network failure, a reply that
        is not HTTP or no reply in time as an AdviseError. `timeout_s` replaces the server's
        bound for this call (the profiler's stop answers only once the traces are written)."""
        bound = self.timeout_s if timeout_s is None else timeout_s
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        parts = urllib.parse.urlsplit(self.url)
        kind = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        )
        conn = kind(parts.hostname, parts.port, timeout=bound)
        late = threading.Event()
        timer = threading.Timer(bound, _shut_down, (conn, late))
        timer.daemon = True
        timer.start()
        try:
            conn.request(method, parts.path + path, body=data, headers=headers)
            reply = conn.getresponse()
            text = reply.read(MAX_REPLY_BYTES + 1)
            if late.is_set():  # the shut-down socket ended the read short, not the server
                raise TimeoutError
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise AdviseError(self._failure(path, e, late.is_set(), bound)) from None
        finally:
            timer.cancel()
            conn.close()
        if len(text) > MAX_REPLY_BYTES:
            raise AdviseError(
                f"{self.url} answered {path} with more than {MAX_REPLY_BYTES >> 20} MiB: is an "
                "SGLang server there?"
            )
        return Reply(reply.status, text.decode(errors="replace"))

    def _failure(self, path: str, e: Exception, late: bool, bound: float) -> str:
        if late or isinstance(e, TimeoutError):
            return f"{self.url} did not answer {path} within {bound:g} s"
        if isinstance(e, http.client.BadStatusLine):
            said = str(e.args[0] if e.args else "").strip()[:80]
            return (
                f"{self.url} does not speak HTTP (it answered {said!r}): is an SGLang server "
                "there? (check the port)"
            )
        if isinstance(e, (http.client.HTTPException, ValueError)):
            return f"{self.url} sent no valid HTTP reply to {path} ({type(e).__name__}): is an SGLang server there?"
        reason = getattr(e, "strerror", None) or e
        return f"cannot reach {self.url}: {reason} (is an SGLang server there?)"

    def get_json(self, path: str) -> dict:
        reply = self.call("GET", path)
        if reply.status in (401, 403):
            raise AdviseError(
                f"{self.url} refused GET {path} (HTTP {reply.status}): give its key with --api-key"
            )
        if reply.status != 200:
            raise AdviseError(
                f"{self.url} is not an SGLang 0.5.23 server: GET {path} answered HTTP "
                f"{reply.status} {reply.first_line()}".rstrip()
            )
        try:
            data = json.loads(reply.text)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise AdviseError(f"{self.url} answered GET {path} with something that is not JSON")
        return data


def _shut_down(conn: http.client.HTTPConnection, late: threading.Event) -> None:
    """At the deadline: whatever the call waits on (connect, headers, body) returns at once."""
    late.set()
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


@dataclass(frozen=True)
class PhaseGraph:
    """One phase's CUDA graph as the server resolved it: backend ("full", "breakable",
    "disabled") and the buckets it captures (or would, for a disabled phase)."""

    backend: str
    buckets: tuple[int, ...]

    @classmethod
    def read(cls, config: dict, phase: str) -> PhaseGraph:
        settings = _Fields(config, "cuda_graph_config").table(phase)
        where = _Fields(settings, f"cuda_graph_config.{phase}")
        return cls(where.text("backend") or "disabled", where.counts("bs"))


@dataclass(frozen=True)
class ServerFacts:
    """What advise reads of the deployment from the server's own answers. It is a
    `planner.split_view.SplitFacts`, as the planner's facts are: the mixed split's
    deployment-wide fallbacks read it (test/planner/test_split_view.py checks every field)."""

    url: str | None  # None: traces recorded earlier, no server asked
    sglang_version: str
    model_path: str
    architectures: tuple[str, ...]
    model_type: str | None
    tp_size: int
    pp_size: int
    dp_size: int
    attn_dp_size: int
    mixed_chunk: bool | None  # None: not known (no server asked)
    chunked_prefill_size: int | None
    dsv4_attn_backend: str | None
    speculative_algorithm: str | None
    context_parallel: bool
    hisparse: bool
    disable_cuda_graph: bool
    prefill_graph: PhaseGraph
    decode_graph: PhaseGraph
    launch_command: str | None
    # What `auto`'s bucket derivation reads (advise.auto_buckets); None where unknown.
    max_running_requests: int | None = None
    page_size: int | None = None
    moe_a2a_backend: str | None = None
    prefill_buckets_user_set: bool = False

    @property
    def expected_traces(self) -> int:
        """One trace per scheduler process: every TP rank of every pipeline stage and replica."""
        return max(1, self.tp_size) * max(1, self.pp_size) * max(1, self.dp_size)

    @property
    def deepseek_v4(self) -> bool:
        from sglang.srt.configs.model_config import is_deepseek_v4

        return bool(is_deepseek_v4({"architectures": list(self.architectures)}))

    @property
    def glm5(self) -> bool:
        from sglang.srt.configs.model_config import is_glm_moe_dsa

        return bool(is_glm_moe_dsa({"architectures": list(self.architectures)}))

    @classmethod
    def read(cls, url: str, server_info: dict, model_info: dict) -> ServerFacts:
        """The facts, or one line (AdviseError) naming a field of the wrong type or a
        `/server_info` without SGLang's fields (a server answering `{}` to everything)."""
        missing = [key for key in REQUIRED_KEYS if key not in server_info]
        if missing:
            raise AdviseError(
                f"{url} is not an SGLang 0.5.23 server: its /server_info has no "
                f"{', '.join(missing)}"
            )
        s, m = _Fields(server_info, "/server_info"), _Fields(model_info, "/model_info")
        graphs = s.table("cuda_graph_config")
        return cls(
            url=url,
            sglang_version=s.text("version") or "unknown",
            model_path=m.text("model_path") or s.text("model_path") or "",
            architectures=m.words("architectures"),
            model_type=m.text("model_type"),
            tp_size=s.size("tp_size"),
            pp_size=s.size("pp_size"),
            dp_size=s.size("dp_size"),
            attn_dp_size=s.size("attn_dp_size"),
            mixed_chunk=s.flag("enable_mixed_chunk"),
            chunked_prefill_size=s.count("chunked_prefill_size"),
            dsv4_attn_backend=s.text("dsv4_attn_backend"),
            speculative_algorithm=s.text("speculative_algorithm"),
            context_parallel=s.size("attn_cp_size") > 1 or s.flag("enable_prefill_cp"),
            hisparse=s.flag("enable_hisparse"),
            disable_cuda_graph=s.flag("disable_cuda_graph"),
            prefill_graph=PhaseGraph.read(graphs, "prefill"),
            decode_graph=PhaseGraph.read(graphs, "decode"),
            launch_command=s.text("launch_command"),
            max_running_requests=s.count("max_running_requests"),
            page_size=s.count("page_size"),
            moe_a2a_backend=s.text("moe_a2a_backend"),
            prefill_buckets_user_set=bool(s.counts("cuda_graph_bs_prefill"))
            or s.count("cuda_graph_max_bs_prefill") is not None,
        )

    @classmethod
    def offline(cls, ranks: int, model_path: str | None, config: dict | None) -> ServerFacts:
        """What traces recorded earlier leave known without a server: the ranks that wrote,
        and the model's architectures when its config.json is given. The server arguments are
        not known: no bucket list (no padding), no attention backend or speculative mode."""
        c = _Fields(config or {}, "config.json")
        unknown = PhaseGraph("unknown", ())
        return cls(
            url=None,
            sglang_version="unknown",
            model_path=model_path or "",
            architectures=c.words("architectures"),
            model_type=c.text("model_type"),
            tp_size=ranks,
            pp_size=1,
            dp_size=1,
            attn_dp_size=1,
            mixed_chunk=None,
            chunked_prefill_size=None,
            dsv4_attn_backend=None,
            speculative_algorithm=None,
            context_parallel=False,
            hisparse=False,
            disable_cuda_graph=False,
            prefill_graph=unknown,
            decode_graph=unknown,
            launch_command=None,
        )

    def model_name(self) -> str:
        return ", ".join(self.architectures) or self.model_type or "unknown model"


class _Fields:
    """Typed reads of one JSON object the server sent: a field of another type than SGLang
    writes (`tp_size: "two"`) is one line naming it, never a traceback or a silent guess."""

    def __init__(self, data: object, where: str):
        self.data = data if isinstance(data, dict) else {}
        self.where = where

    def _wrong(self, key: str, what: str) -> AdviseError:
        return AdviseError(
            f"{self.where} field {key} is {self.data[key]!r}, not {what}: is this an SGLang "
            "0.5.23 server?"
        )

    def count(self, key: str) -> int | None:
        """A whole number, or None when absent or null."""
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._wrong(key, "an integer")
        return value

    def size(self, key: str) -> int:
        """A parallel size: 1 when absent, null or 0 (as SGLang's own defaults)."""
        return max(1, self.count(key) or 1)

    def flag(self, key: str) -> bool:
        value = self.data.get(key)
        if value is not None and not isinstance(value, bool):
            raise self._wrong(key, "true or false")
        return bool(value)

    def text(self, key: str) -> str | None:
        value = self.data.get(key)
        if value is not None and not isinstance(value, str):
            raise self._wrong(key, "a string")
        return value

    def words(self, key: str) -> tuple[str, ...]:
        value = self.data.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._wrong(key, "a list of strings")
        return tuple(value)

    def counts(self, key: str) -> tuple[int, ...]:
        value = self.data.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise self._wrong(key, "a list of integers")
        return tuple(value)

    def table(self, key: str) -> dict:
        value = self.data.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self._wrong(key, "an object")
        return value
