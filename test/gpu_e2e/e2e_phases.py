"""The phases of the end-to-end run: graph mode x mixed-split setting, each its own Engine.

A phase is named ``<graph>-<split>``: graph ``eager`` (no CUDA graph), ``dgraph`` (full decode
graph; prefill and MIXED steps eager) or ``bcg`` (full decode graph + breakable prefill graph);
split ``off``, ``always`` or ``adaptive``. Every other patch flag is at its off value in such a
phase, so it differs from its graph mode's ``off`` phase by the split alone.

The read-done variant ``<graph>-<split>-rd`` is that phase plus ``READ_DONE_ENV``: breakable-graph
prefill/mixed replays publish the WAR read-done event (patch ``replay_read_done``) and the debug
check ``war_snapshot_check`` raises on a shared-table read after it. Its baseline is still
``<graph>-off``: publishing earlier must not change a token. The default list is the nine
``<graph>-<split>`` phases plus ``bcg-off-rd`` and ``bcg-always-rd`` (the graph mode that replays
prefill and MIXED steps, without and with the split). ``-des``, ``-lw`` and ``-lean`` (patches
``wo_a_in_break`` and ``compress_plan_cap`` together) are by name only, also against ``<graph>-off``.

The speculative phases ``spec-<graph>-<split>`` (``spec`` names the eight of ``SPEC_DEFAULT``) serve
the tiny model with one next-n layer (``tiny_dsv4_mtp_config.json``) under EAGLE (``SPEC_KWARGS``:
2 draft steps, top-k 1, 3 draft tokens). Every one of them is compared with eager upstream
(``spec-eager-off``, or the reference of its own variant below), never with a breakable arm: upstream keeps that graph off for a speculative
DeepSeek-V4 (SGLang issue 29985), so ``spec-bcg-off`` is itself under test. Three variants apply
to them only: ``-tail`` (the split's decode tails replayed from their CUDA graphs,
``SGLANG_MIXGRAPH_SPLIT_TAIL_GRAPHS=1``; split phases only), ``-noovl`` (SGLang's overlap
scheduler off, ``disable_overlap_schedule``: the synchronous EAGLE path), whose reference is
``spec-eager-off-noovl``; and, by name only, ``-online``: upstream's online c128 MTP
compression on (``SGLANG_OPT_USE_ONLINE_COMPRESS`` and ``SGLANG_EXPERIMENTAL_ONLINE_C128_MTP``),
where the split must fall back on every MIXED step (so never with ``-tail``); it may change
numerics against offline compression, so its reference is ``spec-eager-off-online``
(``-noovl-online`` together: ``spec-eager-off-noovl-online``). ``-acc``, by name only, makes the
acceptance swing between 2 and 3 tokens a verify step (``SWING_ACCEPT_ENV``, upstream's simulated
acceptance over the draft's real tokens), against its own reference ``spec-eager-off-acc``.

``KERNEL_ENV``/``KERNEL_ENGINE`` (``sglang_mixgraph.kits.gpu_machine``, shared with
tools/rank-slice) select, through upstream's own flags, the kernels that exist on the GPU machine:
``standin`` (torch where deep_gemm, TileLang or FP4 MoE would run) or ``faithful`` (SGLang's
TileLang and JIT kernels, with TileLang carried there). No sglang import here: the CPU tests and the driver read it without starting
anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sglang_mixgraph.kits.gpu_machine import (
    KERNEL_ENGINE,
    KERNEL_ENV,
    KIT_KERNELS_ENV,
    RADIX_CORE_ENV,
    attention_dp_engine_kwargs,
)

GRAPHS = ("eager", "dgraph", "bcg")
SPLITS = ("off", "always", "adaptive")
SPLIT_FLAG = "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN"
POLICY_FLAG = "SGLANG_MIXGRAPH_SPLIT_POLICY"
READ_DONE_ENV = {"SGLANG_OPT_DSV4_REPLAY_READ_DONE": "1", "SGLANG_DEBUG_WAR_SNAPSHOT": "1"}
RD_SUFFIX = "-rd"
DEFAULT_RD = ("bcg-off", "bcg-always")  # the <graph>-<split> phases run also as -rd by default

# Speculative decoding as issue 61 asks for it: EAGLE over the model's own next-n layer (SGLang
# loads it as ``DeepseekV4ForCausalLMNextN`` from the target's path), greedy, chunk 512.
SPEC_PREFIX = "spec-"
SPEC_KWARGS = {
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 2,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 3,
}
SPEC_REFERENCE = "spec-eager-off"
NO_OVERLAP_SUFFIX = "-noovl"
ONLINE_SUFFIX = "-online"
SWING_SUFFIX = "-acc"
# Acceptance that swings step to step: upstream's benchmark knob forces each verify step to accept
# 2 or 3 tokens, drawn per step (spec_utils.sample_simulated_acc_len, "match-expected"), and
# with "real-draft-token" the accepted tokens are the draft's own chain plus the target's bonus
# (spec_utils.generate_simulated_accept_index; it needs top-k 1), so the tokens depend on the
# hidden states the target hands the draft. The draws come from the scheduler's CPU generator,
# seeded by random_seed, so arms that run the same steps draw the same lengths.
SWING_ACCEPT_ENV = {
    "SGLANG_SIMULATE_ACC_LEN": "2.5",
    "SGLANG_SIMULATE_ACC_METHOD": "match-expected",
    "SGLANG_SIMULATE_ACC_TOKEN_MODE": "real-draft-token",
}
# Upstream's online c128 compression under MTP (OnlineC128MTPController.enabled reads both).
ONLINE_C128_ENV = {
    "SGLANG_OPT_USE_ONLINE_COMPRESS": "1",
    "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP": "1",
}
SPEC_DEFAULT = (
    SPEC_REFERENCE,
    "spec-eager-always",
    "spec-bcg-off",
    "spec-bcg-always",
    "spec-bcg-adaptive",
    # the split in eager steps with its decode tails replayed from graphs
    "spec-eager-always-tail",
    # the overlap scheduler off: the split arm against upstream's no-overlap reference
    SPEC_REFERENCE + NO_OVERLAP_SUFFIX,
    "spec-eager-always" + NO_OVERLAP_SUFFIX,
)
CONFIG = "tiny_dsv4_config.json"
MTP_CONFIG = "tiny_dsv4_mtp_config.json"  # the same model with one next-n layer


@dataclass(frozen=True)
class Variant:
    """A setting added to a ``<graph>-<split>`` phase: the Phase field, the name suffix, its env,
    its Engine arguments, whether only speculative phases (``spec``) or only the others take it,
    and whether it changes the reference (``own_reference``: its phases are read against the
    eager split-off phase with the same variant, not against the plain one)."""

    field: str
    suffix: str
    env: Mapping[str, str]
    engine: Mapping[str, object] = field(default_factory=dict)
    spec: bool = False
    own_reference: bool = False


# In name order (``bcg-always-rd-des-lw-lean``, ``spec-eager-always-tail-noovl``,
# ``spec-eager-always-noovl-acc-online``). Only -rd is in the default list, -tail and -noovl in
# ``spec``; the others by name.
VARIANTS = (
    Variant("read_done", RD_SUFFIX, READ_DONE_ENV),
    # breakable graphs never launch their empty segments (patch drop_empty_segments)
    Variant("drop_empty", "-des", {"SGLANG_OPT_BCG_DROP_EMPTY_SEGMENTS": "1"}),
    # the c4 indexer at an eager break over the live context in breakable replays (patch
    # live_width_indexer), which needs upstream's attention stream overlap off (the indexer
    # would run on a side stream in captures)
    Variant(
        "live_width",
        "-lw",
        {"SGLANG_OPT_DSV4_BCG_LIVE_WIDTH_INDEXER": "1", "SGLANG_OPT_USE_MULTI_STREAM_OVERLAP": "0"},
    ),
    # DeepSeek-V4's attention break also runs the inverse RoPE and wo_a (patch wo_a_in_break)
    # and the compressors' capture plans are capped (patch compress_plan_cap): both act in
    # breakable prefill graphs only, so eager and dgraph -lean phases show them doing nothing
    Variant(
        "lean",
        "-lean",
        {"SGLANG_MIXGRAPH_BCG_WO_A_IN_BREAK": "1", "SGLANG_MIXGRAPH_BCG_COMPRESS_PLAN_CAP": "1"},
    ),
    Variant("tail_graphs", "-tail", {"SGLANG_MIXGRAPH_SPLIT_TAIL_GRAPHS": "1"}, spec=True),
    Variant(
        "no_overlap",
        NO_OVERLAP_SUFFIX,
        {},
        {"disable_overlap_schedule": True},
        spec=True,
        own_reference=True,
    ),
    # acceptance forced to swing between 2 and 3 tokens a verify step (SWING_ACCEPT_ENV)
    Variant("swing_accept", SWING_SUFFIX, SWING_ACCEPT_ENV, spec=True, own_reference=True),
    # upstream's online c128 MTP compression: the split falls back (``spec_online_c128``)
    Variant("online_c128", ONLINE_SUFFIX, ONLINE_C128_ENV, spec=True, own_reference=True),
)

# Chunked prefill: every prompt longer than this is split into MIXED steps. With the radix cache
# on, upstream's PrefillAdder floors a chunk to whole 256-token pages after the decode rows, so a
# 256-token chunk admits nothing while anything decodes; 512 leaves one page for the chunk.
CHUNK = 512
MAX_RUNNING = 24
MAX_TOTAL_TOKENS = 327680  # the long segment's 16 x 16k prompts and their decoding, with room

_GRAPH_KWARGS = {
    "eager": {"disable_cuda_graph": True},
    "dgraph": {
        "cuda_graph_backend_prefill": "disabled",
        "cuda_graph_backend_decode": "full",
        "cuda_graph_max_bs_decode": MAX_RUNNING,
    },
    "bcg": {
        "cuda_graph_backend_prefill": "breakable",
        "cuda_graph_backend_decode": "full",
        "cuda_graph_max_bs_decode": MAX_RUNNING,
    },
}


def engine_base_kwargs(model_dir: str, *, radix: bool, slot: int) -> dict[str, object]:
    """The ``sglang.Engine`` arguments every phase shares, DeepSeek-V4's and GLM-5's alike:
    one GPU, dummy weights, mixed chunked prefill, greedy-friendly seed; ``slot`` keeps
    concurrent phases' ports apart."""
    return dict(
        model_path=model_dir,
        skip_tokenizer_init=True,
        load_format="dummy",
        tp_size=1,
        enable_mixed_chunk=True,
        chunked_prefill_size=CHUNK,
        max_running_requests=MAX_RUNNING,
        max_total_tokens=MAX_TOTAL_TOKENS,
        moe_runner_backend="triton",
        # The KV budget is free memory minus (1 - this) x the memory free at start: high
        # enough that engines started side by side still find room for the capped pool.
        mem_fraction_static=0.6,
        random_seed=1,
        disable_radix_cache=not radix,
        port=31000 + 40 * slot,
        nccl_port=33000 + 40 * slot,
        log_level="info",
    )


