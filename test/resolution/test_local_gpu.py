"""`plan`'s default target: this machine's GPU as nvidia-smi names it, else the default with
the reason (resolution/local_gpu.py), with a made-up nvidia-smi on PATH (kits/fake_nvidia_smi.py).
"""

from __future__ import annotations

import pytest

from sglang_mixgraph.kits.fake_nvidia_smi import NO_DRIVER, fake_nvidia_smi
from sglang_mixgraph.resolution.local_gpu import LocalGpu, NoLocalGpu, choose_target, probe
from sglang_mixgraph.target_gpu import DEFAULT_GPU, GPUS


def _smi(monkeypatch, tmp_path, answer):
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path / "bin", answer))


def test_probe_reads_the_first_gpu(monkeypatch, tmp_path):
    _smi(monkeypatch, tmp_path, "NVIDIA H200, 143771\nNVIDIA H200, 143771")
    assert probe() == LocalGpu("NVIDIA H200", 143771)


@pytest.mark.parametrize(
    "answer, said",
    [(None, "nvidia-smi failed: " + NO_DRIVER), ("", "nvidia-smi lists no GPU")],
)
def test_probe_says_why_there_is_no_gpu(monkeypatch, tmp_path, answer, said):
    _smi(monkeypatch, tmp_path, answer)
    with pytest.raises(NoLocalGpu) as e:
        probe()
    assert str(e.value) == said


def test_probe_without_nvidia_smi(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory
    with pytest.raises(NoLocalGpu, match="nvidia-smi not found"):
        probe()


def _found(gpu):
    def find():
        if gpu is None:
            raise NoLocalGpu("nvidia-smi not found")
        return gpu

    return find


def test_no_gpu_gives_the_default_and_says_so():
    choice = choose_target(None, _found(None))
    assert (choice.name, choice.source) == (DEFAULT_GPU, "default")
    assert choice.why == "the default: no GPU here, nvidia-smi not found"


@pytest.mark.parametrize("key", list(GPUS))
def test_a_known_gpu_is_the_target(key):
    spec = GPUS[key]
    choice = choose_target(None, _found(LocalGpu(spec.device_name, spec.memory_mib)))
    assert (choice.name, choice.source, choice.why) == (key, "local", "this machine's GPU")


def test_a_variant_names_itself_and_the_memory_planned_with():
    choice = choose_target(None, _found(LocalGpu("NVIDIA H100 NVL", 95830)))
    assert (choice.name, choice.source) == ("H100", "local")
    assert choice.why == (
        "this machine's GPU, NVIDIA H100 NVL with 95830 MiB, planned with the H100's "
        f"{GPUS['H100'].memory_mib} MiB"
    )


@pytest.mark.parametrize("name", ["NVIDIA A100-SXM4-80GB", "NVIDIA GH200 480GB"])
def test_an_unknown_gpu_gives_the_default_with_the_reason(name):
    choice = choose_target(None, _found(LocalGpu(name, 81920)))
    assert (choice.name, choice.source) == (DEFAULT_GPU, "default")
    assert f"this machine's {name} is not one plan describes" in choice.why
    assert "--target-gpu" in choice.why


def test_a_given_gpu_wins_and_nothing_is_probed():
    def find():
        raise AssertionError("probed although --target-gpu was given")

    assert choose_target("H200", find).source == "given"


def test_a_name_that_is_not_utf8_is_no_traceback(monkeypatch, tmp_path):
    """A driver that prints a non-UTF-8 byte used to stop plan with a UnicodeDecodeError."""
    _smi(monkeypatch, tmp_path, b"NVIDIA H\xff100 80GB HBM3, 81559\n")
    assert probe() == LocalGpu("NVIDIA H\ufffd100 80GB HBM3", 81559)
    choice = choose_target(None)
    assert choice.source == "default" and "NVIDIA H\ufffd100 80GB HBM3 is not one" in choice.why


def test_plan_on_a_machine_whose_nvidia_smi_prints_bytes(plan_env, tmp_path, capsys):
    """Through the command (in this process): plan plans for the default and says why."""
    from sglang_mixgraph import cli

    plan_env.setenv("PATH", fake_nvidia_smi(tmp_path / "bytes", b"\xfe\xff garbage, 12\n"))
    code = cli.main(["plan"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Traceback" not in err and "UnicodeDecodeError" not in err
    assert f"target GPU: {DEFAULT_GPU} " in out and "\ufffd\ufffd garbage is not one" in out
