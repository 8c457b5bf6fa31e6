"""The suite's Redis client (PyPI redis, redis-py) where it is not installed: a GPU host
whose LMCache came with --no-deps ran the in-process stack with redis-server on PATH and
every test errored with ModuleNotFoundError at setup. Now one helper
(redis_server.client_missing) says so: configurations that start or reach a Redis are a
usage error naming the option and the package before any test, the cells that use a
Redis only optionally skip naming it, and nothing else asks for it (the stub double's
in-process stack starts no Redis). The client is hidden as if uninstalled
(``sys.modules["redis"] = None``: its import fails), the binary faked where the check
must get past it."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from pytest_sharedkv.models.copy_attention_model import AttentionCopyRecipe, config_dict
from pytest_sharedkv.stack.l2 import backends as l2
from pytest_sharedkv.stack.l2 import redis_server
from pytest_sharedkv.stack.launch import stacks as stack_launch
from pytest_sharedkv.stack.launch.spec import StackUnavailable
from tests.conftest import keep_loaded
from tests.test_stacks_wiring import cases, model, spec_for

keep_loaded("torch", "lmcache", "redis", "redis.backoff", "redis.retry")

HIDE_REDIS = """
import sys

sys.modules["redis"] = None  # as if redis-py were not installed: its import fails
"""
PACKAGE = "the package redis (redis-py) does not import"
EXISTING = '{"type": "resp", "host": "127.0.0.1", "port": 1}'


@pytest.fixture
def hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process without redis-py, and with a redis-server (never started here)."""
    monkeypatch.setitem(sys.modules, "redis", None)
    monkeypatch.setattr(redis_server, "find_redis_server",
                        lambda path=None: redis_server.RedisBinary(Path("/r"), "PATH"))


