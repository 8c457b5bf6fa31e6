"""The shipped ordering suite end to end: matrix, gating, tables, verdicts, void runs.

GPU-free: the suite runs on the simulated-stream test double (SHAREDKV_SIMULATED_STREAMS)
and fake leased devices, in-process (pytester.runpytest: the same plugin, options and
reports as a user's run, without an interpreter start and a torch import per run).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.host import lmcache_status
from pytest_sharedkv.host.devices import FAKE_GPUS_ENV
from pytest_sharedkv.ordering.targets import REFERENCE_REASON
from pytest_sharedkv.report.terminal import verdict
from tests.conftest import isolate, keep_loaded
from tests.golden import assert_golden
from tests.recorded import read, run_log

# The inner runs are in-process (pytester.runpytest): what an inner run first imports is
# dropped after it, and torch and lmcache do not import twice, so they load here first.
keep_loaded("torch", "lmcache", "lmcache.v1.platform")
REAL_PROBE = lmcache_status.probe

SCREENING = Path(__file__).resolve().parents[1] / "fixtures" / "perf" / "screening.json"
ORDERING_NODE = "suites/test_ordering.py::test_copy_path_is_stream_ordered[sim-ordered-D2H-4KiB]"
FAST = ["--pyargs", "pytest_sharedkv.suites", "-m", "ordering", "-p", "no:cacheprovider",
        "--sharedkv-sizes=4KiB,64KiB", "--sharedkv-trials=3", "--sharedkv-delay-cycles=5e6"]


# A target another plugin adds through the extension hook.
EXTENSION = """
from pytest_sharedkv.ordering.simulated import SimOrderedCopy
from pytest_sharedkv.ordering.targets import CopyTarget

def pytest_sharedkv_copy_targets(registry):
    registry.add(CopyTarget("mooncake-transfer", "under-test",
                            "a third-party copy path", SimOrderedCopy,
                            backend="simulated"))
"""
# The same, its factory defined in the conftest, run under CUDA_LAUNCH_BLOCKING=1.
PLUGIN_TARGET = """
from pytest_sharedkv.ordering.simulated import SimOrderedCopy
from pytest_sharedkv.ordering.targets import CopyTarget

class MooncakeCopy(SimOrderedCopy):
    description = "a third-party copy path, defined in a conftest"

def pytest_sharedkv_copy_targets(registry):
    registry.add(CopyTarget("mooncake-transfer", "under-test", "third party",
                            MooncakeCopy, backend="simulated"))
"""


def shared_run(tmp_path_factory: pytest.TempPathFactory, config: pytest.Config,
               conftest: str, **env: str) -> tuple[str, dict[str, Any]]:
    """One simulated run of the FAST matrix with CONFTEST's target beside the built-in ones
    (its stdout and JSON report), for the module fixtures that several tests read. Set up
    before the autouse isolation, it isolates its own environment."""
    path = tmp_path_factory.mktemp("shared-run")
    (path / "conftest.py").write_text(conftest)
    with pytest.MonkeyPatch.context() as monkeypatch:
        isolate(monkeypatch, config, tmp_path_factory)
        for name, value in {FAKE_GPUS_ENV: "0", "SHAREDKV_SIMULATED_STREAMS": "1",
                            **env}.items():
            monkeypatch.setenv(name, value)
        out = subprocess.run([sys.executable, "-m", "pytest", *FAST,
                              "--sharedkv-json=report.json"], cwd=path, capture_output=True,
                             text=True, timeout=600, check=False)
    assert (path / "report.json").exists(), (out.stdout + out.stderr)[-3000:]
    return out.stdout, json.loads((path / "report.json").read_text())


@pytest.fixture(scope="module")
def extended_run(tmp_path_factory: pytest.TempPathFactory,
                 pytestconfig: pytest.Config) -> tuple[str, dict[str, Any]]:
    """The matrix with the extension's target: read by the matrix test and the hook test."""
    return shared_run(tmp_path_factory, pytestconfig, EXTENSION)


@pytest.fixture(scope="module")
def launch_blocking_run(tmp_path_factory: pytest.TempPathFactory,
                        pytestconfig: pytest.Config) -> tuple[str, dict[str, Any]]:
    """The matrix under CUDA_LAUNCH_BLOCKING=1 with a plugin's own target: read by the
    verdict test and the plugin-target test."""
    return shared_run(tmp_path_factory, pytestconfig, PLUGIN_TARGET, CUDA_LAUNCH_BLOCKING="1")


