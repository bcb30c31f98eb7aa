"""One phase of the end-to-end run, in its own process: start ``sglang.Engine``, run the workload.

Usage (run_e2e.py starts it with the phase's environment): ``e2e_phase.py <kwargs.json> <out.json>``.
Writes ``{"ok", "error", "outputs": {rid: token ids}, "expected_lens", "abort_targets",
"finish_reasons", "spec", "timings"}`` to ``out.json``; ``spec`` holds, under speculative decoding,
each request's verify steps, accepted drafts and tokens (upstream's ``meta_info``);
``finish_reasons`` holds the finish type of each request the client aborts (``Engine.tokenizer_manager.abort_request`` once it has streamed its
``abort_after`` tokens). Greedy sampling, EOS ignored, token ids in and out (no tokenizer). After the last
request it waits three counter intervals so the scheduler logs its final counters (SGLang's
``Engine.shutdown`` may end the scheduler without its exit handlers).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import traceback

import e2e_workload as W


def _params(max_new: int) -> dict:
    return {"temperature": 0.0, "max_new_tokens": max_new, "ignore_eos": True}


def _logprob(r: W.Request) -> dict:
    return {"return_logprob": True} if r.logprob else {}


def _logprobs(output: dict) -> int:
    """Output-token logprobs of a finished request (cumulative in the last chunk, SGLang's
    default ``incremental_streaming_output`` off)."""
    return len((output.get("meta_info") or {}).get("output_token_logprobs") or ())


def _route(*reqs: W.Request) -> dict:
    """``routed_dp_rank`` for requests pinned to one attention-DP rank (one per call upstream)."""
    ranks = {r.dp_rank for r in reqs}
    if ranks == {None}:
        return {}
    if len(ranks) != 1:
        raise ValueError(f"one call, one DP rank: {sorted(ranks, key=str)}")
    return {"routed_dp_rank": ranks.pop()}


async def _stream_to_end(gen, first):
    last = first
    async for chunk in gen:
        last = chunk
    return last


async def _staggered(engine, seg: W.Segment) -> dict:
    """``first`` streamed; ``then`` sent once every ``first`` request has produced a token.
    The last output of each request, by rid."""
    streams = [
        await engine.async_generate(
            input_ids=list(r.prompt),
            sampling_params=_params(r.max_new),
            stream=True,
            **_route(r),
            **_logprob(r),
        )
        for r in seg.first
    ]
    firsts = [await s.__anext__() for s in streams]  # each of them is decoding now
    late = [
        asyncio.ensure_future(
            engine.async_generate(
                input_ids=list(r.prompt),
                sampling_params=_params(r.max_new),
                **_route(r),
                **_logprob(r),
            )
        )
        for r in seg.then
    ]
    done_first = await asyncio.gather(
        *[_stream_to_end(s, f) for s, f in zip(streams, firsts, strict=False)]
    )
    done_late = await asyncio.gather(*late)
    return dict(
        zip(
            (r.rid for r in seg.first + seg.then),
            list(done_first) + list(done_late),
            strict=False,
        )
    )


def spec_counts(output: dict) -> dict | None:
    """A finished request's speculative counts, as upstream reports them in ``meta_info``
    (``TokenizerManager._calculate_spec_decoding_metrics``: set at the finish, with at least
    one verify step), or None: verify steps, accepted draft tokens, tokens generated."""
    meta = output.get("meta_info") or {}
    if "spec_verify_ct" not in meta:
        return None
    return {
        "verify_ct": int(meta["spec_verify_ct"]),
        "correct_drafts": int(meta.get("spec_num_correct_drafts", 0)),
        "tokens": int(meta.get("completion_tokens", len(output.get("output_ids") or ()))),
    }


async def _stream(engine, r: W.Request, started: asyncio.Event):
    """One streamed request to its end: (its tokens, its finish type). Aborted by the client once
    it has streamed ``r.abort_after`` tokens; ``started`` is set at its first chunk."""
    tokens, finish, abort_sent = [], None, False
    try:
        gen = await engine.async_generate(
            input_ids=list(r.prompt),
            sampling_params=_params(r.max_new),
            stream=True,
            rid=r.rid,
            **_route(r),
        )
        async for chunk in gen:
            ids = list(chunk.get("output_ids") or ())
            tokens = ids if len(ids) >= len(tokens) else tokens  # cumulative chunks
            reason = (chunk.get("meta_info") or {}).get("finish_reason")
            finish = reason.get("type") if isinstance(reason, dict) else reason
            started.set()
            if r.abort_after is not None and not abort_sent and len(tokens) >= r.abort_after:
                engine.tokenizer_manager.abort_request(rid=r.rid)
                abort_sent = True
    except Exception as e:  # an aborted stream may end in an error: that is its finish
        finish = f"error: {type(e).__name__}: {e}"[:300]
    finally:
        started.set()
    return tokens, finish


async def _with_aborts(engine, seg: W.Segment) -> tuple:
    """Like ``_staggered``, with every ``first`` request streamed to its end or its abort:
    (tokens per request, finish type per aborted request)."""
    started = {r.rid: asyncio.Event() for r in seg.first}
    streams = [asyncio.ensure_future(_stream(engine, r, started[r.rid])) for r in seg.first]
    await asyncio.gather(*(e.wait() for e in started.values()))
    late = [
        asyncio.ensure_future(
            engine.async_generate(
                input_ids=list(r.prompt), sampling_params=_params(r.max_new), **_route(r)
            )
        )
        for r in seg.then
    ]
    done_first = await asyncio.gather(*streams)
    done_late = await asyncio.gather(*late)
    outputs = {r.rid: toks for r, (toks, _) in zip(seg.first, done_first, strict=True)}
    outputs.update({r.rid: list(o["output_ids"]) for r, o in zip(seg.then, done_late, strict=True)})
    finishes = {
        r.rid: fin for r, (_, fin) in zip(seg.first, done_first, strict=True) if r.abort_after
    }
    return outputs, finishes


def run(engine_kwargs: dict) -> dict:
    import sglang as sgl

    res: dict = {"ok": False, "timings": {}}
    # Under attention DP SGLang splits the chunk among the ranks (parallel_hook).
    dp = int(engine_kwargs.get("attn_dp_size", 1))
    segments = W.build(
        chunk=int(engine_kwargs.get("chunked_prefill_size", 256)) // dp,
        workload=os.environ.get("MIXGRAPH_E2E_WORKLOAD", "full"),
        dp=dp,
        spec=bool(engine_kwargs.get("speculative_algorithm")),
    )
    res["expected_lens"] = {r.rid: r.max_new for r in W.all_requests(segments)}
    res["abort_targets"] = W.abort_targets(segments)
    finish_reasons, spec, logprobs = {}, {}, {}
    t0 = time.time()
    engine = sgl.Engine(**engine_kwargs)
    res["timings"]["engine_start_s"] = round(time.time() - t0, 1)
    outputs = {}
    for seg in segments:
        t0 = time.time()
        if any(r.abort_after is not None for r in seg.first):
            outs, finishes = engine.loop.run_until_complete(_with_aborts(engine, seg))
            outputs.update(outs)
            finish_reasons.update(finishes)
        else:
            if seg.then:
                last = engine.loop.run_until_complete(_staggered(engine, seg))
            else:
                outs = engine.generate(
                    input_ids=[list(r.prompt) for r in seg.first],
                    sampling_params=[_params(r.max_new) for r in seg.first],
                    **_route(*seg.first),
                )
                last = {r.rid: o for r, o in zip(seg.first, outs, strict=False)}
            outputs.update({rid: list(o["output_ids"]) for rid, o in last.items()})
            spec.update({rid: c for rid, o in last.items() if (c := spec_counts(o)) is not None})
            asked = {r.rid for r in seg.first + seg.then if r.logprob}
            logprobs.update({rid: _logprobs(o) for rid, o in last.items() if rid in asked})
        res["timings"][f"{seg.name}_s"] = round(time.time() - t0, 2)
    res["outputs"] = outputs
    res["finish_reasons"] = finish_reasons
    res["spec"] = spec
    res["logprobs"] = logprobs
    interval = float(os.environ.get("SGLANG_MIXGRAPH_COUNTERS_LOG_INTERVAL") or 0)
    time.sleep(3 * interval)
    res["ok"] = True
    try:
        engine.shutdown()
    except Exception as e:  # the tokens are in; a shutdown error is reported, not fatal
        res["shutdown_error"] = f"{type(e).__name__}: {e}"
    return res


def main() -> None:
    kwargs_path, out_path = sys.argv[1], sys.argv[2]
    t0 = time.time()
    try:
        with open(kwargs_path) as f:
            res = run(json.load(f))
    except BaseException as e:  # report every failure as data, never hang the driver
        res = {
            "ok": False,
            "error": f"{type(e).__name__}: {e}"[:3000],
            "traceback": traceback.format_exc()[-6000:],
        }
    res["wall_s"] = round(time.time() - t0, 1)
    with open(out_path, "w") as f:
        json.dump(res, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # leftover Engine threads/processes must not keep the phase alive


if __name__ == "__main__":
    main()
