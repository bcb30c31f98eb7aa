"""The rank-slice harness without a GPU: arms, the reference per-rank shape, pool sizing, the step
probe's shape and kernel-table readers, and the driver's step summary (tools/rank-slice)."""

from __future__ import annotations

import json
import time
import types
from pathlib import Path

import pytest
from tool_scripts import load

SLICE = Path(__file__).resolve().parents[2] / "tools" / "rank-slice"


A = load("slice_arms")
probe = load("slice_probe")


def kwargs(arm, **kw):
    base = dict(requests=256, input_len=2048, output_len=128, radix=True, context_length=8192)
    base.update(kw)
    return A.engine_kwargs("/m", A.ARMS[arm], **base)


def test_arms_differ_only_in_their_own_settings():
    common = kwargs("upstream")
    assert common["chunked_prefill_size"] == 2816 and common["max_running_requests"] == 256
    assert common["enable_mixed_chunk"] and not common["disable_radix_cache"]
    assert "cuda_graph_backend_prefill" not in common  # resolution decides for upstream/installed
    assert A.ARMS["upstream"].env == {"SGLANG_PLUGINS": "none"}
    assert A.ARMS["installed"].env == {} and kwargs("installed") == common
    for name, arm in A.ARMS.items():
        extra = {k: v for k, v in kwargs(name).items() if common.get(k) != v}
        assert set(extra) == set(arm.engine), name
    assert kwargs("bcg-split-rd-always")["cuda_graph_backend_prefill"] == "breakable"
    for eager in ("split-eager", "split-eager-adaptive"):
        assert kwargs(eager)["cuda_graph_backend_prefill"] == "disabled"
    assert A.ARMS["split-eager-adaptive"].env["SGLANG_MIXGRAPH_SPLIT_POLICY"] == "adaptive"


def test_probe_and_ab_configuration_leave_the_same_room_for_the_capture():
    import tomllib

    config = tomllib.loads((SLICE / "ab_slice.toml").read_text())
    args = config["server"]["args"]
    fraction = float(args[args.index("--mem-fraction-static") + 1])
    assert kwargs("bcg-auto-lw")["mem_fraction_static"] == fraction == A.MEM_FRACTION


def test_every_arm_flag_is_a_plugin_or_sglang_flag():
    """A misspelt flag would leave an arm silently equal to another."""
    from sglang.srt.environ import envs

    from sglang_mixgraph.patches import all_patches

    known = {f.name for p in all_patches() for f in p.flags} | {"SGLANG_PLUGINS"}
    for name, arm in A.ARMS.items():
        assert all(k in known or hasattr(envs, k) for k in arm.env), name
    assert A.ARMS["bcg-auto-lw"].env == dict(
        A.ARMS["bcg-auto-1s"].env, SGLANG_OPT_DSV4_BCG_LIVE_WIDTH_INDEXER="1"
    )
    assert A.ARMS["bcg-auto-1s"].env == dict(
        A.ARMS["bcg-auto"].env, SGLANG_OPT_USE_MULTI_STREAM_OVERLAP="0"
    )
    assert A.ARMS["bcg-auto-held"].env == dict(
        A.ARMS["bcg-auto"].env, SGLANG_MIXGRAPH_BCG_HOLD_BREAK_INPUTS="1"
    )
    assert A.ARMS["bcg-split-rd-lw"].env == dict(
        A.ARMS["bcg-split-rd-always"].env,
        SGLANG_OPT_DSV4_BCG_LIVE_WIDTH_INDEXER="1",
        SGLANG_OPT_USE_MULTI_STREAM_OVERLAP="0",
    )


def test_context_cut_arm_uses_the_workloads_longest_context_page_aligned():
    assert (
        kwargs("bcg-auto-ctx", input_len=2048, output_len=24)["cuda_graph_prefill_max_context"]
        == 2304
    )
    assert (
        kwargs("bcg-auto-ctx", input_len=8192, output_len=256, context_length=16384)[
            "cuda_graph_prefill_max_context"
        ]
        == 8448
    )