def _target(nodeid: str) -> str:
    """The copy target of an ordering test's id ([target-direction-size])."""
    return nodeid.rsplit("[", 1)[1].rsplit("-", 2)[0]


# The simulated targets that copy at once race the simulated stream even undelayed: their
# undelayed cells, and the counts the summary makes of them, are left to chance.
RACING = (
    (re.compile(r"^(\| sim-(raw|unordered) +\| [\w-]+ +\| \w+ +\| \w+ +\| )\d+/\d+"), r"\1#/#"),
    (re.compile(r"; \d+/12 undelayed checks held"), "; #/12 undelayed checks held"),
    (re.compile(r", \d+/12 undelayed checks saw stale bytes"), ""),
)


def _tally(data: dict[str, Any], target: str, delayed: bool) -> tuple[int, int]:
    """(passed, trials) of TARGET's delayed or undelayed checks: what its verdict says."""
    mine = [c for c in data["checks"] if c["key"]["target"] == target
            and (c["detail"]["delay_cycles"] > 0) == delayed]
    return sum(c["passed"] for c in mine), sum(c["trials"] for c in mine)


def _report(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _outcomes(data: dict[str, Any], plugin: bool) -> Counter[str]:
    """Outcomes of the plugin's target's tests (PLUGIN) or of the built-in targets' ones."""
    return Counter(t["outcome"] for t in data["tests"]
                   if (_target(t["nodeid"]) == "mooncake-transfer") == plugin)


@pytest.fixture
def simulated(monkeypatch: pytest.MonkeyPatch, fake_gpus: Callable[[str], None]
              ) -> Callable[[str], None]:
    def _set(mode: str = "1") -> None:
        fake_gpus("0")
        monkeypatch.setenv("SHAREDKV_SIMULATED_STREAMS", mode)

    return _set


@pytest.mark.golden
def test_simulated_matrix_tables_and_verdicts(
        extended_run: tuple[str, dict[str, Any]]) -> None:
    """The tier's summary as a whole is its golden file (tests/data/terminal/ordering.txt:
    the table, the probe's sensitivity, a verdict per target, the speed line); the records
    hold what it says."""
    stdout, data = extended_run
    # 4 targets x 2 directions x 2 sizes; the unordered path fails every cell (and the
    # extension's target passes its 4: test_extension_hook_adds_a_target)
    assert _outcomes(data, plugin=False) == {"passed": 12, "failed": 4}
    assert_golden(stdout, "ordering", RACING)
    checks = [c for c in data["checks"] if c["key"]["target"] != "mooncake-transfer"]
    assert len(checks) == 4 * 2 * 2 * 2
    assert all(c["detail"]["simulated"] and c["detail"]["backend"] == "simulated"
               for c in checks)
    failing = [c for c in checks if c["passed"] < c["trials"] and c["key"]["delay"] != "0"]
    assert {c["key"]["target"] for c in failing} == {"sim-raw", "sim-unordered"}
    first = failing[0]["detail"]["mismatches"][0]
    assert set(first) == {"trial", "count", "nbytes", "first_offset", "expected", "observed"}
    assert {c["status"] for c in checks} == {"pass", "fail"}  # a sensitive probe voids none
    # the verdicts' counts: the negative control saw stale bytes in every delayed check
    assert _tally(data, "sim-raw", delayed=True) == (0, 12)
    assert _tally(data, "sim-ordered", True) == _tally(data, "sim-ordered", False) == (12, 12)
    assert _tally(data, "sim-unordered", delayed=True) == (0, 12)
    # what the failed cell's record says: every byte stale from offset 0, and the remedy
    [cell] = [c for c in failing if c["nodeid"].endswith("[sim-unordered-D2H-4KiB]")
              and c["role"] == "under-test"]
    assert (cell["kind"], cell["status"], cell["passed"], cell["trials"]) == (
        "ordering", "fail", 0, 3)
    assert [(m["count"], m["nbytes"], m["first_offset"]) for m in cell["detail"]["mismatches"]
            ] == [(4096, 4096, 0)] * 3
    assert cell["detail"]["remedy"] == "remedy: (simulated) queue the copy on the current stream"
    [test] = [t for t in data["tests"] if t["nodeid"] == cell["nodeid"]]
    assert test["outcome"] == "failed"


def test_extension_hook_adds_a_target(pytester: pytest.Pytester,
                                      simulated: Callable[[str], None],
                                      extended_run: tuple[str, dict[str, Any]]) -> None:
    simulated("1")
    pytester.makeconftest(EXTENSION)
    listed = pytester.runpytest("--sharedkv-list-targets")
    assert listed.ret == 0
    # the listing is prose alone (no run, no report)
    listed.stdout.fnmatch_lines(["*mooncake-transfer * under-test * a third-party copy path*"])
    _, data = extended_run  # the same conftest, every target
    assert _outcomes(data, plugin=True) == {"passed": 4}
    assert _tally(data, "mooncake-transfer", True) == (12, 12)
    assert _tally(data, "mooncake-transfer", False) == (12, 12)


def test_blind_probe_makes_the_run_void(pytester: pytest.Pytester,
                                        simulated: Callable[[str], None]) -> None:
    simulated("blocking-default-stream")
    result = pytester.runpytest(*FAST, "--sharedkv-json=report.json")
    # nothing can pass when the negative control cannot see a fault
    result.assert_outcomes(failed=16)
    data = _report(pytester.path / "report.json")
    checks = data["checks"]
    assert len(checks) == 4 * 2 * 2 * 2
    assert {(c["kind"], c["status"]) for c in checks} == {("ordering", "void")}
    assert not [c for c in checks if "status" in c["detail"]]  # one place says it
    # the negative control held every delayed check: the probe cannot see a fault
    assert _tally(data, "sim-raw", delayed=True) == (12, 12)
    assert not [c for c in checks if c["detail"]["sensitive"]]
    assert verdict(run_log(read(pytester.path / "report.json"))) == "VOID"


def test_target_selection_and_unknown_target(pytester: pytest.Pytester,
                                             simulated: Callable[[str], None]) -> None:
    simulated("1")
    result = pytester.runpytest(*FAST, "--sharedkv-targets=sim-ordered", "--sharedkv-json=r.json")
    result.assert_outcomes(passed=4)
    # the gate still ran: the negative control's delayed cells, and only those, are recorded
    data = _report(pytester.path / "r.json")
    raw = [c for c in data["checks"] if c["key"]["target"] == "sim-raw"]
    assert len(raw) == 4 and {(c["key"]["delay"], c["role"], c["passed"], c["trials"])
                              for c in raw} == {("5e6", "negative-control", 0, 3)}
    bad = pytester.runpytest(*FAST, "--sharedkv-targets=sim-ordered,nope")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["ERROR: --sharedkv-targets: unknown copy target(s) nope; known:"
                              " sim-raw, sim-ordered, sim-sync-then-raw, sim-unordered"])


