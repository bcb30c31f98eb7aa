"""How a command reaches a running SGLang server: its URL and SGLang's own load client.

`url_problem` says why a URL cannot reach a server (an http(s) URL with a host), as `ab`
checks an arm's `url` and `advise` its `--url`. `BENCH_MODULE` is the load client both run
against the server (`python -m sglang.benchmark.serving`, which `sglang.bench_serving` now
forwards to): `ab` for each cell (ab/tools.py), `advise` while it records a profile
(advise/capture.py). Neither command imports the other: what they share lives here.
"""

from __future__ import annotations

import urllib.parse

BENCH_MODULE = "sglang.benchmark.serving"


def url_problem(url: str) -> str | None:
    """Why `url` cannot reach a server (None: it can): an http(s) URL with a host."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018  (raises on a port outside 0-65535)
    except ValueError as e:
        return f"not a valid URL ({e})"
    if parts.scheme not in ("http", "https"):
        # "localhost:30000" parses as scheme "localhost": urllib would never connect.
        return f"give the scheme, e.g. http://{url}" if "://" not in url else "use http or https"
    if not parts.hostname:
        return "no host in it"
    return None