def test_pools_hold_every_request_and_the_swa_windows():
    for requests, inp, out in ((256, 2048, 128), (256, 8192, 256), (48, 2048, 24)):
        p = A.pool_sizes(requests, inp, out)
        assert p["max_total_tokens"] >= requests * (inp + out)
        swa = p["max_total_tokens"] * p["swa_full_tokens_ratio"]
        # each running request holds up to two SWA pages; two chunks are in flight
        assert swa >= min(requests, 256) * 2 * 256 + 2 * 2816
        assert 0 < p["swa_full_tokens_ratio"] <= 1
    # upstream's default ratio (0.1) of the 700k-token pool of the first run ran out at 173 rows
    assert 0.1 * 700_000 < 256 * 2 * 256


def test_a_shared_prefix_is_pooled_once_and_every_request_still_fits():
    alone = A.pool_sizes(272, 8192, 200)
    shared = A.pool_sizes(272, 8192, 200, shared_prefix=6144)
    # each request owns its unshared tokens (page-ceiled, plus a page); the prefix is held once
    assert shared["max_total_tokens"] >= 272 * (8192 + 200 - 6144) + 6144
    assert shared["max_total_tokens"] < alone["max_total_tokens"] / 3
    # a prefix that ends inside a page shares only its whole pages
    assert A.pool_sizes(64, 1024, 8, shared_prefix=300) == A.pool_sizes(64, 1024, 8, 256)
    assert A.pool_sizes(64, 1024, 8, 256) != A.pool_sizes(64, 1024, 8, 512)
    # the Engine's pool follows the prefix only where the radix cache can share it
    arm = A.ARMS["upstream"]
    kw = dict(requests=272, input_len=8192, output_len=200, context_length=8448)
    on = A.engine_kwargs("/m", arm, radix=True, shared_prefix=6144, **kw)
    off = A.engine_kwargs("/m", arm, radix=False, shared_prefix=6144, **kw)
    assert on["max_total_tokens"] == shared["max_total_tokens"]
    assert off["max_total_tokens"] == alone["max_total_tokens"]


def test_unknown_arm_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown arm"):
        A.parse(["upstream", "fast"])


def _batch(ext, seqs, rows):
    cpu = types.SimpleNamespace
    return cpu(
        extend_seq_lens_cpu=ext,
        seq_lens_cpu=_Seq(seqs),
        batch_size=len(ext),
        input_ids=cpu(shape=(rows,)),
    )


class _Seq(list):
    def max(self):
        return max(self)


def test_step_shape_counts_trailing_decode_rows():
    shape = probe.step_shape(_batch([2560, 1, 1, 1], [2560, 900, 40, 2000], 2563))
    assert shape == {
        "bs": 4,
        "rows": 2563,
        "n_dec": 3,
        "prefill_tokens": 2560,
        "seq_max": 2560,
    }
    # a decode row in the middle is not a trailing one (upstream puts decode rows last)
    assert probe.step_shape(_batch([1, 2560, 1], [9, 2560, 9], 2562))["n_dec"] == 1


def test_kernel_table_sums_device_time_by_name():
    ev = types.SimpleNamespace
    events = [
        ev(name="gemm", device_type="DeviceType.CUDA", device_time_total=2000.0),
        ev(name="gemm", device_type="DeviceType.CUDA", device_time_total=1000.0),
        ev(name="copy", device_type="DeviceType.CUDA", device_time_total=500.0),
        ev(name="aten::mm", device_type="DeviceType.CPU", device_time_total=9000.0),
    ]
    table = probe.kernel_table(types.SimpleNamespace(events=lambda: events))
    assert table["kernel_ms_total"] == 3.5
    assert table["kernels"][0] == {"name": "gemm", "ms": 3.0, "count": 2}
    assert [k["name"] for k in table["kernels"]] == ["gemm", "copy"]


def test_driver_summarizes_steps_by_kind():
    drv = load("run_slice_probe")
    steps = [
        {
            "mode": "MIXED",
            "graph": True,
            "host_ms": 30,
            "wall_ms": 900,
            "n_dec": 20,
            "prefill_tokens": 2560,
        },
        {
            "mode": "MIXED",
            "graph": True,
            "host_ms": 50,
            "wall_ms": 1000,
            "n_dec": 30,
            "prefill_tokens": 2560,
        },
        {
            "mode": "DECODE",
            "graph": True,
            "host_ms": 2,
            "wall_ms": 37,
            "n_dec": None,
            "prefill_tokens": None,
        },
    ]
    s = drv.step_summary(steps)
    assert set(s) == {"MIXED/graph", "DECODE/graph"}
    assert s["MIXED/graph"]["wall_ms"]["median"] == 950 and s["MIXED/graph"]["wall_ms"]["n"] == 2
    assert s["MIXED/graph"]["decode_rows"]["sum"] == 50
    assert "decode_rows" not in s["DECODE/graph"]
    # records of a probe without the GC meter: no GC summary
    assert "gc_ms" not in s["MIXED/graph"]
    for i, r in enumerate(steps):
        r.update(gc_ms=[4.0, 10.0, 0.0][i], gc_full=[0, 1, 0][i])
    s = drv.step_summary(steps)
    assert s["MIXED/graph"]["gc_ms"]["sum"] == 14.0 and s["MIXED/graph"]["gc_full"]["sum"] == 1


