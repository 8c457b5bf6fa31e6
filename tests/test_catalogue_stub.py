"""The fault catalogue end to end on the stub provider, in-process: the stub stands in for
the LMCache server's hooks (the same control file and log lines as engine_hooks.fault_hook,
the delay hook's log), so each class is applied, judged and recorded through the code a GPU
run uses. Small plans: the slice is the first few requests of 3k."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from pytest_sharedkv.config.options import MEASURED_ENV
from tests.launch_faults import LaunchFaults, Planted, StubFaults

BASE = ["--pyargs", "pytest_sharedkv.suites", "-m", "service_regression",
        "-p", "no:cacheprovider", "--sharedkv-provider=stub", "--sharedkv-settle-s=0.01",
        "--sharedkv-service-sizes=3k", "-k", "catalogue", "--sharedkv-json=r.json"]


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, measured: int,
         *args: str, faults: StubFaults | None = None
         ) -> tuple[pytest.RunResult, dict[str, dict[str, Any]]]:
    monkeypatch.setenv(MEASURED_ENV, str(measured))
    plugins = [Planted(LaunchFaults(stub=faults))] if faults is not None else []
    result = pytester.runpytest(*BASE, *args, plugins=plugins)
    report = json.loads((pytester.path / "r.json").read_text())
    cells = {c["key"]["step"]: c for c in report["checks"] if c["kind"] == "fault-catalogue"}
    return result, cells


def test_every_class_is_applied_and_judged_by_what_caught_it(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each hook class applied several times on one relaunched pair and caught (the audit
    sees every one that reaches an engine; unrestored or foreign state changes answers too),
    the unread flip caught by nothing as expected, the L2 load failure n/a without the
    two-host topology; a race the delay exposes fails the run as the stack's."""
    result, cells = _run(pytester, monkeypatch, 6, "--sharedkv-fault-catalogue=all",
                         faults=StubFaults(race_under_delay=True))
    result.assert_outcomes(failed=1)
    report = json.loads((pytester.path / "r.json").read_text())
    assert len([c for c in report["checks"] if c["kind"] == "fault-catalogue"]) == 9  # once each
    assert {k: c["status"] for k, c in cells.items()} == {
        "misrouted": "pass", "key-collision": "pass", "lost-write": "pass", "bit-flip": "pass",
        "bit-flip-unread": "pass", "state-unrestored": "pass", "state-foreign": "pass",
        "delayed-producer": "fail", "l2-load-failure": "info"}
    seen = {k: c["detail"]["detections"] for k, c in cells.items()}
    assert seen["misrouted"] == {"answers": "missed", "audit": "caught", "hits": "missed"}
    assert seen["state-foreign"] == {"answers": "caught", "audit": "caught", "hits": "missed"}
    assert seen["bit-flip-unread"] == {"answers": "missed", "audit": "missed",
                                       "hits": "missed"}
    assert seen["delayed-producer"]["answers"] == "caught"
    assert all(c["detail"]["applications"] >= 1 for k, c in cells.items()
               if k != "l2-load-failure")
    assert cells["misrouted"]["detail"]["faulted_requests"] >= 2
    assert cells["l2-load-failure"]["detail"]["not_applicable"].startswith(
        "it needs the two-host topology")
    result.stdout.fnmatch_lines([
        "*delayed-producer: the stack races: with a delayed producer before every KV "
        "transfer, caught by answers, audit*",
        "*CATALOGUE stub (test double): 7 of 8 fault classes seen as expected*",
        "*| n/a *| misrouted *| * | missed *| caught *| missed *| seen *|*",
        "*| n/a *| delayed-producer *| * | caught *| caught *| missed *| FAIL *|*",
        "*| n/a *| l2-load-failure *| - *| - *| - *| - *| n/a *|*"])


