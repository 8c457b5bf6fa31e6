"""Bad input stops the run before any test with one usage error (exit 4) that names the
option, ini key, variable or file and what it takes: never a traceback, never silence,
never one error per test."""

from __future__ import annotations

import pytest

SHAREDKV_TEST = """
import pytest

@pytest.mark.sharedkv_gpu
def test_gated():
    pass

@pytest.mark.sharedkv_gpu
def test_gated_too():
    pass
"""

# (command-line arguments, the ERROR line pytest must print)
BAD_OPTIONS = [
    (["--sharedkv-trials=1e400"],
     "--sharedkv-trials: '1e400' is out of range; it takes a whole number from 1 to 100000"),
    (["--sharedkv-trials=nan"], "--sharedkv-trials: 'nan' is out of range; it takes *"),
    (["--sharedkv-endpoints=http://a b:1,http://127.0.0.1:2"],
     "--sharedkv-endpoints: 'http://a b:1' is not an http(s) URL*"),
    (["--sharedkv-endpoints=http://127.0.0.1:99999,http://127.0.0.1:2"],
     "--sharedkv-endpoints: 'http://127.0.0.1:99999' is not an http(s) URL*port*"),
    (["--sharedkv-endpoints=http://127.0.0.1:1,http://127.0.0.1:1"],
     "--sharedkv-endpoints: names 'http://127.0.0.1:1' twice*"),
    (["--sharedkv-chunk-size=7"],
     "--sharedkv-chunk-size: '7' is not a multiple of 16 tokens*engine block*"),
    (["--sharedkv-model=/nonexistent"],
     "--sharedkv-model: /nonexistent does not exist; it takes a model checkpoint directory "
     "holding config.json"),
    (["--sharedkv-sizes=99999999GiB"],
     "--sharedkv-sizes: '99999999GiB' is out of range; it takes sizes from 1 byte to 1GiB*"),
    (["--sharedkv-delay-cycles=1e30"],
     "--sharedkv-delay-cycles: '1e30' is out of range; it takes a whole number from 1 to 1e11"),
    (["--sharedkv-inject-delay=1e30"],
     "--sharedkv-inject-delay: '1e30' is out of range; it takes a whole number from 0 to 1e11"),
    (["--sharedkv-pool-gib=inf"],
     "--sharedkv-pool-gib: 'inf' is out of range; it takes a number above 0 and up to 4096"),
    (["--sharedkv-pool-gib=nan"], "--sharedkv-pool-gib: 'nan' is out of range*"),
    (["--sharedkv-host-budget-gib=1e400"], "--sharedkv-host-budget-gib: '1e400' is out of*"),
    (["--sharedkv-lease-timeout=inf"], "--sharedkv-lease-timeout: 'inf' is out of range*"),
    (["--sharedkv-settle-s=1e9"], "--sharedkv-settle-s: '1e9' is out of range*"),
    (["--sharedkv-allocators=lazy,lazy"],
     "--sharedkv-allocators: 'lazy,lazy' names lazy twice; each once, e.g. lazy,mixed"),
    (["--sharedkv-sizes=4KiB,4096"],
     "--sharedkv-sizes: '4KiB,4096' names 4KiB twice (4KiB and 4096 are the same size)*"),
    (["--sharedkv-targets=tensor-copy,tensor-copy"],
     "--sharedkv-targets: 'tensor-copy,tensor-copy' names tensor-copy twice*"),
    (["--sharedkv-layouts=fa-nhd-bf16,fa-nhd-bf16"],
     "--sharedkv-layouts: 'fa-nhd-bf16,fa-nhd-bf16' names fa-nhd-bf16 twice*"),
    (["--sharedkv-provider=stub", "--sharedkv-inject-delay=1e8"],
     "--sharedkv-inject-delay: the stub provider launches no process to delay*"),
    (["--sharedkv-endpoints=http://127.0.0.1:1,http://127.0.0.1:2",
      "--sharedkv-inject-delay=1e8"],
     "--sharedkv-inject-delay: the external provider launches no process to delay*"),
    (["--sharedkv-provider=external", "--sharedkv-triage"],
     "--sharedkv-triage: the triage relaunches the pair under each of its controls, and the "
     "external provider (--sharedkv-provider) serves a deployment the suite never starts or "
     "stops; drop one of them"),
]


@pytest.mark.parametrize(("args", "message"), BAD_OPTIONS,
                         ids=[" ".join(a).removeprefix("--sharedkv-") for a, _ in BAD_OPTIONS])
def test_bad_option_is_one_named_usage_error(pytester: pytest.Pytester, args: list[str],
                                             message: str) -> None:
    pytester.makepyfile(SHAREDKV_TEST)
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    out = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in out and "INTERNALERROR" not in out
    assert "PASSED" not in out and "passed" not in out


def test_bad_ini_value_names_the_ini_key(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nsharedkv_trials = 1e400\n")
    pytester.makepyfile(SHAREDKV_TEST)
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: ini option sharedkv_trials: '1e400' is out of range*"])


def test_model_directory_without_config(pytester: pytest.Pytester) -> None:
    pytester.mkdir("model")
    result = pytester.runpytest("--sharedkv-model=model")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --sharedkv-model: {pytester.path}/model holds no "
                                 "config.json; it takes a model checkpoint directory holding "
                                 "config.json"])
    (pytester.path / "model" / "config.json").write_text("{}")
    pytester.makepyfile("def test_x(sharedkv_settings):\n"
                        "    assert sharedkv_settings.model.name == 'model'\n")
    pytester.runpytest("--sharedkv-model=model").assert_outcomes(passed=1)


