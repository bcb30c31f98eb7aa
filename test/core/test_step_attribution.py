"""core.step_attribution: a replayed step against the same step run eagerly, on traces shaped
as torch's profiler writes them (launch calls with correlation ids, GPU ops that carry them,
``cudaGraphLaunch`` for each replayed segment)."""

from __future__ import annotations

import pytest

from sglang_mixgraph.core.step_attribution import attribute, gpu_ops, kind_of
from sglang_mixgraph.kits.profiler_trace import TraceBuilder

FILL = "void at::native::vectorized_elementwise_kernel<8, at::native::FillFunctor<c10::BFloat16>, std::array<char*, 1ul> >(int, T)"
ATTN = (
    "void legacy::sm90::prefill::sparse_fwd::sparse_attn_fwd_kernel<KernelTemplate<512> >(Params)"
)


class Trace:
    """A step as the profiler records it (``kits.profiler_trace``): each op launched by a call
    on the host, then run on the GPU; a graph launch runs several."""

    def __init__(self):
        self.b, self.t = TraceBuilder(gpu="H100"), 0.0

    def kernel(self, name, us, nbytes=None):
        call = "cudaMemcpyAsync" if name.startswith("Memcpy") else "cudaLaunchKernel"
        self.t += 10
        self.b.launch(self.t, [(name, self.t + 1000, us)], call=call, nbytes=nbytes)
        self.t += us
        return self

    def graph(self, *ops):
        self.t += 10
        launch, runs = self.t, []
        for name, us in ops:
            runs.append((name, self.t + 1000, us))
            self.t += us
        self.b.launch(launch, runs, call="cudaGraphLaunch")
        return self

    @property
    def events(self):
        return self.b.document()["traceEvents"]


def eager_step():
    return (
        Trace()
        .kernel("mhc_pre_tilelang_kernel", 100)
        .kernel("nvjet_sm90_tst_256x160_64x4_1x2_h_bz_coopA_TNT", 1000)
        .kernel(FILL, 50)
        .kernel(ATTN, 400)
        .kernel("nvjet_sm90_tss_128x176_64x5_2x1_v_bz_TNT", 300)
        .kernel("mhc_post_tilelang_kernel", 100)
        .events
    )


def replayed_step():
    return (
        Trace()
        .kernel("Memcpy HtoD (Pinned -> Device)", 5, nbytes=4096)
        .graph(
            ("mhc_pre_tilelang_kernel", 100),
            ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", 1000),
        )
        .kernel(ATTN, 400)
        .kernel("Memcpy DtoD (Device -> Device)", 240, nbytes=366_000_000)
        .graph(
            ("nvjet_sm90_tss_176x128_64x5_1x2_h_bz_TNN", 360),
            ("mhc_post_tilelang_kernel", 110),
        )
        .events
    )


def test_ops_are_placed_by_the_graph_launches_around_them():
    places = [(op.kind, op.place) for op in gpu_ops(replayed_step())]
    assert places == [
        ("Memcpy HtoD", "prepare"),
        ("mhc_pre_tilelang_kernel", "segment 0"),
        ("vendor GEMMs (cuBLAS)", "segment 0"),
        (kind_of(ATTN), "break 0"),
        ("Memcpy DtoD", "break 0"),
        ("vendor GEMMs (cuBLAS)", "segment 1"),
        ("mhc_post_tilelang_kernel", "segment 1"),
    ]
    assert {op.place for op in gpu_ops(eager_step())} == {"eager"}


def by_kind(a):
    return {r["kind"]: r for r in a["by_kind"]}


