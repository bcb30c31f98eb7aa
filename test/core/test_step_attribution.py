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
        ("gemm", "segment 0"),
        (kind_of(ATTN), "break 0"),
        ("Memcpy DtoD", "break 0"),
        ("gemm", "segment 1"),
        ("mhc_post_tilelang_kernel", "segment 1"),
    ]
    assert {op.place for op in gpu_ops(eager_step())} == {"eager"}


def test_same_work_pairs_across_tiles_and_the_rest_is_itemized():
    a = attribute(eager_step(), replayed_step())
    assert a["ops"] == {"eager": 6, "replay": 7, "matched": 5}
    assert a["eager_only"] == [
        {
            "kind": kind_of(FILL),
            "class": "elementwise",
            "count": 1,
            "ms": 0.05,
            "bytes": None,
            "places": {"eager": 1},
        }
    ]
    only = {r["kind"]: r for r in a["replay_only"]}
    assert only["Memcpy DtoD"]["bytes"] == 366_000_000 and only["Memcpy DtoD"]["places"] == {
        "break": 1
    }
    assert only["Memcpy HtoD"]["places"] == {"prepare": 1}
    # the GEMMs ran other tiles: paired as the same work, their change is the gemm class's
    assert a["matched_by_class"]["gemm"] == {
        "count": 2,
        "eager_ms": 1.3,
        "replay_ms": 1.36,
        "delta_ms": pytest.approx(0.06),
    }
    assert a["matched_by_class"]["attention"]["delta_ms"] == 0
    assert a["replay_by_place"] == {
        "break": pytest.approx(0.64),
        "prepare": pytest.approx(0.005),
        "segment": pytest.approx(1.57),
    }
    assert a["segments"] == 2


def test_the_parts_add_up_to_the_difference():
    a = attribute(eager_step(), replayed_step())
    matched = sum(r["delta_ms"] for r in a["matched_by_class"].values())
    assert a["delta_ms"] == pytest.approx(
        matched + a["replay_only_ms"] - a["eager_only_ms"], abs=2e-3
    )
    same = attribute(eager_step(), eager_step())
    assert same["delta_ms"] == 0 and same["replay_only"] == same["eager_only"] == []
