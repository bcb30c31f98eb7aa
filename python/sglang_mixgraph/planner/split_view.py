"""The view of a deployment the mixed split's deployment-wide fallbacks read.

`patches.mixed_split.state.FALLBACKS` say, for `plan` and for `advise`, whether a whole
deployment falls back to upstream. `plan` hands them its `graph_plan.GraphPlan` (facts read
from SGLang's resolution, `deployment_facts.Deployment`); `advise` a `SplitDeployment` of the
facts a running server reports (`advise.server.ServerFacts`) and the GPU its traces name.
`SplitFacts` and `SplitView` name exactly what the fallbacks read, so both kinds of facts
satisfy them and a fallback that read anything else is caught by test (test/planner/
test_split_view.py reads every fallback's attribute reads), not by an AttributeError in one
command only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class SplitFacts(Protocol):
    """The deployment facts the split's fallbacks read."""

    @property
    def model_type(self) -> str | None: ...

    @property
    def dsv4_attn_backend(self) -> str | None: ...

    @property
    def speculative_algorithm(self) -> str | None: ...

    @property
    def context_parallel(self) -> bool: ...

    @property
    def hisparse(self) -> bool: ...


class SplitView(Protocol):
    """What a fallback is given: the facts and the GPU's SM major (None: not known)."""

    @property
    def facts(self) -> SplitFacts: ...

    @property
    def gpu_sm_major(self) -> int | None: ...


@dataclass(frozen=True)
class SplitDeployment:
    """A `SplitView` of facts read elsewhere than the planner (a running server's)."""

    facts: SplitFacts
    gpu_sm_major: int | None
