"""The adaptive split policy: the cost model of one mixed step's attention, unsplit vs split.

No sglang imports. Inputs are the step's host counts (`core.mixed_step_counts`: `StepShape` per
layer kind, `StepCounts` per step); here the coefficients (fitted per GPU architecture, package
data ``sglang_mixgraph/data/split_cost_<arch>.json``, ``sm90`` with a margin for an architecture
without a file), the per-layer predictions in two regimes (``replay``: GPU time, host hidden;
``eager``: ``wall = max(H, G + kappa * H)``), the whole step's prediction with its step terms,
and the decision (`decide_step`). The model, its fit and its measurements:
docs/adaptive-split.md.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from importlib import resources

import torch

# The cost model's inputs; importable from here too, as the split's plan and the benchmarks do.
from sglang_mixgraph.core.mixed_step_counts import (  # noqa: F401
    C4_TOPK,
    StepCounts,
    StepShape,
    layer_mix,
    request_keys,
    sum_min_floor_div,
    sum_min_linear,
    uniform_step_lists,
)

COEFF_NAMES = ("a_ws", "a_key", "a_row", "c_pre", "d_key", "d_row", "c_dec", "a_cat")
UNKNOWN_ARCH_MARGIN = 0.10
KNOWN_ARCH_MARGIN = 0.0
_DATA_PACKAGE = "sglang_mixgraph"
_DATA_DIR = "data"

REPLAY = "replay"  # host work hidden behind the GPU queue (a replayed graph step)
EAGER = "eager"  # host work exposed (an eager step)
REGIMES = (REPLAY, EAGER)
# Eager terms per ratio: host ms per layer call of the unsplit path, of the split path with
# prefill rows (b0 > 0) and without (decode rows only), and kappa (a fraction, see above).
EAGER_NAMES = ("host_unsplit", "host_split", "host_split_decode_only", "kappa")
# Step terms (milliseconds per step, see ``predict_step``): one sparse-prefill chunk-cache
# build (either kind: upstream's over every request, the split's over the prefill requests;
# host work plus a few small index kernels), the split plan's own work on top of its cache
# (the boundary, the decode tail's per-ratio inputs and scheduling metadata), and this model's
# evaluation of one step (paid by ``adaptive`` whatever it decides). Fitted per GPU from the
# host times of those parts in recorded whole steps (``benchmark/fit_split_cost.py --step`` on
# ``benchmark/mixed_steady_state.py`` results; ``kits.cost_fit.fit_step_terms`` says how each
# term maps to the measured parts) and stored as the calibration file's ``step`` block.
STEP_NAMES = ("cache_build_ms", "split_plan_ms", "eval_ms")
# Only for a calibration without a ``step`` block (an older file, the built-in estimate).
DEFAULT_STEP_TERMS = {"cache_build_ms": 0.3, "split_plan_ms": 0.15, "eval_ms": 0.08}
DEFAULT_STEP_SOURCE = (
    "built-in estimate, not fitted (the fallback for a calibration without a step block): the "
    "H200 step benchmark's prepare times (the split's plan with its chunk cache about 0.6 ms "
    "over upstream's prepare at 8k) and the evaluation timed on a CPU"
)

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# features
# --------------------------------------------------------------------------------------------


def features(shape: StepShape) -> tuple[list[float], list[float]]:
    """Design rows (unsplit, split) over ``COEFF_NAMES``."""
    b0, d = shape.prefill_rows, shape.num_decode
    has_pre = 1.0 if b0 > 0 else 0.0
    unsplit = [shape.ws_all, shape.keys_all, shape.rows_all, 1.0, 0, 0, 0, 0]
    split = [
        has_pre * shape.ws_pre,
        has_pre * shape.keys_pre,
        has_pre * b0,
        has_pre,
        shape.keys_dec,
        d,
        1.0 if d > 0 else 0.0,
        d if (b0 > 0 and d > 0) else 0,
    ]
    return [float(x) for x in unsplit], [float(x) for x in split]


# --------------------------------------------------------------------------------------------
# coefficients
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Coefficients:
    """Per-ratio coefficients (ms per unit) for one GPU architecture."""

    arch: str
    per_ratio: Mapping[int, Mapping[str, float]]
    margin: float = KNOWN_ARCH_MARGIN
    source: str = ""
    # Eager-regime terms (``EAGER_NAMES``) per ratio; None: eager steps use the GPU model.
    eager: Mapping[int, Mapping[str, float]] | None = None
    eager_source: str = ""
    # Step terms (``STEP_NAMES``); None: ``DEFAULT_STEP_TERMS``.
    step: Mapping[str, float] | None = None
    step_source: str = ""
    # The package data file these came from (``split_cost_<arch>.json``); "" for none.
    file: str = ""

    def step_terms(self) -> Mapping[str, float]:
        return self.step if self.step else DEFAULT_STEP_TERMS

    def step_terms_source(self) -> str:
        return self.step_source if self.step else DEFAULT_STEP_SOURCE

    def for_ratio(self, ratio: int) -> Mapping[str, float]:
        return _pick_ratio(self.per_ratio, ratio)

    def eager_for_ratio(self, ratio: int) -> Mapping[str, float] | None:
        return _pick_ratio(self.eager, ratio) if self.eager else None

    def to_json(self) -> dict:
        out = {
            "arch": self.arch,
            "margin": self.margin,
            "source": self.source,
            "units": "milliseconds per unit; see sglang_mixgraph.core.split_cost_model",
            "coefficients": {str(r): dict(c) for r, c in self.per_ratio.items()},
        }
        if self.eager:
            out["eager"] = {
                "source": self.eager_source,
                "units": "host_* in milliseconds per layer call, kappa a fraction; see "
                "sglang_mixgraph.core.split_cost_model",
                "coefficients": {str(r): dict(c) for r, c in self.eager.items()},
            }
        if self.step:
            out["step"] = {
                "source": self.step_source,
                "units": "milliseconds per step; see sglang_mixgraph.core.split_cost_model",
                "terms": dict(self.step),
            }
        return out

    @classmethod
    def from_json(cls, data: Mapping) -> Coefficients:
        per_ratio = _read_terms(data["coefficients"], COEFF_NAMES)
        eager = data.get("eager")
        step = data.get("step")
        return cls(
            arch=str(data["arch"]),
            per_ratio=per_ratio,
            margin=float(data.get("margin", KNOWN_ARCH_MARGIN)),
            source=str(data.get("source", "")),
            eager=_read_terms(eager["coefficients"], EAGER_NAMES) if eager else None,
            eager_source=str(eager.get("source", "")) if eager else "",
            step=_read_terms({"step": step["terms"]}, STEP_NAMES, key=str)["step"]
            if step
            else None,
            step_source=str(step.get("source", "")) if step else "",
        )


def _pick_ratio(per_ratio: Mapping[int, Mapping[str, float]], ratio: int) -> Mapping[str, float]:
    if ratio in per_ratio:
        return per_ratio[ratio]
    # SWA-only layers have no compressed region; the c4 kernel costs are the closest.
    if 4 in per_ratio:
        return per_ratio[4]
    return next(iter(per_ratio.values()))


def _read_terms(block: Mapping, names: Sequence[str], key=int) -> dict:
    out = {}
    for r, c in block.items():
        missing = [k for k in names if k not in c]
        if missing:
            where = f"ratio {r}" if key is int else str(r)
            raise ValueError(f"{where}: missing coefficients {missing}")
        out[key(r)] = {k: float(c[k]) for k in names}
    return out


def builtin_coefficients() -> Coefficients:
    """Bandwidth-derived numbers used only when no calibration file exists at all.

    From the first H200 probe (fp8 decode 0.19 ms and bf16 sparse prefill 0.14 ms for
    256 rows x 640 keys) and a 584 B read + 1024 B write per dequantized token at ~3.5 TB/s;
    output join 2 x 128 KiB per row at ~4 TB/s. Fixed costs are one launch (~10 us).
    """
    c = {
        "a_ws": 1608 / 3.5e12 * 1e3,
        "a_key": 0.14 / (256 * 640),
        "a_row": 0.0,
        "c_pre": 0.01,
        "d_key": 0.19 / (256 * 640),
        "d_row": 0.0,
        "c_dec": 0.01,
        "a_cat": 2 * 128 * 512 * 2 / 4.0e12 * 1e3,
    }
    return Coefficients(
        arch="builtin",
        per_ratio={4: c, 128: dict(c)},
        margin=UNKNOWN_ARCH_MARGIN,
        source="built-in estimate, not calibrated",
    )


def arch_key(major: int, minor: int) -> str:
    return f"sm{major}{minor}"


def detect_arch(device: int | None = None) -> str | None:
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return arch_key(major, minor)


def _read_package_json(name: str) -> dict | None:
    try:
        res = resources.files(_DATA_PACKAGE).joinpath(_DATA_DIR, name)
        if not res.is_file():
            return None
        return json.loads(res.read_text())
    except (FileNotFoundError, ModuleNotFoundError):
        return None


def load_coefficients(arch: str | None) -> Coefficients:
    """Calibrated coefficients for ``arch`` (e.g. ``"sm90"``), or the conservative fallback.

    Unknown architectures get the sm90 calibration (else the built-in estimate) with
    ``margin = UNKNOWN_ARCH_MARGIN``.
    """
    if arch:
        name = f"split_cost_{arch}.json"
        data = _read_package_json(name)
        if data is not None:
            return dataclasses.replace(Coefficients.from_json(data), file=name)
    base = _read_package_json("split_cost_sm90.json")
    coeffs = (
        dataclasses.replace(Coefficients.from_json(base), file="split_cost_sm90.json")
        if base is not None
        else builtin_coefficients()
    )
    return dataclasses.replace(
        coeffs,
        arch=f"{arch or 'unknown'} (fallback: {coeffs.arch})",
        margin=max(coeffs.margin, UNKNOWN_ARCH_MARGIN),
    )


def calibration_info(coeffs: Coefficients) -> dict:
    """Where each kind of coefficient of ``coeffs`` came from, as typed fields (``plan --json``,
    ``doctor --json``): the calibration file and its architecture, the per-layer (GPU model)
    coefficients' source, the eager terms' (None without them) and the step terms' (fitted, or
    the built-in ``DEFAULT_STEP_TERMS``)."""
    return {
        "arch": coeffs.arch,
        "file": f"{_DATA_PACKAGE}/{_DATA_DIR}/{coeffs.file}" if coeffs.file else None,
        "margin": coeffs.margin,
        "per_layer": {"source": coeffs.source},
        "eager": {"source": coeffs.eager_source} if coeffs.eager else None,
        "step": {
            "fitted": bool(coeffs.step),
            "terms": dict(coeffs.step_terms()),
            "source": coeffs.step_terms_source(),
        },
    }


def calibration_lines(info: Mapping, indent: str = "  ", width: int = 100) -> list[str]:
    """``calibration_info`` for people: the file, then one entry per source, each wrapped to
    ``width`` (commands quoted in a source are left to the JSON)."""
    import re
    import textwrap

    def entry(text: str, first: str) -> list[str]:
        text = re.sub(r",? `[^`]*`", "", text)
        return textwrap.wrap(
            text,
            width,
            initial_indent=first,
            subsequent_indent=first + "  ",
            break_on_hyphens=False,
            break_long_words=False,
        )

    where = info["file"] or "no calibration file"
    margin = info["margin"]
    head = f"calibration {info['arch']}: {where}"
    if margin:
        head += f", split only for a predicted gain of at least {margin:.0%}"
    step = info["step"]
    terms = " / ".join(f"{step['terms'][k]:.3g}" for k in STEP_NAMES)
    fitted = "fitted" if step["fitted"] else "NOT fitted"
    sub = indent + "  "
    lines = entry(head, indent)
    lines += entry(f"per-layer coefficients: {info['per_layer']['source']}", sub)
    eager = info["eager"]["source"] if info["eager"] else "none (eager steps use the GPU model)"
    lines += entry(f"eager terms: {eager}", sub)
    lines += entry(
        f"step terms ({terms} ms per cache build / plan / decision, {fitted}): {step['source']}",
        sub,
    )
    return lines


def calibration_summary(info: Mapping) -> str:
    """``calibration_info`` in one line without file paths (``plan``'s default text): the GPU
    the coefficients were measured on (as their sources name it) and, for an architecture
    without a file of its own, that it borrows another's with a margin."""
    import re

    own, _, borrowed = info["arch"].partition(" (fallback: ")
    borrowed = borrowed.rstrip(")")
    if info["file"] is None:
        text = "not calibrated (a built-in estimate)"
    else:
        sources = [info["per_layer"]["source"]] + (
            [info["eager"]["source"]] if info["eager"] else []
        )
        gpus = sorted({g.strip() for s in sources for g in re.findall(r" on (NVIDIA [^,;()]+)", s)})
        text = f"calibrated on the {' and '.join(gpus) or 'GPU'} ({borrowed or own})"
        if borrowed:
            text += f", borrowed: {own} has no calibration of its own"
    if info["margin"]:
        text += f"; splits only for a predicted gain of at least {info['margin']:.0%}"
    if not info["step"]["fitted"]:
        text += "; step terms not fitted (built-in)"
    return text


# --------------------------------------------------------------------------------------------
# prediction and policy
# --------------------------------------------------------------------------------------------


def predict(shape: StepShape, coeffs: Coefficients) -> tuple[float, float]:
    """Predicted ``(unsplit_ms, split_ms)`` of one layer of this kind."""
    c = coeffs.for_ratio(shape.ratio)
    w = [c[k] for k in COEFF_NAMES]
    fu, fs = features(shape)
    unsplit = sum(a * b for a, b in zip(w, fu, strict=False))
    split = sum(a * b for a, b in zip(w, fs, strict=False))
    if shape.num_decode == 0:
        split = unsplit  # nothing to split
    return unsplit, split


def predict_eager(shape: StepShape, coeffs: Coefficients) -> tuple[float, float] | None:
    """Predicted eager wall ``(unsplit_ms, split_ms)`` of one layer call of this kind, or None
    when ``coeffs`` have no eager terms."""
    e = coeffs.eager_for_ratio(shape.ratio)
    if e is None:
        return None
    gpu_unsplit, gpu_split = predict(shape, coeffs)
    kappa = e["kappa"]
    host_unsplit = e["host_unsplit"]
    unsplit = max(host_unsplit, gpu_unsplit + kappa * host_unsplit)
    if shape.num_decode == 0:
        return unsplit, unsplit  # nothing to split
    # Without prefill rows the split runs the decode kernel alone (no sparse prefill, no join).
    host_split = e["host_split"] if shape.prefill_rows > 0 else e["host_split_decode_only"]
    return unsplit, max(host_split, gpu_split + kappa * host_split)


_warned_no_eager: set = set()


def _warn_no_eager(coeffs: Coefficients) -> None:
    key = (coeffs.arch, coeffs.source)
    if key not in _warned_no_eager:
        _warned_no_eager.add(key)
        logger.warning(
            "split cost model %s has no eager (host-time) terms: eager steps are decided with "
            "the queue-ahead GPU model (refit with benchmark/fit_split_cost.py --eager)",
            coeffs.arch,
        )


def layer_walls(
    shape: StepShape, coeffs: Coefficients, regime: str = REPLAY
) -> tuple[float, float]:
    """``(unsplit_ms, split_ms)`` of one layer call of this kind in ``regime``: the GPU model
    (``replay``) or the eager wall model (``eager``; the GPU model, said once, when ``coeffs``
    have no eager terms)."""
    if regime not in REGIMES:
        raise ValueError(f"regime must be one of {REGIMES}, not {regime!r}")
    walls = predict_eager(shape, coeffs) if regime == EAGER else None
    if walls is None:
        if regime == EAGER:
            _warn_no_eager(coeffs)
        walls = predict(shape, coeffs)
    return walls


def should_split(
    shape: StepShape,
    coeffs: Coefficients,
    margin: float | None = None,
    *,
    regime: str = REPLAY,
) -> bool:
    """Decision for one layer kind alone: split iff ``split <= (1 - margin) * unsplit``, times
    from :func:`layer_walls`. The patch decides whole steps (:func:`decide_step`); this is the
    per-layer answer the in-server sweeps measure."""
    if regime not in REGIMES:
        raise ValueError(f"regime must be one of {REGIMES}, not {regime!r}")
    if shape.num_decode == 0:
        return False
    m = coeffs.margin if margin is None else margin
    unsplit, split = layer_walls(shape, coeffs, regime)
    return split <= (1.0 - m) * unsplit


@dataclasses.dataclass(frozen=True)
class StepPrediction:
    """Predicted milliseconds of one step's attention layers plus its chunk-cache builds.

    ``unsplit_ms``: every layer upstream's way, with upstream's one chunk cache over every
    request. ``split_ms``: every layer split, with the plan's one prefill-only cache (none
    without prefill rows) and the plan's own work. ``eval_ms``: this prediction, paid by
    ``adaptive`` whichever way it decides (``adaptive`` = the chosen arm + ``eval_ms``).
    """

    unsplit_ms: float
    split_ms: float
    eval_ms: float

    def adaptive_ms(self, split: bool) -> float:
        return (self.split_ms if split else self.unsplit_ms) + self.eval_ms


def predict_step(
    counts: StepCounts,
    layers: Mapping[int, int],
    coeffs: Coefficients,
    *,
    regime: str = REPLAY,
) -> StepPrediction:
    """The whole step, both ways: ``layers`` is ``{compress ratio: layers}`` (:func:`layer_mix`)
    and each layer call is priced by :func:`layer_walls`; each way builds one chunk cache
    (``cache_build_ms``; the split none without prefill rows) and the split pays its plan
    (``split_plan_ms``). A fixed number of operations per step: one :meth:`StepCounts.shape`
    and one layer prediction per ratio present."""
    terms = coeffs.step_terms()
    build = terms["cache_build_ms"]
    unsplit = split = 0.0
    for ratio, n in layers.items():
        if n > 0:
            u, s = layer_walls(counts.shape(ratio), coeffs, regime)
            unsplit += n * u
            split += n * s
    unsplit += build
    if counts.num_decode == 0:
        split = unsplit  # nothing to split
    else:
        split += (build if counts.prefill_rows > 0 else 0.0) + terms["split_plan_ms"]
    return StepPrediction(unsplit_ms=unsplit, split_ms=split, eval_ms=terms["eval_ms"])


def decide_step(
    counts: StepCounts,
    layers: Mapping[int, int],
    coeffs: Coefficients,
    margin: float | None = None,
    *,
    regime: str = REPLAY,
) -> bool:
    """``adaptive``'s decision for one step: split every layer iff the whole step's
    ``split_ms <= (1 - margin) * unsplit_ms`` (:func:`predict_step`). One decision per step,
    never per compress ratio: a step that splits some ratios and not others would need both
    chunk caches (upstream's for the unsplit layers, the prefill-only one for the split ones)."""
    if regime not in REGIMES:
        raise ValueError(f"regime must be one of {REGIMES}, not {regime!r}")
    if counts.num_decode == 0:
        return False
    m = coeffs.margin if margin is None else margin
    p = predict_step(counts, layers, coeffs, regime=regime)
    return p.split_ms <= (1.0 - m) * p.unsplit_ms