def test_gc_pauses_sum_the_collectors_pauses_and_count_full_collections():
    import gc

    was_enabled = gc.isenabled()
    gc.disable()  # only the two collections below
    pauses = probe.GcPauses().install()
    try:
        junk = [[i] for i in range(50_000)]
        gc.collect(0)
        gc.collect(2)
        del junk
    finally:
        gc.callbacks.remove(pauses)
        if was_enabled:
            gc.enable()
    assert pauses.full == 1 and pauses.ms > 0
    # a stop without its start (the meter installed mid-collection) adds nothing
    before = pauses.ms
    pauses("stop", {"generation": 2})
    assert (pauses.ms, pauses.full) == (before, 1)


def test_thread_meter_tells_work_from_waiting():
    """A busy step raises the thread's CPU time with its host time; a step that blocks (a
    device sync, a lock) raises host time and voluntary switches, not CPU time."""
    import time

    meter = probe.ThreadMeter()
    before = meter.read()
    c0 = time.thread_time()
    while time.thread_time() - c0 < 0.05:  # 50 ms of this thread's CPU, however loaded the box
        pass
    busy = meter.delta(before, meter.read())
    before = meter.read()
    time.sleep(0.05)
    waited = meter.delta(before, meter.read())
    assert busy["cpu_ms"] >= 50 and waited["cpu_ms"] < 10
    assert waited["vcsw"] >= 1
    if busy["runq_ms"] is not None:  # Linux: nanoseconds read, reported in ms
        assert 0 <= waited["runq_ms"] < 1000
    # no run queue where /proc cannot be read: None, never a made-up 0
    assert meter.delta((0.0, None, 0, 0), (0.001, 5, 1, 0))["runq_ms"] is None


def test_step_summary_and_series_carry_the_thread_meter():
    drv = load("run_slice_probe")
    rows = [
        {
            "mode": "MIXED",
            "graph": False,
            "host_ms": h,
            "wall_ms": h + 1,
            "n_dec": 2,
            "prefill_tokens": 8,
            "cpu_ms": c,
            "runq_ms": 0.5,
            "vcsw": 1,
            "ivcsw": 0,
        }
        for h, c in ((300.0, 290.0), (480.0, 295.0), (310.0, 300.0))
    ]
    s = drv.step_summary(rows)["MIXED/eager"]
    assert s["cpu_ms"]["median"] == 295.0 and s["runq_ms"]["sum"] == 1.5 and s["vcsw"]["n"] == 3
    assert drv.mixed_series(rows)["host_ms"] == [300.0, 480.0, 310.0]
    assert drv.mixed_series(rows)["cpu_ms"] == [290.0, 295.0, 300.0]
    assert drv.mixed_series(rows)["alloc_retries"] == [None, None, None]  # an older probe
    rows[1]["runq_ms"] = None  # one step without /proc: no run-queue summary at all
    assert "runq_ms" not in drv.step_summary(rows)["MIXED/eager"]


def test_allocator_delta_counts_the_device_calls_of_a_step():
    before = probe.allocator_counts({"num_alloc_retries": 2, "num_device_alloc": 10})
    after = probe.allocator_counts(
        {"num_alloc_retries": 3, "num_device_alloc": 14, "num_device_free": 4, "other": 9}
    )
    assert before["num_device_free"] == 0  # a counter the reading lacks counts from 0
    assert probe.allocator_delta(before, after) == {
        "alloc_retries": 1,
        "device_alloc": 4,
        "device_free": 4,
    }


