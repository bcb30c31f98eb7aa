"""Packaging: the sglang requirement, the license metadata, `--version`, typed JSON documents."""

from __future__ import annotations

import json
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from sglang_mixgraph import __version__, cli
from sglang_mixgraph.resolution.plan_format import SCHEMA_VERSION

PYPROJECT = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())


def _sglang_requirement() -> Requirement:
    (req,) = [
        Requirement(r)
        for r in PYPROJECT["project"]["dependencies"]
        if Requirement(r).name == "sglang"
    ]
    return req


@pytest.mark.parametrize(
    "release, admitted",
    [
        ("0.5.23", True),
        ("0.5.23.post1", True),
        ("0.5.23.post12", True),
        ("0.5.22", False),
        ("0.5.22.post3", False),
        ("0.5.24", False),
        ("0.5.24rc1", False),
        ("0.6.0", False),
    ],
)
def test_the_sglang_requirement_admits_0_5_23_and_its_post_releases_only(release, admitted):
    # The installed 0.5.23 must always satisfy it: `pip install .` then leaves SGLang alone.
    assert _sglang_requirement().specifier.contains(Version(release)) is admitted


def test_the_installed_sglang_satisfies_the_requirement():
    installed = Version(metadata.version("sglang"))
    assert installed.release[:3] == (0, 5, 23)
    assert _sglang_requirement().specifier.contains(installed)


def test_license_is_an_spdx_expression_with_a_backend_that_reads_it():
    # A `{text = ...}` table is deprecated (PEP 639): setuptools >= 77 reads the string form.
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    backend = [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]
    (setuptools,) = [r for r in backend if r.name == "setuptools"]
    assert not setuptools.specifier.contains(Version("76.1"))
    assert setuptools.specifier.contains(Version("77.0"))


def test_project_urls_name_the_sglang_it_patches():
    urls = PYPROJECT["project"]["urls"]
    assert urls["SGLang"] == "https://github.com/sgl-project/sglang"
    assert all(url.startswith("https://") for url in urls.values())


def test_doctor_help_says_what_it_checks_and_when_it_fails(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["doctor", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Check this environment: the installed SGLang, torch and flash_mla, the GPU" in text
    assert "Exits 1 when an enabled patch cannot apply" in text


def test_version_names_the_plugin_and_the_installed_sglang(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out == f"sglang-mixgraph {__version__} (sglang {metadata.version('sglang')})"
    assert __version__ == PYPROJECT["project"]["version"]


def test_doctor_json_is_typed_and_versioned(capsys):
    cli.main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["schema_version"] == SCHEMA_VERSION and isinstance(SCHEMA_VERSION, int)
    assert isinstance(report["ok"], bool) and isinstance(report["plugin"]["loaded"], bool)
    split = next(p for p in report["patches"] if p["id"] == "mixed_split")
    assert split["flags"]["SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN"] is False
    assert split["flags"]["SGLANG_MIXGRAPH_SPLIT_POLICY"] == "adaptive"
    interval = next(
        f for f in report["flags"] if f["name"] == "SGLANG_MIXGRAPH_COUNTERS_LOG_INTERVAL"
    )
    assert isinstance(interval["value"], int) and not isinstance(interval["value"], bool)