# (environment, the ERROR line): checked once sharedkv items are collected
BAD_ENVIRONMENT = [
    ({"SHAREDKV_FAKE_GPUS": "0,0"},
     "SHAREDKV_FAKE_GPUS='0,0': names device 0 twice; it takes device indices, e.g. 0,1*"),
    ({"SHAREDKV_FAKE_GPUS": "0:inf"},
     "SHAREDKV_FAKE_GPUS='0:inf': 'inf' is not a number of free GiB*"),
    ({"SHAREDKV_FAKE_GPUS": "one"}, "SHAREDKV_FAKE_GPUS='one': 'one' is not a device index*"),
    ({"CUDA_VISIBLE_DEVICES": "garbage"},
     "CUDA_VISIBLE_DEVICES='garbage': 'garbage' is not a device index or a GPU-/MIG- UUID*"),
    ({"CUDA_VISIBLE_DEVICES": "0,0"}, "CUDA_VISIBLE_DEVICES='0,0': names a device twice*"),
]


@pytest.mark.parametrize(("environ", "message"), BAD_ENVIRONMENT,
                         ids=[",".join(f"{k}={v}" for k, v in e.items())
                              for e, _ in BAD_ENVIRONMENT])
@pytest.mark.parametrize("workers", [None, "2"])
def test_bad_device_environment_is_one_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, environ: dict[str, str],
    message: str, workers: str | None
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    pytester.makepyfile(SHAREDKV_TEST)
    # in-process where no xdist worker is involved (nothing here reaches a device); under
    # xdist the error must cross from the workers to the controller of a real run
    if workers:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", workers)
    else:
        result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    out = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in out and "INTERNALERROR" not in out
    assert "PASSED" not in out and " passed" not in out


# A variable the plugin reads once the run is active, a bad value of it, and the error.
ACTIVE_ONLY = [
    ("CUDA_VISIBLE_DEVICES", "garbage", "CUDA_VISIBLE_DEVICES='garbage': *"),
    ("SHAREDKV_SERVICE_MEASURED", "lots", "SHAREDKV_SERVICE_MEASURED='lots': 'lots' is not a "
                                          "whole number*"),
    ("SHAREDKV_RUNTIME_DIR", "{tmp}/a-file", "SHAREDKV_RUNTIME_DIR={tmp}/a-file: not a "
                                             "directory (it names the directory every run *"),
]


@pytest.mark.parametrize(("name", "value", "message"), ACTIVE_ONLY,
                         ids=[name for name, _, _ in ACTIVE_ONLY])
def test_a_bad_variable_does_not_bother_other_projects(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, name: str, value: str,
    message: str
) -> None:
    """A project without sharedkv tests never hears about the plugin's variables; a run
    that uses the plugin (an option, or a sharedkv test collected) stops before any test."""
    (pytester.path / "a-file").write_text("")
    monkeypatch.setenv(name, value.replace("{tmp}", str(pytester.path)))
    message = message.replace("{tmp}", str(pytester.path))
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "sharedkv:" not in result.stdout.str() + result.stderr.str()
    for args, test in ((["--sharedkv-trials=3"], "def test_x(): pass"),
                       ([], "import pytest\n\n@pytest.mark.ordering\ndef test_x(): pass")):
        pytester.makepyfile(test)
        result = pytester.runpytest("-p", "no:cacheprovider", *args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, (args, result.stdout.str())
        result.stderr.fnmatch_lines([f"ERROR: {message}"])
        assert "passed" not in result.stdout.str()


def test_a_closed_endpoint_names_the_replica_in_one_line(pytester: pytest.Pytester) -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    urls = f"http://127.0.0.1:{port},http://127.0.0.1:{port + 1 if port < 65535 else 1}"
    result = pytester.runpytest_subprocess(
        "--pyargs", "pytest_sharedkv.suites", "-m", "replica_pair", "-k", "cross_replica",
        "-p", "no:cacheprovider", f"--sharedkv-endpoints={urls}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"replica A (http://127.0.0.1:{port}): request failed: "
                                 "GET /v1/models: [[]Errno *Connection refused"])
    failure = result.stdout.str().split("= FAILURES =", 1)[1].split("sharedkv summary")[0]
    assert "Traceback" not in failure and len(failure.splitlines()) < 10, failure


def test_fake_discovery_reads_cuda_visible_devices_like_cuda(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry that names no device ends the list (as CUDA does): never leased as 'unknown'."""
    from pytest_sharedkv.host import devices
    smi = (devices.Gpu("0", "H200", uuid="GPU-aaaa"), devices.Gpu("1", "H200", uuid="GPU-bbbb"))
    monkeypatch.setattr(devices, "query_nvidia_smi", lambda *a, **k: smi)
    found = devices.discover(environ={"CUDA_VISIBLE_DEVICES": "1,7,0"})
    assert [g.token for g in found.gpus] == ["1"]
    assert "'7' names no device" in found.note
    assert devices.discover(environ={"CUDA_VISIBLE_DEVICES": "-1"}).gpus == ()