def test_ab_configuration_selects_the_kits_kernels_like_the_probe():
    """ab_slice.toml spells the kit's kernel selection out in TOML; it must stay the probe's."""
    import tomllib

    drv = load("run_slice_probe")
    server = tomllib.loads((SLICE / "ab_slice.toml").read_text())["server"]
    env = dict(server["env"])
    # The one addition: counters every 10 s, since a server ab stops logs no exit line.
    assert env.pop("SGLANG_MIXGRAPH_COUNTERS_LOG_INTERVAL") == "10"
    assert env == {**drv.KERNEL_ENV["standin"], drv.RADIX_CORE_ENV: "python"}
    assert server["launch_prefix"] == ["bash", "tools/rank-slice/kit_server.sh"]


def test_step_mix_counts_sglangs_scheduler_lines_by_kind_and_graph():
    mix = load("step_mix")
    head = "[2026-12-01 15:00:00] "
    pre = (
        "Prefill batch, #new-seq: {s}, #new-token: {t}, #cached-token: 0, token usage: 0.10, "
        "#running-req: {r}, #queue-req: 3, #pending-token: 0, cuda graph: {g}, "
        "input throughput (token/s): 1.00"
    )
    dec = (
        "Decode batch, #running-req: {r}, #token: 9, token usage: 0.1, cuda graph: {g}, "
        "gen throughput (token/s): 2.00, #queue-req: 0"
    )
    lines = [
        head + pre.format(s=2, t=2560, r=0, g=False),
        head + pre.format(s=1, t=2560, r=7, g=False),
        head + pre.format(s=1, t=2000, r=12, g=True),
        head + dec.format(r=12, g=True),
        head + dec.format(r=3, g=False),
        head + "an unrelated line with #running-req: 5,",
    ]
    s = mix.step_mix(lines)
    assert s["steps"] == {
        "DECODE/eager": 1,
        "DECODE/graph": 1,
        "EXTEND/eager": 1,
        "MIXED/eager": 1,
        "MIXED/graph": 1,
    }
    assert s["total"] == 5 and s["mixed_share"] == 0.4
    assert s["prefill_tokens"] == {"EXTEND": 2560, "MIXED": 4560}
    assert s["mixed_decode_rows"] == {"median": 12, "max": 12}
    assert mix.step_mix([])["mixed_share"] is None


@pytest.mark.parametrize(
    "name", ["ab_slice.toml", "ab_faithful.toml", "ab_fp8_lean.toml", "ab_fp8_8k.toml"]
)
def test_ab_arms_set_the_probe_arms_flags(name):
    """An ab arm and the probe arm of the same name must be the same configuration."""
    import tomllib

    config = tomllib.loads((SLICE / name).read_text())
    for arm in config["arm"]:
        assert arm.get("env", {}) == A.ARMS[arm["name"]].env, arm["name"]


@pytest.mark.parametrize(
    "name, fp8_gemm",
    [("ab_faithful.toml", None), ("ab_fp8_lean.toml", "torch"), ("ab_fp8_8k.toml", "torch")],
)
def test_faithful_ab_configuration_selects_the_probes_faithful_kernels(name, fp8_gemm):
    """As the probe's `--kernels faithful` (and, for the FP8 slice, `--fp8-gemm torch`)."""
    import tomllib

    drv = load("run_slice_probe")
    server = tomllib.loads((SLICE / name).read_text())["server"]
    env = dict(server["env"])
    assert env.pop("SGLANG_MIXGRAPH_COUNTERS_LOG_INTERVAL") == "10"
    assert env.pop(drv.KIT_KERNELS_ENV) == "faithful"  # the Engine stand-ins' selection
    assert env.pop(drv.KIT_FP8_GEMM_ENV, None) == fp8_gemm
    assert env == {**drv.KERNEL_ENV["faithful"], drv.RADIX_CORE_ENV: "python"}
    args = server["args"]
    from sglang_mixgraph.kits.gpu_machine import KERNEL_ENGINE
    from sglang_mixgraph.resolution.plan_inputs import sglang_parser

    # the Engine's keyword is the field; the launch spells SGLang's option for it
    # (fp8_gemm_runner_backend is --fp8-gemm-backend)
    options = {a.dest: a.option_strings for a in sglang_parser()._actions}
    for key, value in KERNEL_ENGINE["faithful"].items():
        flag = next(f for f in options[key] if f in args)
        assert args[args.index(flag) + 1] == value, flag


