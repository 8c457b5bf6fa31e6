"""The hosts topology's options (--sharedkv-topology, --sharedkv-l2, --sharedkv-l1-gib,
--sharedkv-l2-fault-gap): bad values and what the L2 needs are usage errors naming the
option before any test, never a traceback; the header names the topology. In-process runs:
nothing here starts a server."""

from __future__ import annotations

import socket

import pytest

from pytest_sharedkv.stack.l2 import backends as l2
from pytest_sharedkv.stack.l2 import redis_server
from tests.conftest import keep_loaded

# redis (the unreachable L2's ping) loaded outside any inner run: dropped after one, it
# leaves the next in-process run of the test without the plugin's entry point
keep_loaded("redis", "redis.backoff", "redis.retry")
STUB = ["--sharedkv-provider=stub"]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(("args", "message"), [
    (["--sharedkv-topology=two"], "--sharedkv-topology: 'two' is not one of shared, hosts"),
    (["--sharedkv-topology=hosts", "--sharedkv-l2=redis"],
     "--sharedkv-l2: 'redis' is no L2; it takes one of fs, fs_native, resp, valkey or an "
     "existing L2's --l2-adapter JSON object*"),
    (["--sharedkv-topology=hosts", "--sharedkv-l2={type: fs}"],
     "--sharedkv-l2: '{type: fs}' is not JSON (Expecting property name enclosed in double "
     "quotes: line 1 column 2 (char 1)); it takes*"),
    (["--sharedkv-topology=hosts", '--sharedkv-l2={"base_path": "/kv"}'],
     "--sharedkv-l2: '{\"base_path\": \"/kv\"}' has no \"type\"; it takes*"),
    (["--sharedkv-l1-gib=0"], "--sharedkv-l1-gib: '0' is out of range*"),
    (["--sharedkv-topology=hosts", "--sharedkv-l2-fault-gap=0"],
     "--sharedkv-l2-fault-gap: '0' is out of range; it takes a whole number from 1 to 4096"),
    (["--sharedkv-l2=resp"], "--sharedkv-l2: only the hosts topology uses an L2, and "
                             "--sharedkv-topology is shared; give --sharedkv-topology hosts "
                             "or drop --sharedkv-l2"),
    (["--sharedkv-topology=hosts",
      "--sharedkv-endpoints=http://127.0.0.1:9,http://127.0.0.1:10"],
     "--sharedkv-topology: the hosts topology launches one LMCache server per replica, and "
     "the external provider (--sharedkv-endpoints) serves a deployment the suite never "
     "starts or stops; drop one of them"),
])
def test_a_bad_topology_option_is_a_usage_error(pytester: pytest.Pytester, args: list[str],
                                                message: str) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_what_the_l2_needs_is_a_usage_error_before_any_test(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """An existing L2 that does not answer, or whose directory is missing, and the suite's
    Redis without a binary: each names the option and its value."""
    pytester.makepyfile("def test_x(): pass")
    port = _closed_port()
    unreachable = f'{{"type": "resp", "host": "127.0.0.1", "port": {port}}}'
    result = pytester.runpytest(*STUB, "--sharedkv-topology=hosts",
                                f"--sharedkv-l2={unreachable}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --sharedkv-l2 {unreachable}: no Redis answers at "
                                 f"127.0.0.1:{port} (ConnectionError*"])
    missing = pytester.path / "absent"
    result = pytester.runpytest(*STUB, "--sharedkv-topology=hosts",
                                f'--sharedkv-l2={{"type": "fs", "base_path": "{missing}"}}')
    result.stderr.fnmatch_lines([f"ERROR: --sharedkv-l2 *: L2 directory {missing} does not "
                                 "exist"])
    assert not missing.exists()  # a user's L2: nothing created
    monkeypatch.setattr(redis_server, "find_redis_server", lambda path=None: None)
    pytester.makeini("[pytest]\nsharedkv_topology = hosts\nsharedkv_l2 = resp\n")
    result = pytester.runpytest(*STUB)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: ini option sharedkv_l2 resp: no redis-server: none "
                                 "on PATH*"])


def test_an_adapter_the_installed_lmcache_lacks_is_a_usage_error(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """valkey where LMCache's adapter needs valkey-glide-sync, which is not installed."""
    monkeypatch.setattr(l2, "_lmcache_dir", lambda: pytester.path)
    monkeypatch.setattr(l2, "adapter_problem", lambda kind, lmcache=None: l2.L2Problem(
        "adapter-missing", f"LMCache's {kind!r} L2 adapter needs PyPI valkey-glide-sync "
                           "(module glide_sync), which is not installed"))
    monkeypatch.setattr(redis_server, "find_redis_server", lambda path=None: object())
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(*STUB, "--sharedkv-topology=hosts", "--sharedkv-l2=valkey")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --sharedkv-l2 valkey: LMCache's 'valkey' L2 adapter "
                                 "needs PyPI valkey-glide-sync (module glide_sync), which is "
                                 "not installed"])


def test_the_header_names_the_topology_and_the_settings_keep_it(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(sharedkv_settings):\n"
                        "    assert sharedkv_settings.topology == 'hosts'\n"
                        "    assert sharedkv_settings.l1_gib == 0.5\n")
    result = pytester.runpytest(*STUB, "--sharedkv-topology=hosts", "--sharedkv-l1-gib=0.5")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["sharedkv: topology: hosts (one LMCache server per replica, "
                                 "sharing only the L2 fs; 0.5 GiB L1 each "
                                 "(--sharedkv-l1-gib))"])
    plain = pytester.runpytest(*STUB)
    plain.stdout.fnmatch_lines(["sharedkv: topology: shared (one LMCache server both replicas "
                                "use; default L1)"])



@pytest.mark.parametrize(("args", "message"), [
    (["--sharedkv-topology=hosts", '--sharedkv-l2={"type": "fs", "base_path": "/sys/kernel"}'],
     "ERROR: --sharedkv-l2 *: L2 directory /sys/kernel: *"),
    (["--sharedkv-topology=hosts", '--sharedkv-l2={"type": "resp", "host": "127.0.0.1", '
                                   '"port": "6379"}'],
     "ERROR: --sharedkv-l2 *: L2 adapter of type 'resp': field 'port' must be an integer, "
     "found str '6379'"),
    (["--sharedkv-l1-gib=1e-12"],
     "ERROR: --sharedkv-l1-gib: 1e-12 GiB (0.00107 bytes) holds less than one chunk: a "
     "chunk of * tokens takes * bytes (the stub double's, 1,024 a token); give at least *"),
    (["--sharedkv-snapshot-dir=FILE"],
     "ERROR: --sharedkv-snapshot-dir: * is not a directory (it names where stored reference "
     "answers live)"),
], ids=["fs-unwritable", "port-string", "l1-under-a-chunk", "snapshot-dir-file"])
def test_start_up_checks_check_what_they_claim(pytester: pytest.Pytester, args: list[str],
                                               message: str) -> None:
    """Issue 52: an fs L2 directory where no file can be made (root passes os.access on
    /sys/kernel), a Redis port given as a string, an L1 smaller than one chunk and a
    snapshot directory that is a file: usage errors naming what is wrong."""
    test_file = pytester.makepyfile("def test_x(): pass")
    args = [a.replace("FILE", str(test_file)) for a in args]
    result = pytester.runpytest(*STUB, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stderr.str()
    result.stderr.fnmatch_lines([message])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