def test_a_class_nothing_caught_fails_the_run_saying_the_suite_cannot_see_it(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the audit off, a misroute the copy model's answers cannot see is seen by nothing:
    the catalogue says so and fails; foreign state still changes answers."""
    result, cells = _run(pytester, monkeypatch, 8, "--no-sharedkv-kv-audit",
                         "--sharedkv-fault-catalogue=misrouted,state-foreign")
    result.assert_outcomes(failed=1)
    assert {k: c["status"] for k, c in cells.items()} == {"misrouted": "fail",
                                                          "state-foreign": "pass"}
    assert cells["misrouted"]["detail"]["detections"]["audit"] == "off"
    result.stdout.fnmatch_lines(["*this suite cannot see misrouted on this stack (* "
                                 "applications in * requests; 0 of 8 answers wrong, audit "
                                 "off, hits as expected)*",
                                 "*| n/a *| misrouted *| * | missed *| off *| missed *| "
                                 "NOT SEEN *|*"])


def test_a_fault_the_server_never_applied_is_void(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server whose hooks never loaded (the switch set, the hook not on its path): the
    cell proves nothing, says why, and fails the run."""
    result, cells = _run(pytester, monkeypatch, 2, "--sharedkv-fault-catalogue=lost-write",
                         faults=StubFaults(no_hooks=True))
    result.assert_outcomes(failed=1)
    assert cells["lost-write"]["status"] == "void"
    result.stdout.fnmatch_lines(["*lost-write: VOID: the fault hook never loaded in the "
                                 "LMCache server*"])


# The inner run's plugin: every catalogue cell after the first waits before it sends, so
# a signal sent once the first cell is judged lands in the middle of the catalogue.
SLOW_CELLS = """
import time

from pytest_sharedkv.service.runner import Runner

_chain = Runner.chain


def chain(self, label, *args, **kwargs):
    if label.startswith("catalogue ") and label not in ("catalogue warm-up",
                                                         "catalogue misrouted"):
        time.sleep(60)
    return _chain(self, label, *args, **kwargs)


Runner.chain = chain
"""


def test_a_catalogue_killed_mid_way_reports_the_cells_that_finished(
        pytester: pytest.Pytester) -> None:
    """SIGTERM once the progress log shows the first cell judged: the JSON report holds
    that cell's record and the n/a one (judged at the start), none of the cells that never
    ran, and the summary says how far the catalogue got and which classes never ran."""
    pytester.makepyfile(slow_cells=SLOW_CELLS)
    basetemp = pytester.path / "bt"
    env = {**os.environ, MEASURED_ENV: "2"}
    with (pytester.path / "out.txt").open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", *BASE, "-p", "slow_cells",
             "--sharedkv-fault-catalogue=all", f"--basetemp={basetemp}"],
            cwd=pytester.path, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 240
            while proc.poll() is None and time.monotonic() < deadline:
                logs = list(basetemp.glob("service*/progress.log"))
                if logs and "catalogue misrouted: " in logs[0].read_text():
                    break
                time.sleep(0.05)
            # the cell's record reached the report as it was judged, before its progress
            # line: a run killed outright (SIGKILL) from here on still has it
            partial = json.loads((pytester.path / "r.json").read_text())
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
        finally:
            proc.kill()
            proc.wait()
    text = (pytester.path / "out.txt").read_text(errors="replace")
    assert partial["complete"] is False
    assert {c["key"]["step"] for c in partial["checks"] if c["kind"] == "fault-catalogue"} == {
        "misrouted", "l2-load-failure"}, text
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, text
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["complete"] is False and "SIGTERM" in report["interrupted"]
    cells = {c["key"]["step"]: c for c in report["checks"] if c["kind"] == "fault-catalogue"}
    assert {k: c["status"] for k, c in cells.items()} == {"misrouted": "pass",
                                                          "l2-load-failure": "info"}, text
    assert cells["misrouted"]["detail"]["detections"]["audit"] == "caught"
    assert ("CATALOGUE stub (test double): interrupted after 2 of 9 classes (not run: "
            "key-collision, lost-write, bit-flip, bit-flip-unread, state-unrestored, "
            "state-foreign, delayed-producer); of those, 1 of 1 fault classes seen as "
            "expected") in text, text
    assert "not run; --sharedkv-fault-catalogue" not in text
    assert [line for line in text.splitlines() if "| misrouted " in line], text


def test_a_class_the_topology_cannot_apply_is_a_usage_error(pytester: pytest.Pytester,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """Issue 52: l2-load-failure named on the shared topology stops the run before any test,
    naming the option; ``all`` there keeps the class as n/a."""
    monkeypatch.setenv(MEASURED_ENV, "2")
    result = pytester.runpytest(*BASE, "--sharedkv-fault-catalogue=misrouted,l2-load-failure")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --sharedkv-fault-catalogue: l2-load-failure needs the "
                                 "two-host topology's L2, and this run's topology shares one "
                                 "LMCache server: give --sharedkv-topology hosts*"])
    assert "collected" not in result.stdout.str()  # before any test


def test_a_catalogue_that_judged_no_class_is_void(pytester: pytest.Pytester,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 52: on the hosts topology the catalogue leaves l2-load-failure to the L2 fault
    cell; asked for it alone, it judged nothing: VOID, never PASS of "0 of 0"."""
    result, cells = _run(pytester, monkeypatch, 2, "--sharedkv-topology=hosts",
                         "--sharedkv-fault-catalogue=l2-load-failure")
    result.assert_outcomes(failed=1)
    assert {k: c["status"] for k, c in cells.items()} == {"l2-load-failure": "info",
                                                          "catalogue": "void"}
    result.stdout.fnmatch_lines([
        "*CATALOGUE stub (test double): VOID: none of the 1 fault classes asked for could be "
        "applied here, so the catalogue judged nothing (l2-load-failure: it needs the "
        "two-host topology's L2 and is injected there by the L2 fault cell*",
        "sharedkv: VOID *"])
    assert "0 of 0 fault classes" not in result.stdout.str()
