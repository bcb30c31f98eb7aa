"""The requests done during a load cell, read from the progress bar bench_serving draws.

The bars here are drawn by tqdm itself into a log, as bench_serving draws its own
(`tqdm(total=N)` updated once per finished request); what is not surely that bar shows no
count rather than a wrong one.
"""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from sglang_mixgraph.ab.progress import TRY_HEADER, requests_done


def _draw(log: Path, done: int, total: int, desc: str | None = None) -> None:
    with open(log, "a") as f:
        bar = tqdm(total=total, file=f, desc=desc, mininterval=0, ascii=desc is not None)
        for _ in range(done):
            bar.update(1)
        # Left open: a running cell's bar has no closing newline yet.


def test_the_last_bar_of_the_measured_requests_is_read(tmp_path):
    log = tmp_path / "cell.log"
    log.write_text(
        f"{TRY_HEADER}sglang.benchmark.serving ...\nStarting warmup with 2 sequences...\n"
    )
    assert requests_done(log) is None  # warm-up: no bar yet
    _draw(log, 0, 0, desc="Generating shared-prefix prompts")  # another bar: not counted
    assert requests_done(log) is None
    with open(log, "a") as f:
        f.write("Warmup completed with 2 sequences. Starting main benchmark run...\n")
    _draw(log, 412, 1024)
    assert requests_done(log) == (412, 1024)
    with open(log, "a") as f:
        f.write("\r 41%|####      | 41")  # cut off mid-write: the complete bar before it counts
    assert requests_done(log) == (412, 1024)


def test_what_is_not_surely_the_bar_shows_no_count(tmp_path):
    log = tmp_path / "cell.log"
    log.write_text(" 90%|#########  | 1/10 [00:01<00:09,  1.00it/s]\n")  # 90% is not 1 of 10
    assert requests_done(log) is None
    log.write_text("  0%|          | 12/10 [00:01<?, ?it/s]\n")
    assert requests_done(log) is None
    log.write_text("3it [00:01,  2.90it/s]\n")  # no total
    assert requests_done(log) is None
    assert requests_done(tmp_path / "missing.log") is None and requests_done(None) is None
    # A retry starts afresh: the previous try's bar is not this one's.
    log.write_text("")
    _draw(log, 7, 8)
    with open(log, "a") as f:
        f.write(
            f"\n{TRY_HEADER}sglang.benchmark.serving ...\nStarting warmup with 2 sequences...\n"
        )
    assert requests_done(log) is None