def test_driver_compares_tokens_with_upstream_or_the_first_arm():
    drv = load("run_slice_probe")
    a, b, c = ({"outputs": o} for o in ([[1, 2], [3]], [[1, 2], [4]], [[1, 2], [3]]))
    assert drv.token_equality({"bcg-auto-1s": a, "bcg-auto-lw": b}) == [
        "tokens equal to bcg-auto-1s: bcg-auto-lw: 1/2 requests"
    ]
    assert drv.token_equality({"bcg-auto": b, "upstream": a, "installed": c}) == [
        "tokens equal to upstream: bcg-auto: 1/2 requests",
        "tokens equal to upstream: installed: 2/2 requests",
    ]
    assert drv.token_equality({"upstream": a}) == []


def test_driver_keeps_every_visit_of_a_repeated_arm_apart():
    """An A/B block names arms again; each visit gets its own key (directory, log, report entry),
    and a repeated upstream is compared with the first upstream like any other arm."""
    drv = load("run_slice_probe")
    keys = drv.visit_keys(["upstream", "bcg-auto", "bcg-auto", "upstream", "bcg-auto"])
    assert keys == ["upstream", "bcg-auto", "bcg-auto#2", "upstream#2", "bcg-auto#3"]
    a, b = {"outputs": [[1], [2]]}, {"outputs": [[1], [3]]}
    assert drv.token_equality({"upstream": a, "upstream#2": b}) == [
        "tokens equal to upstream: upstream#2: 1/2 requests"
    ]


def test_host_table_sums_self_cpu_time_and_counts_launches():
    ev = types.SimpleNamespace
    events = [
        ev(name="aten::copy_", device_type="DeviceType.CPU", self_cpu_time_total=300.0),
        ev(name="aten::copy_", device_type="DeviceType.CPU", self_cpu_time_total=200.0),
        ev(name="cudaLaunchKernel", device_type="DeviceType.CPU", self_cpu_time_total=50.0),
        ev(name="cudaGraphLaunch", device_type="DeviceType.CPU", self_cpu_time_total=20.0),
        ev(name="gemm", device_type="DeviceType.CUDA", self_cpu_time_total=0.0),
    ]
    table = probe.host_table(types.SimpleNamespace(events=lambda: events))
    assert table["host_self_ms_total"] == 0.57
    assert table["host_ops"][0] == {"name": "aten::copy_", "ms": 0.5, "count": 2}
    assert table["launches"]["cudaLaunchKernel"] == 1 and table["launches"]["cudaGraphLaunch"] == 1
    assert "gemm" not in [k["name"] for k in table["host_ops"]]
    # no metadata-only op in the region: no pace to report
    assert table["pace_us"] == {}


def test_host_table_paces_the_cpu_by_the_median_of_metadata_only_ops():
    ev = types.SimpleNamespace
    events = [
        ev(name="aten::view", device_type="DeviceType.CPU", self_cpu_time_total=t)
        for t in (1.0, 2.0, 9.0)
    ] + [
        ev(name="aten::empty", device_type="DeviceType.CPU", self_cpu_time_total=4.0),
        ev(name="aten::empty", device_type="DeviceType.CPU", self_cpu_time_total=6.0),
        ev(name="aten::mm", device_type="DeviceType.CPU", self_cpu_time_total=80.0),
    ]
    table = probe.host_table(types.SimpleNamespace(events=lambda: events))
    assert table["pace_us"] == {"aten::view": 2.0, "aten::empty": 5.0}


def test_dp_serves_that_many_reference_ranks_each_with_one_ranks_shape():
    one = kwargs("bcg-split-rd-always", requests=128)
    assert kwargs("bcg-split-rd-always", requests=128, dp=1) == one
    two = kwargs("bcg-split-rd-always", requests=256, dp=2)
    assert (two["tp_size"], two["attn_dp_size"]) == (2, 2)
    # SGLang divides the chunk and the running requests among the ranks: one rank's each
    assert two["chunked_prefill_size"] == 2 * A.CHUNK
    assert two["max_running_requests"] == 2 * A.RUNNING
    # each rank's pool holds its share of the requests, as one GPU's does for that many
    assert two["max_total_tokens"] == one["max_total_tokens"]
    assert two["swa_full_tokens_ratio"] == one["swa_full_tokens_ratio"]
    changed = {k for k in two if two[k] != one.get(k)}
    assert changed == {"tp_size", "attn_dp_size", "chunked_prefill_size", "max_running_requests"}


