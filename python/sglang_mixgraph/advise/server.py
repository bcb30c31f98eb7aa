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

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

TIMEOUT_S = 10.0
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
)
ENDPOINT_KEYS = ("version", "launch_command")


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
    """HTTP calls to one SGLang server; `api_key` is sent as a bearer token."""

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = TIMEOUT_S):
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s

    def call(self, method: str, path: str, body: dict | None = None) -> Reply:
        """One request; any HTTP status comes back as a Reply, a network failure as an
        AdviseError."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                return Reply(r.status, r.read().decode(errors="replace"))
        except urllib.error.HTTPError as e:
            return Reply(e.code, e.read().decode(errors="replace"))
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            if isinstance(reason, TimeoutError):
                message = f"{self.url} did not answer {path} within {self.timeout_s:g} s"
            else:
                message = f"cannot reach {self.url}: {reason} (is an SGLang server there?)"
            raise AdviseError(message) from None

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


@dataclass(frozen=True)
class PhaseGraph:
    """One phase's CUDA graph as the server resolved it: backend ("full", "breakable",
    "disabled") and the buckets it captures (or would, for a disabled phase)."""

    backend: str
    buckets: tuple[int, ...]

    @classmethod
    def read(cls, config: dict, phase: str) -> PhaseGraph:
        settings = config.get(phase) or {}
        return cls(str(settings.get("backend", "disabled")), tuple(settings.get("bs") or ()))


@dataclass(frozen=True)
class ServerFacts:
    """What advise reads of the deployment from the server's own answers. The attribute names
    the mixed split's deployment-wide fallbacks read (`model_type`, `dsv4_attn_backend`,
    `speculative_algorithm`, `context_parallel`, `hisparse`) are those of the planner's facts."""

    url: str
    sglang_version: str
    model_path: str
    architectures: tuple[str, ...]
    model_type: str | None
    tp_size: int
    pp_size: int
    dp_size: int
    attn_dp_size: int
    mixed_chunk: bool
    chunked_prefill_size: int | None
    dsv4_attn_backend: str | None
    speculative_algorithm: str | None
    context_parallel: bool
    hisparse: bool
    disable_cuda_graph: bool
    prefill_graph: PhaseGraph
    decode_graph: PhaseGraph
    launch_command: str | None

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
        s = server_info
        graphs = s.get("cuda_graph_config") or {}
        return cls(
            url=url,
            sglang_version=str(s.get("version", "unknown")),
            model_path=str(model_info.get("model_path") or s.get("model_path") or ""),
            architectures=tuple(model_info.get("architectures") or ()),
            model_type=model_info.get("model_type"),
            tp_size=int(s.get("tp_size") or 1),
            pp_size=int(s.get("pp_size") or 1),
            dp_size=int(s.get("dp_size") or 1),
            attn_dp_size=int(s.get("attn_dp_size") or 1),
            mixed_chunk=bool(s.get("enable_mixed_chunk")),
            chunked_prefill_size=s.get("chunked_prefill_size"),
            dsv4_attn_backend=s.get("dsv4_attn_backend"),
            speculative_algorithm=s.get("speculative_algorithm"),
            context_parallel=int(s.get("attn_cp_size") or 1) > 1
            or bool(s.get("enable_prefill_cp")),
            hisparse=bool(s.get("enable_hisparse")),
            disable_cuda_graph=bool(s.get("disable_cuda_graph")),
            prefill_graph=PhaseGraph.read(graphs, "prefill"),
            decode_graph=PhaseGraph.read(graphs, "decode"),
            launch_command=s.get("launch_command"),
        )

    def model_name(self) -> str:
        return ", ".join(self.architectures) or self.model_type or "unknown model"
