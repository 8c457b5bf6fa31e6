"""What installing the plugin pulls in: nothing heavy it does not import when it loads, no
upper caps that fight the next vLLM, and nothing that replaces an editable LMCache."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
HEAVY = {"torch", "lmcache", "vllm"}


def _requirements(extra: str | None = None) -> list[Requirement]:
    texts = PROJECT["dependencies"] if extra is None else PROJECT["optional-dependencies"][extra]
    return [Requirement(t) for t in texts]


def test_nothing_heavy_is_required() -> None:
    names = {r.name.lower() for r in _requirements()}
    assert not names & HEAVY, names


def test_no_upper_caps_on_the_stack() -> None:
    for extra in (None, *PROJECT["optional-dependencies"]):
        for req in _requirements(extra):
            if req.name.lower() in HEAVY:
                assert all(s.operator in (">=", ">") for s in req.specifier), (extra, str(req))


def test_an_editable_lmcache_satisfies_the_lmcache_extra() -> None:
    """LMCache's CI installs LMCache from its checkout as 0.0.0+ci; a lower bound it fails
    would make pip replace it with a released LMCache."""
    reqs = {r.name.lower(): r for r in _requirements("lmcache")}
    assert reqs["lmcache"].specifier.contains("0.0.0+ci", prereleases=True)
    assert "torch" in reqs  # '.[lmcache]' alone gives a working suite (the README command)


def test_the_suites_redis_client_is_declared() -> None:
    """stack/l2/redis_server.py talks to its Redis with redis-py (CLIENT_MODULES): the redis
    extra declares it and the lmcache extra (the README's install) carries the same
    requirement, uncapped. LMCache requiring it too is no declaration: the GPU kit installs
    LMCache without its dependencies, and ran the in-process stack without redis-py."""
    from pytest_sharedkv.stack.l2.redis_server import CLIENT_MODULES

    redis = {r.name.lower(): r for r in _requirements("redis")}
    assert set(redis) == {m.split(".")[0] for m in CLIENT_MODULES} == {"redis"}
    lmcache = {r.name.lower(): r for r in _requirements("lmcache")}
    assert str(lmcache["redis"]) == str(redis["redis"])
    assert all(s.operator in (">=", ">") for s in redis["redis"].specifier)


def test_the_torch_extra() -> None:
    assert [r.name for r in _requirements("torch")] == ["torch"]


HIDE_TORCH = """
import sys

sys.modules["torch"] = None  # as if torch were not installed: import fails, find_spec is None
"""


def test_tiers_skip_with_the_reason_when_torch_is_absent(
    pytester: pytest.Pytester, fake_gpus: Callable[[str], None]
) -> None:
    pytester.makepyfile(hide_torch=HIDE_TORCH)
    fake_gpus("0")  # gated tests get their lease and meet the missing torch themselves
    result = pytester.runpytest_subprocess(
        "-p", "hide_torch", "--pyargs", "pytest_sharedkv.suites", "-p", "no:cacheprovider",
        "-m", "ordering or packed_page or pinned_pool", "--sharedkv-sizes=4KiB",
        "--sharedkv-layouts=fa-nhd-bf16", "--sharedkv-json=report.json", "-rs")
    result.stdout.fnmatch_lines(["sharedkv: torch not installed; *"])
    data = json.loads((pytester.path / "report.json").read_text())
    outcomes = {t["outcome"] for t in data["tests"]}
    assert outcomes == {"skipped"}, [t for t in data["tests"] if t["outcome"] != "skipped"]
    reasons = {t["message"] for t in data["tests"]}
    assert all(r.startswith("torch not importable: ModuleNotFoundError") for r in reasons), reasons