def test_driver_summarizes_steps_per_rank_only_under_dp():
    drv = load("run_slice_probe")
    row = {"graph": True, "host_ms": 1, "wall_ms": 2, "n_dec": 1, "prefill_tokens": 9}
    steps = [dict(row, mode="MIXED", dp_rank=0), dict(row, mode="IDLE", dp_rank=1)]
    by = drv.steps_by_rank(steps)
    assert set(by) == {"0", "1"} and set(by["1"]) == {"IDLE/graph"}
    assert by["0"]["MIXED/graph"]["wall_ms"]["n"] == 1
    assert drv.steps_by_rank([{k: v for k, v in s.items() if k != "dp_rank"} for s in steps]) == {}


def test_driver_sums_capture_memory_per_rank_only_under_dp():
    drv = load("run_slice_probe")
    rec = [
        {"size": 2816, "device_mib": 900.0, "seconds": 5.0, "dp_rank": 0},
        {"size": 16, "device_mib": 24.0, "seconds": 1.0, "dp_rank": 0},
        {"size": 2816, "device_mib": 880.0, "seconds": 4.5, "dp_rank": 1},
    ]
    assert drv.capture_by_rank(rec) == {
        "0": {"shapes": 2, "device_mib": 924.0, "seconds": 6.0},
        "1": {"shapes": 1, "device_mib": 880.0, "seconds": 4.5},
    }
    assert drv.capture_by_rank([{k: v for k, v in c.items() if k != "dp_rank"} for c in rec]) == {}


def test_a_process_names_its_rank_only_with_attention_dp(monkeypatch):
    from types import SimpleNamespace

    from sglang.srt import runtime_context as rc

    from sglang_mixgraph.kits.gpu_machine import dp_rank_fields

    assert {"attn_dp_enabled", "attn_dp_rank"} <= set(dir(rc.ParallelContext))  # 0.5.23's names
    monkeypatch.setattr(
        rc, "get_parallel", lambda: SimpleNamespace(attn_dp_enabled=True, attn_dp_rank=3)
    )
    assert dp_rank_fields() == {"dp_rank": 3}
    monkeypatch.setattr(
        rc, "get_parallel", lambda: SimpleNamespace(attn_dp_enabled=False, attn_dp_rank=0)
    )
    assert dp_rank_fields() == {}


def test_probe_engines_keep_nvlink_multicast_off(monkeypatch):
    from sglang_mixgraph.kits.gpu_machine import NO_MULTICAST_ENV

    drv = load("run_slice_probe")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    env = drv.arm_env(A.ARMS["bcg-split-rd-always"], "/tmp/p", "8", radix=True)
    assert {k: env[k] for k in NO_MULTICAST_ENV} == NO_MULTICAST_ENV
    assert env["SGLANG_OPT_DSV4_REPLAY_READ_DONE"] == "1"  # the arm's own flags still on top


def test_probe_arms_carry_the_fp8_gemm_choice_to_the_engine_standins():
    from sglang_mixgraph.kits.gpu_machine import KIT_FP8_GEMM_ENV

    drv = load("run_slice_probe")
    arm = A.ARMS["upstream"]
    assert drv.arm_env(arm, "/tmp/p", "8", radix=True)[KIT_FP8_GEMM_ENV] == "sglang"
    env = drv.arm_env(arm, "/tmp/p", "8", radix=True, fp8_gemm="torch")
    assert env[KIT_FP8_GEMM_ENV] == "torch"
    engine = (
        Path(__file__).resolve().parents[2] / "tools/gpu-upstream/engine/engine_standins.py"
    ).read_text()
    assert f'FP8_GEMM_ENV = "{KIT_FP8_GEMM_ENV}"' in engine  # the name the stand-ins read


def test_the_split_only_arm_differs_from_bcg_auto_by_the_split_alone():
    auto, split = A.ARMS["bcg-auto"], A.ARMS["bcg-split-always"]
    assert kwargs("bcg-split-always") == kwargs("bcg-auto")
    added = {k: v for k, v in split.env.items() if auto.env.get(k) != v}
    assert added == {A.SPLIT: "1", A.POLICY: "always"} and set(auto.env) <= set(split.env)


def test_the_tail_graph_arm_differs_from_the_split_only_arm_by_the_tail_graphs_alone():
    split, graphs = A.ARMS["bcg-split-always"], A.ARMS["bcg-split-tg"]
    assert kwargs("bcg-split-tg") == kwargs("bcg-split-always")
    assert graphs.env == {**split.env, A.TAIL_GRAPHS: "1"}