def test_cpu_machine_skips_with_reason_and_require_gpu_fails(
    pytester: pytest.Pytester, fake_gpus: Callable[[str], None]
) -> None:
    fake_gpus("")
    args = ["--pyargs", "pytest_sharedkv.suites", "-m", "ordering", "-p", "no:cacheprovider",
            "--sharedkv-targets=raw-cudamemcpy,tensor-copy", "--sharedkv-json=r.json"]
    result = pytester.runpytest(*args)
    result.assert_outcomes(skipped=12)
    assert {t["message"] for t in _report(pytester.path / "r.json")["tests"]} == {
        "needs 1 CUDA device, 0 visible (SHAREDKV_FAKE_GPUS)"}
    strict = pytester.runpytest(*args, "--sharedkv-require-gpu")
    strict.assert_outcomes(failed=12)
    # a device that torch cannot use (a CPU build) is a skip with its reason, then a failure
    fake_gpus("0")
    cpu = pytester.runpytest(*args)
    cpu.assert_outcomes(skipped=12)
    tests = _report(pytester.path / "r.json")["tests"]
    assert {t["outcome"] for t in tests} == {"skipped"}
    assert all("sees no CUDA device" in t["message"] for t in tests)
    assert pytester.runpytest(*args, "--sharedkv-require-gpu").ret == 1


def test_cuda_launch_blocking_gives_the_same_verdicts(
        launch_blocking_run: tuple[str, dict[str, Any]]) -> None:
    """LMCache's GPU unit lane sets CUDA_LAUNCH_BLOCKING=1: every launch is synchronous, the
    delay ends before the copy starts and no ordering fault can show. The probes then run
    in a child without it, and the verdicts are those of a run without it."""
    from pytest_sharedkv.ordering.child_session import NOTE

    _, data = launch_blocking_run
    assert _outcomes(data, plugin=False) == {"passed": 12, "failed": 4}  # the 4 built-ins
    assert NOTE in {n["text"] for n in data["notes"]}
    built_in = [c for c in data["checks"] if c["key"]["target"] != "mooncake-transfer"]
    assert len(built_in) == 4 * 2 * 2 * 2
    assert {c["status"] for c in data["checks"]} == {"pass", "fail"}  # the probe saw: no VOID
    assert not [c for c in data["checks"] if c["detail"]["launch_blocking"]]
    assert _tally(data, "sim-raw", delayed=True) == (0, 12)
    assert _tally(data, "sim-ordered", True) == _tally(data, "sim-ordered", False) == (12, 12)
    assert _tally(data, "sim-unordered", delayed=True) == (0, 12)


