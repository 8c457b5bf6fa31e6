"""Every package of the plugin ships in the wheel (pyproject lists them explicitly, because
the suite is mapped in from suites/)."""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_listed() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "pytest_sharedkv").rglob("__init__.py")}
    found |= {"pytest_sharedkv.suites", "pytest_sharedkv.fixtures"}  # mapped in
    assert listed == found
    assert config["package-dir"]["pytest_sharedkv.suites"] == "suites"
    assert config["package-dir"]["pytest_sharedkv.fixtures"] == "fixtures"


def test_data_files_are_listed() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    data = config["package-data"]
    mapped = config["package-dir"]
    for package, patterns in data.items():
        base = ROOT / mapped[package] if package in mapped else ROOT.joinpath(*package.split("."))
        for pattern in patterns:
            assert list(base.glob(pattern)), f"{package}: {pattern} matches nothing"