@dataclass(frozen=True)
class Phase:
    graph: str
    split: str
    read_done: bool = False
    drop_empty: bool = False
    live_width: bool = False
    lean: bool = False
    spec: bool = False  # EAGLE over the next-n layer (SPEC_KWARGS)
    tail_graphs: bool = False
    no_overlap: bool = False
    swing_accept: bool = False
    online_c128: bool = False

    @property
    def name(self) -> str:
        suffix = "".join(v.suffix for v in VARIANTS if getattr(self, v.field))
        return f"{SPEC_PREFIX if self.spec else ''}{self.graph}-{self.split}{suffix}"

    @property
    def baseline(self) -> str:
        """The phase whose tokens this one must reproduce: under speculation always the eager
        one with the same scheduler and compression (the ``own_reference`` variants; upstream's
        breakable arm is not a reference there)."""
        if not self.spec:
            return f"{self.graph}-off"
        return self._off("eager")

    @property
    def upstream_arm(self) -> str:
        """The split-off phase of this one's graph mode, scheduler and compression (a
        speculative split arm is also read against it where it differs from the reference)."""
        return self._off(self.graph)

    def _off(self, graph: str) -> str:
        kept = {v.field: getattr(self, v.field) for v in VARIANTS if v.own_reference}
        return Phase(graph, "off", spec=self.spec, **kept).name

    @property
    def config(self) -> str:
        """The model's config file (in this folder); the driver writes each to its own folder."""
        return MTP_CONFIG if self.spec else CONFIG

    @property
    def is_baseline(self) -> bool:
        return self.name == self.baseline

    def engine_kwargs(
        self, model_dir: str, *, radix: bool, slot: int, dp: int = 1, kernels: str = "standin"
    ) -> dict[str, object]:
        """``sglang.Engine`` arguments; ``slot`` keeps concurrent phases' ports apart; ``dp`` > 1
        runs attention data parallel over that many GPUs (tp = dp, as the reference deployment),
        each rank with the chunk and the running requests one GPU has at dp 1; ``kernels`` is
        the kit's kernel selection."""
        kwargs = engine_base_kwargs(model_dir, radix=radix, slot=slot)
        kwargs["dsa_topk_backend"] = "torch"
        kwargs.update(KERNEL_ENGINE[kernels])
        kwargs.update(_GRAPH_KWARGS[self.graph])
        kwargs.update(attention_dp_engine_kwargs(dp, CHUNK, MAX_RUNNING))
        for v in VARIANTS:
            if getattr(self, v.field):
                kwargs.update(v.engine)
        if self.spec:
            kwargs.update(SPEC_KWARGS)
            # The draft takes its own top-k backend (default sgl-kernel, absent from the kit's
            # machine); the target's keeps the draft on the same kernels.
            kwargs["speculative_dsa_topk_backend"] = kwargs["dsa_topk_backend"]
        return kwargs

    def env(
        self, patch_flag_off_values: Mapping[str, str], *, radix: bool, kernels: str = "standin"
    ) -> dict[str, str]:
        """Environment of the phase: the kit's kernel selection through upstream's flags, every
        patch flag off but the split's, and the split as the phase says."""
        env = dict(KERNEL_ENV[kernels])
        env[KIT_KERNELS_ENV] = kernels
        env.update(patch_flag_off_values)
        env[SPLIT_FLAG] = "0" if self.split == "off" else "1"
        if self.split != "off":
            env[POLICY_FLAG] = self.split
        for v in VARIANTS:
            if getattr(self, v.field):
                env.update(v.env)
        if radix:
            env[RADIX_CORE_ENV] = "python"  # the Rust radix core is built for another torch
        return env