def test_a_plugins_own_target_reaches_the_child(
        launch_blocking_run: tuple[str, dict[str, Any]]) -> None:
    from pytest_sharedkv.ordering.child_session import NOTE

    _, data = launch_blocking_run
    assert _outcomes(data, plugin=True) == {"passed": 4}
    assert NOTE in {n["text"] for n in data["notes"]}
    mine = [c for c in data["checks"] if c["key"]["target"] == "mooncake-transfer"]
    assert {c["detail"]["description"] for c in mine} == {
        "a third-party copy path, defined in a conftest"}
    assert _tally(data, "mooncake-transfer", True) == (12, 12)
    assert _tally(data, "mooncake-transfer", False) == (12, 12)


def test_a_blind_probe_under_cuda_launch_blocking_names_the_variable() -> None:
    """Where the probe itself runs with CUDA_LAUNCH_BLOCKING set, the VOID says why and what
    to do, rather than "raise --sharedkv-delay-cycles"."""
    from pytest_sharedkv.ordering.summary import sensitivity_line
    from pytest_sharedkv.report.records import Check
    blind = Check("ordering", {"target": "raw-cudamemcpy"}, 3, 3, role="negative-control",
                  detail={"delay_cycles": 5, "launch_blocking": True})
    sensitive, line = sensitivity_line([blind])
    assert not sensitive
    assert "CUDA_LAUNCH_BLOCKING" in line and "--sharedkv-delay-cycles" not in line