def test_the_same_work_compares_across_tiles_and_the_rest_is_itemized():
    a = attribute(eager_step(), replayed_step())
    assert a["ops"] == {"eager": 6, "replay": 7}
    k = by_kind(a)
    # cuBLAS ran other tiles and layouts: one kind, its change the gemm class's
    gemm = k["vendor GEMMs (cuBLAS)"]
    assert (gemm["eager"]["count"], gemm["replay"]["count"]) == (2, 2)
    assert gemm["delta_ms"] == pytest.approx(0.06) and gemm["class"] == "gemm"
    assert gemm["replay"]["places"] == {"segment": 2}
    # what only one side does, with its size and where the replay ran it
    assert k["Memcpy DtoD"]["eager"]["count"] == 0
    assert k["Memcpy DtoD"]["replay"] == {
        "count": 1,
        "ms": 0.24,
        "bytes": 366_000_000,
        "places": {"break": 1},
    }
    assert k["Memcpy HtoD"]["replay"]["places"] == {"prepare": 1}
    assert k[kind_of(FILL)]["replay"]["count"] == 0 and k[kind_of(FILL)]["delta_ms"] == -0.05
    assert k[kind_of(FILL)]["class"] == "elementwise"
    # a TileLang kernel that says "gemm" in its name stays itself
    assert kind_of("mhc_pre_gemm_sqrsum_tilelang_kernel") == "mhc_pre_gemm_sqrsum_tilelang_kernel"
    assert a["by_class"]["attention"]["delta_ms"] == 0
    assert a["by_class"]["mhc"]["delta_ms"] == pytest.approx(0.01)
    assert a["replay_by_place"] == {
        "break": pytest.approx(0.64),
        "prepare": pytest.approx(0.005),
        "segment": pytest.approx(1.57),
    }
    assert a["segments"] == 2


def test_the_parts_add_up_to_the_difference():
    a = attribute(eager_step(), replayed_step())
    assert a["delta_ms"] == pytest.approx(sum(r["delta_ms"] for r in a["by_kind"]), abs=2e-3)
    assert a["delta_ms"] == pytest.approx(
        sum(r["delta_ms"] for r in a["by_class"].values()), abs=2e-3
    )
    same = attribute(eager_step(), eager_step())
    assert same["delta_ms"] == 0 and all(r["delta_ms"] == 0 for r in same["by_kind"])


def test_busy_time_counts_a_parallel_branch_once_and_idle_gaps_name_what_the_gpu_waited_for():
    # eager: two kernels back to back on one stream, 1000 + 500 us
    eager = Trace().kernel("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", 1000)
    eager = eager.kernel("mhc_post_tilelang_kernel", 500).events
    # replay: one graph whose two branches overlap (the GEMM on a side stream runs 600 us longer
    # for sharing the GPU), a break that the host launches 300 us after the segment ends, and
    # the next segment 100 us after the break
    b = TraceBuilder(gpu="H100")
    gemm, post = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", "mhc_post_tilelang_kernel"
    b.launch(0.0, [(gemm, 1000.0, 1600.0), (post, 1100.0, 500.0)], call="cudaGraphLaunch")
    b.launch(1500.0, [(ATTN, 2900.0, 400.0)])
    b.launch(2000.0, [(post, 3400.0, 100.0)], call="cudaGraphLaunch")
    a = attribute(eager, b.document()["traceEvents"])
    # summed op times: 2600 us against 1500; busy: 1600 + 400 + 100 against 1500
    assert a["replay_ms"] == pytest.approx(2.6) and a["eager_ms"] == pytest.approx(1.5)
    assert a["busy_ms"] == {"eager": 1.5, "replay": 2.1, "delta": 0.6}
    # eager: the 10 us between launches; replay: 300 us before the break's first op and 100 us
    # before the second segment's
    assert a["idle_ms"]["eager"] == pytest.approx(0.01)
    assert a["idle_ms"]["replay"] == pytest.approx(0.4)
    assert a["idle_ms"]["replay_waiting_for"] == {"break": 0.3, "segment": 0.1}
    same = attribute(eager, eager)
    assert same["busy_ms"]["delta"] == 0
    assert same["idle_ms"]["replay_waiting_for"] == {"eager": pytest.approx(0.01)}
