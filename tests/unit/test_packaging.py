"""What `pip install .` takes and says: the CPU-only xgboost build where it has wheels (Linux x86_64
and aarch64: the same models byte for byte, without ~470 MiB of NCCL), the full one elsewhere; and
a license setuptools reads without a deprecation banner (an SPDX expression, setuptools >= 77)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())


def xgboost_for(sys_platform: str, machine: str) -> list[str]:
    env = {"sys_platform": sys_platform, "platform_machine": machine, "extra": ""}
    reqs = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    return [r.name for r in reqs if r.name.startswith("xgboost") and (r.marker is None or r.marker.evaluate(env))]


@pytest.mark.parametrize("platform, machine, name", [("linux", "x86_64", "xgboost-cpu"),
                                                     ("linux", "aarch64", "xgboost-cpu"),
                                                     ("darwin", "arm64", "xgboost"),
                                                     ("win32", "AMD64", "xgboost"),
                                                     ("linux", "ppc64le", "xgboost")])
def test_exactly_one_xgboost_build_per_platform(platform: str, machine: str, name: str) -> None:
    assert xgboost_for(platform, machine) == [name]


def test_the_license_is_an_spdx_expression_setuptools_reads_without_a_banner() -> None:
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    (setuptools,) = [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]
    assert setuptools.name == "setuptools" and not setuptools.specifier.contains("76.9")