def test_the_probe_names_cuda_launch_blocking_when_it_is_blind_because_of_it(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_sharedkv.config.options import Settings
    from pytest_sharedkv.ordering.cells import Cell
    from pytest_sharedkv.ordering.session import OrderingSession
    from pytest_sharedkv.ordering.simulated import SimulatedBackend
    from pytest_sharedkv.ordering.targets import builtin_registry
    from pytest_sharedkv.report.records import Bundle, ResultSink
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")  # as if the probe ran in such a process
    session = OrderingSession(SimulatedBackend(), builtin_registry(),
                              Settings(trials=2, delay_cycles=2_000_000, sizes=(4096,)))
    try:
        judgement = session.judge(Cell("sim-ordered", "D2H", 4096), ResultSink("t", Bundle()))
    finally:
        session.close()
    assert not judgement.ok
    assert judgement.message.startswith("VOID: probe NOT sensitive")
    assert "Unset CUDA_LAUNCH_BLOCKING for the ordering tier" in judgement.message
    assert "--sharedkv-delay-cycles" not in judgement.message


def test_an_insensitive_cell_is_a_void_record_that_compare_does_not_pass(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A blind probe (a blocking default stream: the negative control cannot see a fault)
    gives the cell's records status "void" (not a pass or fail with the VOID only in their
    detail), so ``compare`` of a report that holds them against a passing one is a FAIL
    with a VOID row per record, not an OK."""
    from pytest_sharedkv.cli.compare.main import main
    from pytest_sharedkv.config.options import Settings
    from pytest_sharedkv.ordering.cells import Cell
    from pytest_sharedkv.ordering.session import OrderingSession
    from pytest_sharedkv.ordering.simulated import SimulatedBackend
    from pytest_sharedkv.ordering.targets import builtin_registry
    from pytest_sharedkv.report.records import Bundle, ResultSink

    bundle = Bundle()
    session = OrderingSession(SimulatedBackend(blocking_default_stream=True),
                              builtin_registry(),
                              Settings(trials=2, delay_cycles=2_000_000, sizes=(4096,)))
    try:
        judgement = session.judge(Cell("sim-ordered", "D2H", 4096),
                                  ResultSink(ORDERING_NODE, bundle))
    finally:
        session.close()
    assert judgement.message.startswith("VOID: probe NOT sensitive")
    # the negative control passed its delayed checks, the control all of its: none proves
    assert [(c.key["target"], c.key["delay"], c.passed, c.trials, c.status)
            for c in bundle.checks] == [("sim-raw", "2e6", 2, 2, "void"),
                                        ("sim-ordered", "2e6", 2, 2, "void"),
                                        ("sim-ordered", "0", 2, 2, "void")]
    assert all(c.void for c in bundle.checks)
    passing: dict[str, Any] = json.loads(SCREENING.read_text())
    after = tmp_path / "after.json"
    after.write_text(json.dumps({**passing, "checks": [*passing["checks"], *(
        asdict(c) for c in bundle.checks)]}))
    assert main([str(SCREENING), str(after)]) == 1
    out = capsys.readouterr().out
    assert "RESULT: FAIL: 3 new correctness difference(s)" in out
    rows = [[cell.strip() for cell in line.strip("|").split("|")][:3]
            for line in out.splitlines() if line.startswith("| NEW")]
    assert rows == [["NEW", "VOID", f"ordering [target={target}, direction=D2H, size=4KiB, "
                                    f"delay={delay}]"]
                    for target, delay in (("sim-raw", "2e6"), ("sim-ordered", "2e6"),
                                          ("sim-ordered", "0"))]


# Its conftest replaces host.lmcache_status.probe for the inner run, which is in-process:
# the conftest puts the real probe back when the run ends (pytest_unconfigure runs however
# the run ends), so the replacement never outlives it.
STAND_IN_LMCACHE = """
from pytest_sharedkv.host import lmcache_status
from pytest_sharedkv.host.lmcache_status import LMCacheStatus
from pytest_sharedkv.ordering.targets import LMCACHE_LAZY_REMEDY, CopyTarget

NATIVE = {native}
REAL_PROBE = lmcache_status.probe
# A stand-in for what host.lmcache_status finds: LMCache 0.5.6 with its compiled cuda_ops
# bound (NATIVE) or on its torch fallback.
lmcache_status.probe = lambda: LMCacheStatus(
    lmcache_version="0.5.6", native_bound=NATIVE, kernel_module="lmcache.cuda_ops",
    device_ops="CudaDeviceOps",
    cuda_ops_error=None if NATIVE else "ImportError: undefined symbol: _ZN3c10")
SIM = "pytest_sharedkv.ordering.simulated"


def pytest_unconfigure(config):
    lmcache_status.probe = REAL_PROBE


def pytest_sharedkv_copy_targets(registry):
    # As lmcache-fallback: the torch fallback called directly (it ignores the stream).
    registry.add(CopyTarget(
        "sim-lmcache-fallback", "under-test", "simulated LMCache torch fallback",
        f"{{SIM}}:SimRawCopy", backend="simulated", remedy=LMCACHE_LAZY_REMEDY,
        fallback_for="lmcache", compiled_for="lmcache"))
    # As lmcache-lazy-helper: through what LMCache binds (ordered where compiled).
    registry.add(CopyTarget(
        "sim-lmcache-lazy", "under-test", "simulated LMCache lazy helper",
        f"{{SIM}}:{{'SimOrderedCopy' if NATIVE else 'SimRawCopy'}}", backend="simulated",
        remedy=LMCACHE_LAZY_REMEDY, compiled_for="lmcache"))
"""
LMCACHE_TARGETS = "--sharedkv-targets=sim-raw,sim-ordered,sim-lmcache-fallback,sim-lmcache-lazy"


def _summary(stdout: str) -> str:
    return stdout[stdout.index("sharedkv summary"):]


def test_the_fallback_is_a_reference_where_lmcache_binds_its_compiled_kernels(
        pytester: pytest.Pytester, simulated: Callable[[str], None]) -> None:
    """Issue 19's GPU run on 0.5.6 with cuda_ops bound: lmcache-fallback (never run by
    LMCache there) failed the run and the remedy said to install the build that was
    installed. Its fault is still measured and shown, as an xfail."""
    simulated("1")
    pytester.makeconftest(STAND_IN_LMCACHE.format(native=True))
    result = pytester.runpytest(*FAST, LMCACHE_TARGETS, "--sharedkv-json=r.json")
    assert lmcache_status.probe is REAL_PROBE  # the stand-in ended with its run
    result.assert_outcomes(passed=12, xfailed=4)
    assert result.ret == 0
    # the remedy is the summary's own reading of the records: prose alone
    result.stdout.fnmatch_lines([
        "*not the path under test: *if they stopped loading*keep a cuda_ops build that loads "
        "against this torch (*): PROVEN by this run (lmcache.cuda_ops loaded; "
        "sim-lmcache-lazy stream-ordered through it)",
        "*or run the LMCache server with --no-l1-use-lazy*",
    ])
    assert "install" not in _summary(result.stdout.str())
    data = _report(pytester.path / "r.json")
    fallback = [c for c in data["checks"] if c["key"]["target"] == "sim-lmcache-fallback"]
    assert fallback and all(c["detail"]["reference"] and c["detail"]["kernel_path"] ==
                            "compiled" for c in fallback)
    assert _tally(data, "sim-lmcache-fallback", delayed=True) == (0, 12)  # still measured
    assert _tally(data, "sim-lmcache-lazy", True) == _tally(data, "sim-lmcache-lazy", False) \
        == (12, 12)
    xfailed = [t for t in data["tests"] if t["outcome"] == "xfailed"]
    assert {t["nodeid"].split("[")[1].rsplit("-", 2)[0] for t in xfailed} == {
        "sim-lmcache-fallback"}
    assert all(t["message"].startswith(REFERENCE_REASON) for t in xfailed)
    assert {c["detail"]["kernel_module"] for c in fallback} == {"lmcache.cuda_ops"}


def test_on_the_torch_fallback_the_fallback_fails_and_the_build_is_only_suggested(
        pytester: pytest.Pytester, simulated: Callable[[str], None]) -> None:
    simulated("1")
    pytester.makeconftest(STAND_IN_LMCACHE.format(native=False))
    result = pytester.runpytest(*FAST, LMCACHE_TARGETS, "--sharedkv-json=r.json")
    assert lmcache_status.probe is REAL_PROBE  # the stand-in ended with its run
    result.assert_outcomes(passed=8, failed=8)
    data = _report(pytester.path / "r.json")
    fallback = [c for c in data["checks"] if c["key"]["target"] == "sim-lmcache-fallback"]
    assert fallback and not any(c["detail"]["reference"] for c in fallback)
    assert {c["detail"]["kernel_path"] for c in fallback} == {"torch-fallback"}
    assert _tally(data, "sim-lmcache-fallback", delayed=True) == (0, 12)
    # the remedy is the summary's own reading of the records: prose alone
    result.stdout.fnmatch_lines([
        "*remedy: run the LMCache server with --no-l1-use-lazy*",
        "*or suggested (no run in hand shows it): install a cuda_ops build that loads "
        "against this torch*",
    ])
    assert "PROVEN" not in result.stdout.str()


MISSING_PATH = """
from pytest_sharedkv.host.lmcache_api import MissingLMCacheAPI
from pytest_sharedkv.ordering.targets import CopyTarget