def parse(names: list[str]) -> list[Phase]:
    """Phase names (``all`` or none: the default eleven; ``spec``: the eight speculative ones), in
    the order a run needs them."""
    if not names or names == ["all"]:
        names = [f"{g}-{s}" for s in SPLITS for g in GRAPHS] + [n + RD_SUFFIX for n in DEFAULT_RD]
    names = [n for name in names for n in (SPEC_DEFAULT if name == "spec" else (name,))]
    phases = []
    for name in names:
        spec = name.startswith(SPEC_PREFIX)
        base = name.removeprefix(SPEC_PREFIX)
        on = {}
        for v in reversed(VARIANTS):  # the last suffix of the name first
            on[v.field] = base.endswith(v.suffix)
            base = base[: -len(v.suffix)] if on[v.field] else base
        graph, _, split = base.partition("-")
        if graph not in GRAPHS or split not in SPLITS:
            raise ValueError(
                f"unknown phase {name!r}: [{SPEC_PREFIX}]<{'|'.join(GRAPHS)}>-<{'|'.join(SPLITS)}>"
                + "".join(f"[{v.suffix}]" for v in VARIANTS)
            )
        wrong = [v.suffix for v in VARIANTS if on[v.field] and v.spec != spec]
        if wrong:
            # The others' checks assume no speculation (read-done is never published under
            # EAGLE); -tail, -noovl and -online are read against the speculative references.
            kind = "a speculative phase" if spec else "a phase without speculation"
            raise ValueError(f"unknown phase {name!r}: {kind} takes no {'/'.join(wrong)}")
        if on["tail_graphs"] and split == "off":
            raise ValueError(f"unknown phase {name!r}: -tail needs the split on")
        if on["tail_graphs"] and on["online_c128"]:
            # Under online c128 MTP nothing splits, so no decode tail could replay.
            raise ValueError(f"unknown phase {name!r}: -tail with -online (the split falls back)")
        phases.append(Phase(graph, split, spec=spec, **on))
    # Baselines first: every other phase is compared with them.
    return sorted(
        set(phases),
        key=lambda p: (
            not p.is_baseline,
            p.spec,
            SPLITS.index(p.split),
            GRAPHS.index(p.graph),
            *(getattr(p, v.field) for v in VARIANTS),
        ),
    )