def test_probe_arms_log_their_counters_while_they_serve():
    """The probe reads each arm's patch counters from its log: with the interval at 0 they
    would come only at exit, which SGLang's Engine.shutdown can skip."""
    drv = load("run_slice_probe")
    env = drv.arm_env(A.ARMS["split-eager-adaptive"], "/tmp/p", "0", radix=True)
    assert float(env["SGLANG_MIXGRAPH_COUNTERS_LOG_INTERVAL"]) > 0


def test_shared_prefix_prompts_share_only_their_prefix():
    arm = load("slice_arm")
    wl = dict(requests=3, input_len=40, output_len=1, seed=7, vocab=1000)
    plain = arm.prompts(wl)
    shared = arm.prompts({**wl, "shared_prefix": 32})
    assert plain == arm.prompts({**wl, "shared_prefix": 0})  # older workloads keep their prompts
    assert all(len(p) == 40 for p in shared)
    assert shared[0][:32] == shared[1][:32] == shared[2][:32]
    assert len({tuple(p[32:]) for p in shared}) == 3
    assert len({tuple(p[:32]) for p in plain}) == 3


def test_plugin_not_found_names_the_egg_info_to_carry(monkeypatch):
    import importlib.metadata

    from sglang_mixgraph.kits import gpu_machine

    assert gpu_machine.plugin_not_found() is None  # pip install -e . wrote the entry point
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [])
    why = gpu_machine.plugin_not_found()
    assert "python/sglang_mixgraph.egg-info" in why and "\n" not in why


def test_the_chunk_reaches_the_engine_the_pool_and_every_dp_rank():
    assert kwargs("upstream") == kwargs("upstream", chunk=A.CHUNK)  # the default is the rank's
    small = kwargs("bcg-auto", chunk=1280)
    assert small["chunked_prefill_size"] == 1280
    assert {k for k in small if small[k] != kwargs("bcg-auto").get(k)} == {
        "chunked_prefill_size",
        "swa_full_tokens_ratio",  # two chunks in flight take less of the SWA pool
    }
    # a short burst's pool is the chunk's floor (four chunks), and the SWA pool holds two chunks
    for chunk in (1280, 2816, 4352):
        p = A.pool_sizes(2, 512, 8, chunk=chunk)
        assert p["max_total_tokens"] == 4 * chunk
        swa = p["max_total_tokens"] * p["swa_full_tokens_ratio"]
        assert swa >= 2 * 2 * A.PAGE + 2 * chunk
    two = kwargs("bcg-auto", chunk=4352, requests=512, dp=2)
    assert two["chunked_prefill_size"] == 2 * 4352  # SGLang divides it among the ranks


def test_the_probe_threads_chunk_from_its_command_line():
    drv = load("run_slice_probe")
    args = drv.parse_args(["upstream", "--requests", "272", "--output-len", "200"])
    assert args.chunk == A.CHUNK
    assert drv.visit_engine_kwargs(args, "/m", A.ARMS["upstream"]) == A.engine_kwargs(
        "/m",
        A.ARMS["upstream"],
        requests=272,
        input_len=2048,
        output_len=200,
        radix=True,
        context_length=8192,
    )
    args = drv.parse_args(["upstream", "--chunk", "2304", "--input-len", "8192"])
    kw = drv.visit_engine_kwargs(args, "/m", A.ARMS["upstream"])
    assert kw["chunked_prefill_size"] == 2304
    assert (
        kw["swa_full_tokens_ratio"]
        == A.pool_sizes(64, 8192, 32, chunk=2304)["swa_full_tokens_ratio"]
    )
    # a chunk that leaves no page of prefill next to the running requests' decode rows
    with pytest.raises(SystemExit):
        drv.parse_args(["upstream", "--chunk", str(A.RUNNING + A.PAGE - 1)])
    assert drv.parse_args(["upstream", "--chunk", str(A.RUNNING + A.PAGE)]).chunk == 512