def absent(backend, sizes):
    raise MissingLMCacheAPI("fallback lmcache_memcpy_async",
                            ["lmcache.v1.platform.torch_ops:lmcache_memcpy_async (ImportError)"])

def pytest_sharedkv_copy_targets(registry):
    registry.add(CopyTarget("sim-absent", "under-test", "a path this release lacks", absent,
                            backend="simulated"))
"""


def test_a_copy_path_the_release_lacks_is_void_naming_where_it_looked(
        pytester: pytest.Pytester, simulated: Callable[[str], None]) -> None:
    """LMCache 0.5.3 on the GPU host: lmcache-fallback and lmcache-device-ops died on
    ImportErrors of 0.5.6's module names. A path no known place holds is VOID, said once
    per cell, with a void record, never a traceback."""
    simulated("1")
    pytester.makeconftest(MISSING_PATH)
    result = pytester.runpytest(*FAST, "--sharedkv-targets=sim-raw,sim-absent",
                                           "--sharedkv-json=r.json")
    result.assert_outcomes(passed=4, failed=4)
    assert "Traceback" not in result.stdout.str()
    data = _report(pytester.path / "r.json")
    absent = [c for c in data["checks"] if c["key"]["target"] == "sim-absent"]
    assert len(absent) == 4 and {(c["kind"], c["status"]) for c in absent} == {
        ("ordering", "void")}
    assert {c["detail"]["missing"] for c in absent} == {"fallback lmcache_memcpy_async"}
    assert {tuple(c["detail"]["tried"]) for c in absent} == {
        ("lmcache.v1.platform.torch_ops:lmcache_memcpy_async (ImportError)",)}
    failed = {t["nodeid"] for t in data["tests"] if t["outcome"] == "failed"}
    assert failed == {c["nodeid"] for c in absent}  # one VOID a cell, each its test's
    assert verdict(run_log(read(pytester.path / "r.json"))) == "VOID"
