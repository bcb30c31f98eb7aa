"""The server over HTTP (advise/server.py): the fields read from `/server_info` exist in SGLang's
own resolution and mean what advise takes them for; every failure of a call is one line."""

from __future__ import annotations

import os
import socket

import pytest
from advise_standin import Standin, recorded_server_info

from sglang_mixgraph.advise.server import (
    ENDPOINT_KEYS,
    RESOLVED_KEYS,
    AdviseError,
    Server,
    ServerFacts,
)
from sglang_mixgraph.resolution.presets import DSV4_PRO

DSV4 = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4"}


@pytest.fixture(scope="module")
def reference_resolution():
    """SGLang's resolution of the reference DeepSeek-V4 launch (8 ranks, attention DP 8)."""
    from sglang_mixgraph.resolution.resolve import resolve

    saved = {k: os.environ.get(k) for k in DSV4_PRO.env}
    os.environ.update(DSV4_PRO.env)
    try:
        return resolve(list(DSV4_PRO.argv), "H200").resolved
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def test_the_fields_read_are_sglangs_resolved_arguments(reference_resolution):
    resolved = reference_resolution
    assert set(RESOLVED_KEYS) <= set(resolved)
    full = {**resolved, "version": "0.5.23", "launch_command": "python -m sglang.launch_server"}
    trimmed = {k: full[k] for k in (*RESOLVED_KEYS, *ENDPOINT_KEYS)}
    facts = ServerFacts.read("http://x", full, DSV4)
    assert facts == ServerFacts.read("http://x", trimmed, DSV4)  # reads nothing else
    assert (facts.tp_size, facts.attn_dp_size, facts.expected_traces) == (8, 8, 8)
    assert facts.mixed_chunk and facts.chunked_prefill_size == 2816  # per rank
    assert facts.prefill_graph.backend == "disabled"  # SGLang's DeepSeek-V4 rule
    assert 2816 in facts.prefill_graph.buckets and facts.decode_graph.backend == "full"
    assert facts.dsv4_attn_backend == "flashmla" and facts.deepseek_v4 and not facts.glm5
    assert not (facts.context_parallel or facts.hisparse or facts.disable_cuda_graph)


def test_the_recorded_server_info_is_a_two_rank_deployment():
    facts = ServerFacts.read("http://x", recorded_server_info(), DSV4)
    assert (facts.tp_size, facts.attn_dp_size, facts.expected_traces) == (2, 2, 2)
    assert facts.sglang_version == "0.5.23" and "--tp 2" in facts.launch_command


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_url_that_does_not_answer_is_one_line():
    with pytest.raises(AdviseError) as e:
        Server(f"http://127.0.0.1:{_closed_port()}").get_json("/server_info")
    assert "cannot reach http://127.0.0.1:" in str(e.value) and "\n" not in str(e.value)


def test_a_server_that_is_not_sglang_and_one_that_wants_a_key():
    with Standin("idle_h200", "elsewhere", {}, DSV4) as standin:  # it writes no trace
        server = Server(standin.url)
        with pytest.raises(AdviseError, match="is not an SGLang 0.5.23 server: GET /nothing"):
            server.get_json("/nothing")
        assert server.get_json("/model_info") == DSV4
        assert server.call("POST", "/start_profile", {"a": 1}).status == 200
        assert standin.requests[-1] == ("POST", "/start_profile", {"a": 1})


def test_a_bearer_key_is_sent_and_a_slow_server_times_out():
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen = []
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            if self.path == "/slow":
                release.wait(5)
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        with pytest.raises(AdviseError, match="refused GET /server_info .HTTP 401.: give its key"):
            Server(url, api_key="k").get_json("/server_info")
        assert seen == ["Bearer k"]
        with pytest.raises(AdviseError, match="did not answer /slow within 0.2 s"):
            Server(url, timeout_s=0.2).get_json("/slow")
    finally:
        release.set()
        httpd.shutdown()
        httpd.server_close()


def test_a_real_servers_arguments_read_as_advise_read_them_there():
    """The server arguments a real SGLang 0.5.23 server logged (one H100, a tiny DeepSeek-V4,
    breakable prefill graph) give the facts advise printed from its /server_info then."""
    import json
    from pathlib import Path

    real = json.loads((Path(__file__).parent / "real_h100_tiny_dsv4.json").read_text())
    expected = real["advise_server"]
    model_info = {
        "architectures": expected["architectures"],
        "model_path": "<device-tmp>/tiny_dsv4",
    }
    facts = ServerFacts.read(expected["url"], real["server_info"], model_info)
    assert (facts.tp_size, facts.pp_size, facts.dp_size, facts.attn_dp_size) == (1, 1, 1, 1)
    assert facts.mixed_chunk is True and facts.speculative_algorithm is None
    assert facts.prefill_graph.backend == expected["prefill_graph"]["backend"] == "breakable"
    assert list(facts.prefill_graph.buckets) == expected["prefill_graph"]["buckets"]
    assert list(facts.decode_graph.buckets) == expected["decode_graph"]["buckets"]
    assert facts.deepseek_v4 and facts.expected_traces == 1