def test_a_profiled_step_records_its_export_time_apart_from_its_timed_window(tmp_path, monkeypatch):
    """The profiled step's trace is written after its wall is read: the export's seconds land in
    `export_s`, the driver sums them, and an unprofiled step carries none."""
    import gc

    import torch

    monkeypatch.setenv("SLICE_PROBE_DIR", str(tmp_path))
    monkeypatch.setenv("SLICE_PROFILE_MIXED", "2")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda *a: {})
    monkeypatch.setattr(gc, "callbacks", [])  # the probe's collector meter stays in this test
    monkeypatch.setattr(probe, "_class_table", lambda prof, path: time.sleep(0.3) or {})

    class Runner:
        def forward(self, forward_batch):
            return types.SimpleNamespace(can_run_graph=False, x=torch.ones(4) * 2)

    module = types.SimpleNamespace(ModelRunner=Runner)
    probe._wrap_forward(module)
    batch = types.SimpleNamespace(
        forward_mode=types.SimpleNamespace(name="MIXED"),
        extend_seq_lens_cpu=[8, 1],
        seq_lens_cpu=torch.tensor([8, 9]),
        batch_size=2,
        input_ids=torch.zeros(9),
    )
    for _ in range(3):
        Runner().forward(batch)
    rows = [json.loads(x) for x in next(tmp_path.glob("steps_*.jsonl")).read_text().splitlines()]
    assert [r.get("profiled") for r in rows] == [None, "2", None]
    assert "export_s" not in rows[0] and "export_s" not in rows[2]
    assert rows[1]["export_s"] >= 0.3 and rows[1]["wall_ms"] < 300  # the export is outside
    assert load("run_slice_probe").profile_export_s(rows) == rows[1]["export_s"]


def test_the_real_server_advise_run_serves_ab_slices_server_with_sglangs_breakable_graph():
    """One source for the slice's server: `advise_real.py` launches it with ab's own launcher
    from ab_slice.toml (prefix, arguments, kit environment), adding only the breakable prefill
    graph, and bounds the health wait by its budget."""
    import tomllib

    from sglang_mixgraph.ab.server import launch_argv

    real = load("advise_real")
    toml = tomllib.loads((SLICE / "ab_slice.toml").read_text())["server"]
    config, arm = real.slice_server(Path("/m"), 123.0)
    cmd = launch_argv(config, arm)
    assert cmd[: len(toml["launch_prefix"])] == toml["launch_prefix"]
    assert cmd[cmd.index("--model-path") + 1] == "/m"
    assert " ".join(toml["args"]) in " ".join(cmd)
    assert cmd[cmd.index("--cuda-graph-backend-prefill") + 1] == "breakable"
    assert dict(config.server.env) == toml["env"] and not arm.env
    assert config.server.health_timeout_s == 123.0
    assert "SGLANG_PLUGINS" not in toml["env"]  # the plugin is loaded, as a user has it


def test_the_real_server_advise_run_serves_an_arm_a_serving_ab_measured():
    import tomllib

    from sglang_mixgraph.ab.server import launch_argv

    real = load("advise_real")
    lean = SLICE / "ab_fp8_lean.toml"
    toml = tomllib.loads(lean.read_text())
    config, arm = real.slice_server(Path("/m"), 60.0, lean, "upstream")
    cmd = launch_argv(config, arm)
    assert cmd[cmd.index("--chunked-prefill-size") + 1] == "1280"
    assert "--cuda-graph-backend-prefill" not in cmd  # the arm as the A/B served it
    assert dict(arm.env) == {"SGLANG_PLUGINS": "none"}
    assert dict(config.server.env) == toml["server"]["env"]
    with pytest.raises(
        SystemExit,
        match=r"ab_fp8_lean.toml has no arm 'lean' \(its arms: "
        r"upstream, bcg-auto-lean\)",
    ):
        real.slice_server(Path("/m"), 60.0, lean, "lean")
    with pytest.raises(SystemExit, match=r"^advise_real: .*nothing\.toml: cannot read"):
        real.slice_server(Path("/m"), 60.0, SLICE / "nothing.toml", "upstream")


def test_the_real_server_advise_run_stops_before_a_server_without_the_chat_encoder(
    tmp_path, monkeypatch
):
    import importlib.util

    real = load("advise_real")
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "deepseek_recipe" else found(n, *a)
    )
    started = []
    monkeypatch.setattr(real.subprocess, "Popen", lambda *a, **k: started.append(a))
    monkeypatch.setattr(real.subprocess, "run", lambda *a, **k: started.append(a))
    assert real.main(["--out", str(tmp_path)]) == 1
    assert started == []  # neither the model nor the server
    assert ".gpu-upstream/chat/" in (tmp_path / "timeline.log").read_text()
