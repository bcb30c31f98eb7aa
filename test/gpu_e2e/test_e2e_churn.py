"""The break-input run of the end-to-end harness on the CPU (``run_e2e.py --churn
--hold-break-inputs``): what a phase's processes get, and the churn probe's blocks."""

from __future__ import annotations

import weakref

import e2e_churn_probe as churn
import e2e_phases as P
import e2e_step_log
import e2e_workload as W
import pytest


def test_churn_and_hold_add_the_probe_and_the_patch_switch_and_nothing_else(tmp_path):
    import run_e2e

    from sglang_mixgraph.patches import hold_break_inputs

    assert run_e2e.HOLD_FLAG == hold_break_inputs.HOLD_FLAG.name
    phase = P.Phase("bcg", "off")
    plain = run_e2e._phase_env(phase, {}, True, str(tmp_path), W.WORKLOADS[0])
    both = run_e2e._phase_env(
        phase, {}, True, str(tmp_path), W.WORKLOADS[0], churn=True, hold_break_inputs=True
    )
    changed = {k for k in both.keys() | plain.keys() if both.get(k) != plain.get(k)}
    assert changed == {"MIXGRAPH_E2E_STARTUP", "MIXGRAPH_E2E_CHURN", run_e2e.HOLD_FLAG}
    assert both["MIXGRAPH_E2E_STARTUP"] == plain["MIXGRAPH_E2E_STARTUP"] + ",e2e_churn_probe"
    assert both[run_e2e.HOLD_FLAG] == "1"


@pytest.mark.parametrize("held", [False, True])
def test_the_phase_record_says_whether_break_inputs_were_held(tmp_path, held):
    """The GLM-5 checks allow hold_break_inputs' events only where the record says it was on."""
    import e2e_glm5
    import run_e2e

    from sglang_mixgraph.patches import hold_break_inputs

    assert e2e_glm5.HOLD_PATCH == hold_break_inputs.PATCH_ID
    phase = P.Phase("bcg", "off")
    (tmp_path / phase.name / "steps").mkdir(parents=True)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / f"{phase.name}.log").write_text("")
    r = run_e2e.collect(
        phase, str(tmp_path), str(tmp_path / "logs"), 1.0, False, hold_break_inputs=held
    )
    assert r["record"].hold_break_inputs is held


def test_each_step_frees_the_last_steps_blocks_and_keeps_half_of_its_own_filled():
    probe = churn.Churn(seed=3, device="cpu", step_bytes=8 << 20)
    first = probe.end(None)
    assert first["churn_mib"] >= 8
    kept = [weakref.ref(b) for b in probe._kept]
    assert kept and all(int(b.min()) == 0xFF for b in probe._kept)
    probe.end(None)
    assert all(ref() is None for ref in kept)  # freed for the next forward to take
    again = churn.Churn(seed=3, device="cpu", step_bytes=8 << 20)
    assert again.end(None) == first  # the same seed churns the same sizes


@pytest.mark.parametrize(
    ("env", "installed"),
    [
        ({"MIXGRAPH_E2E_STEP_LOG": "x", "MIXGRAPH_E2E_CHURN": "1"}, True),
        ({"MIXGRAPH_E2E_STEP_LOG": "x"}, False),
    ],
)
def test_the_probe_joins_the_step_log_only_when_asked(monkeypatch, env, installed):
    monkeypatch.setattr(e2e_step_log, "PROBES", [])
    monkeypatch.delenv("MIXGRAPH_E2E_CHURN", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    churn.install()
    assert [type(p) for p in e2e_step_log.PROBES] == ([churn.Churn] if installed else [])