@pytest.fixture
def fake_binary(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A redis-server on PATH for a subprocess run, so that the check gets past the binary
    to the client; nothing may start it (it would exit 1 with nothing to answer)."""
    folder = pytester.path / "bin"
    folder.mkdir()
    binary = folder / "redis-server"
    binary.write_text("#!/bin/sh\nexit 1\n")
    binary.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{Path(sys.executable).parent}:/usr/bin:/bin")


def test_the_helper_says_what_is_missing_and_how_to_install_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert redis_server.client_missing() is None  # installed here (the lmcache extra)
    monkeypatch.setitem(sys.modules, "redis.retry", None)  # a redis without what client() uses
    why = redis_server.client_missing()
    assert why is not None and "redis.retry" in why and "pip install redis" in why
    monkeypatch.setitem(sys.modules, "redis", None)
    why = redis_server.client_missing()
    assert why is not None and PACKAGE in why and "pip install redis" in why


@pytest.mark.usefixtures("hidden")
def test_a_redis_the_suite_starts_or_reaches_names_the_client() -> None:
    """As data (the L2's problem kind), never a ModuleNotFoundError from the first ping."""
    with pytest.raises(l2.L2Unavailable) as caught:
        l2.suite_redis(Path("/nowhere"))
    assert caught.value.problem.kind == "client-missing"
    assert PACKAGE in caught.value.problem.message
    for value in ("resp", "valkey", EXISTING):
        problem = l2.configure_problem(value, stub=True)
        assert problem is not None and problem.kind == "client-missing", (value, problem)
    assert redis_server.missing() == redis_server.client_missing()  # the skips' reason
    assert l2.configure_problem("fs", stub=True) is None  # a directory needs no client


@pytest.mark.usefixtures("hidden")
def test_the_inprocess_stacks_redis_names_the_client(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Planning the launch needs neither; starting it names the client, before a replica."""
    from pytest_sharedkv.stack.launch import providers

    def launched(_: object) -> None:
        raise AssertionError("the replicas started without their Redis")

    monkeypatch.setattr(providers, "launch_vllm_pair", launched)
    spec = spec_for(tmp_path, config_dict(AttentionCopyRecipe()))
    planned = stack_launch.stacked_spec(spec, "inprocess", cases({"3k": (4, 3009)}), 8)
    with pytest.raises(StackUnavailable,
                       match=r"^--sharedkv-stack inprocess: no Python client for Redis"):
        stack_launch.launch_stack_pair(planned)
    none = stack_launch.stacked_spec(spec, "inprocess", cases({"3k": (4, 3009)}), 8,
                                     stack_launch.InprocessTiers(remote=False))
    assert none.stack is not None and none.stack.backend is None  # no Redis, no client


PAIR_TEST = """
import pytest

@pytest.mark.replica_pair
def test_x(sharedkv_replica_pair):
    pass
"""


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(hide_redis=HIDE_REDIS, test_pair=PAIR_TEST)
    model(pytester.path, config_dict(AttentionCopyRecipe()))
    return pytester.runpytest_subprocess("-p", "hide_redis", "-p", "no:cacheprovider",
                                         "test_pair.py", *args)


@pytest.mark.usefixtures("fake_binary")
@pytest.mark.parametrize(("args", "option"), [
    (["--sharedkv-provider=vllm", "--sharedkv-stack=inprocess", "--sharedkv-model=model"],
     "--sharedkv-stack inprocess shares KV through a Redis the suite starts "
     "(--sharedkv-inprocess-remote redis): "),
    (["--sharedkv-provider=stub", "--sharedkv-topology=hosts", "--sharedkv-l2=resp"],
     "--sharedkv-l2 resp: "),
    (["--sharedkv-provider=stub", "--sharedkv-topology=hosts", f"--sharedkv-l2={EXISTING}"],
     f"--sharedkv-l2 {EXISTING}: "),
])
def test_a_run_that_needs_the_client_is_a_usage_error_before_any_test(
        pytester: pytest.Pytester, args: list[str], option: str) -> None:
    result = _run(pytester, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines([f"ERROR: {option}no Python client for Redis: {PACKAGE} "
                                 "(*); pip install redis*"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
    assert not re.search(r"\d+ (passed|failed|skipped|errors?)\b", result.stdout.str())


@pytest.mark.usefixtures("fake_binary")
@pytest.mark.parametrize("args", [
    ["--sharedkv-provider=stub", "--sharedkv-stack=inprocess"],  # the double starts no Redis
    ["--sharedkv-provider=vllm", "--sharedkv-stack=inprocess", "--sharedkv-model=model",
     "--sharedkv-inprocess-remote=none"],
])
def test_a_run_that_starts_no_redis_needs_no_client(pytester: pytest.Pytester,
                                                    args: list[str]) -> None:
    result = _run(pytester, *args, "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()
    result.stdout.fnmatch_lines(["test_pair.py::test_x*"])


SERVICE = ["--pyargs", "pytest_sharedkv.suites", "-m", "service_regression", "-p",
           "no:cacheprovider", "--sharedkv-provider=stub", "--sharedkv-settle-s=0.05",
           "--sharedkv-service-sizes=3k", "--sharedkv-json=r.json", "-k", "l2_write_failure",
           "--sharedkv-topology=hosts", "-rs"]
REPLICA = ["--pyargs", "pytest_sharedkv.suites", "-m", "replica_pair", "-p", "no:cacheprovider",
           "--sharedkv-provider=stub", "-k", "write_failure", "--sharedkv-json=r.json",
           "--sharedkv-topology=hosts", "-rs"]


@pytest.mark.usefixtures("hidden")
@pytest.mark.parametrize(("args", "cell"), [
    (SERVICE, "the L2 write-failure cell"), (REPLICA, "the write-failure cell")])
def test_a_cell_that_fills_a_redis_skips_naming_the_client(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, args: list[str],
        cell: str) -> None:
    from pytest_sharedkv.config.options import MEASURED_ENV

    monkeypatch.setenv(MEASURED_ENV, "2")
    result = pytester.runpytest_inprocess(*args)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([f"*{cell} fills a Redis the suite starts: no Python client "
                                 f"for Redis: {PACKAGE} (*); pip install redis*"])
    tests = json.loads((pytester.path / "r.json").read_text())["tests"]
    assert [t["outcome"] for t in tests] == ["skipped"]
