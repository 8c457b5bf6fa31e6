"""The triage's code-remedy cells (``current-stream``, ``wait-producer``): each relaunches the
pair with ``stream_remedy_hook`` armed in the LMCache server, says whether the fault was
removed or persists with counts, is VOID where the remedy changed no copy, and its remedy
is said as proven only where its cell removed the fault. On CPU the stub stands in for the
server's hook (the same log lines) and plants a race that only one remedy lifts; a fake
server's log stands in for one whose remedy changed no copy."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_sharedkv.config.options import MEASURED_ENV
from pytest_sharedkv.engine_hooks import stream_remedy_hook
from pytest_sharedkv.report.records import Check
from pytest_sharedkv.service import summary
from pytest_sharedkv.service.triage import Base, Cell, classify, controls_for
from tests.launch_faults import LaunchFaults, Planted, StubFaults

BASE = ["--pyargs", "pytest_sharedkv.suites", "-m", "service_regression",
        "-p", "no:cacheprovider", "--sharedkv-provider=stub", "--sharedkv-settle-s=0.01",
        "--sharedkv-service-sizes=3k", "--sharedkv-triage", "-k", "triage",
        "--sharedkv-json=r.json"]
CONTROLS = {c.name: c for c in controls_for("lazy")}
REMEDIES = (CONTROLS["current-stream"], CONTROLS["wait-producer"])


@pytest.mark.parametrize(("has_server", "allocator", "path", "stub", "why"), [
    (True, "lazy", "torch-fallback", False, None),
    (False, "n/a", None, True, None),  # the stub stands in for the server's hook
    (True, "lazy", "compiled", False, "this pair runs the lazy allocator on LMCache's "
     "compiled kernel path"),
    (True, "mixed", "torch-fallback", False, "this pair runs the mixed allocator"),
    (True, "lazy", None, False, "on LMCache's unprobed kernel path"),
    (False, "lazy", "torch-fallback", False, "this pair has no LMCache server"),
])
def test_a_code_remedy_applies_to_the_lazy_allocator_on_the_torch_fallback(
        has_server: bool, allocator: str, path: str | None, stub: bool, why: str | None
        ) -> None:
    for control in REMEDIES:
        found = control.not_applicable(True, has_server, allocator, path, stub)
        assert (found is None) if why is None else (found is not None and why in found)
        assert control.not_applicable(False, has_server, allocator, path, stub) is not None


def test_a_remedy_cell_arms_the_hook_in_the_server_with_a_log_of_its_own(
        tmp_path: Path) -> None:
    for control in REMEDIES:
        changes = control.relaunch(tmp_path / control.name)
        assert dict(changes.server_env) == {
            stream_remedy_hook.REMEDY_ENV: control.name,
            stream_remedy_hook.LOG_ENV: str(tmp_path / control.name / "stream-remedy.jsonl")}
        assert changes.replica_env == () and changes.kv_audit is True


def _cells(removed: dict[str, bool | None]) -> list[Cell]:
    """Every control persisting (4 of 4 wrong), but REMOVED's: True removed, None VOID."""
    cells = []
    for control in controls_for("lazy"):
        outcome = removed.get(control.name, False)
        cells.append(Cell(control, requests=4, exact=4 if outcome else 0,
                          mismatches=0 if outcome else 12, compared=100,
                          why_unknown="VOID: never loaded" if outcome is None else None))
    return cells


LAZY = Base("lazy", "3k", 200, 24, 10_889)


def test_a_code_remedy_is_proven_only_where_its_cell_removed_the_fault() -> None:
    verdict = classify(LAZY, _cells({"launch-blocking-all": True, "wait-producer": True}))
    assert verdict.klass == "ordering"
    assert verdict.text.endswith(
        "; code remedies: current-stream left it (4 of 4 wrong, 12 mismatching digests of "
        "100); wait-producer removed it (0 of 4 wrong, 0 mismatching digests of 100)")
    [proven] = verdict.proven
    assert proven == (f"{CONTROLS['wait-producer'].remedy} (proven by the triage cell "
                      "wait-producer: 4/4 exact, 0 mismatching digests)")
    both = classify(LAZY, _cells({"current-stream": True, "wait-producer": True}))
    assert len(both.proven) == 2
    void = classify(LAZY, _cells({"launch-blocking-all": True, "current-stream": None}))
    assert "current-stream decided nothing (VOID: never loaded)" in void.text
    assert not void.proven


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, faults: StubFaults
         ) -> tuple[pytest.RunResult, dict[str, dict[str, Any]], str]:
    """The inner run, its triage cells, and the remedy line its records give the pair."""
    monkeypatch.setenv(MEASURED_ENV, "3")
    result = pytester.runpytest(*BASE, plugins=[Planted(LaunchFaults(stub=faults))])
    report = json.loads((pytester.path / "r.json").read_text())
    cells = {c["key"]["step"]: c for c in report["checks"] if c["kind"] == "triage"}
    checks = [Check(**c) for c in report["checks"]]
    return result, cells, summary.remedy_line(checks, "n/a")


def test_the_remedy_that_lifts_a_race_is_proven_and_the_other_persists(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result, cells, remedy = _run(pytester, monkeypatch,
                                 StubFaults(race_unless_remedy="wait-producer"))
    result.assert_outcomes(passed=1)
    assert {k: cells[k]["status"] for k in ("launch-blocking-all", "current-stream",
                                            "wait-producer")} == {
        "launch-blocking-all": "pass", "current-stream": "fail", "wait-producer": "pass"}
    assert cells["current-stream"]["detail"]["mismatches"] > 0
    result.stdout.fnmatch_lines([
        "*TRIAGE n/a: stream-ordering race (removed by CUDA_LAUNCH_BLOCKING=1 in the LMCache "
        "server and both replicas, the fallback's copy waiting for the producing stream); "
        "code remedies: current-stream left it (3 of 3 wrong, * mismatching digests of *); "
        "wait-producer removed it (0 of 3 wrong, 0 mismatching digests of *)*"])
    assert remedy == (f"remedy: {CONTROLS['wait-producer'].remedy} (proven by the triage cell "
                      "wait-producer: 3/3 exact, 0 mismatching digests)")


@pytest.mark.parametrize(("lines", "why"), [
    ([], "VOID: the current-stream remedy never loaded in the LMCache server"),
    ([{"kind": "armed", "remedy": "current-stream"},
      {"kind": "wrapped", "target": "mem_kernels:lmcache_memcpy_async"}],
     "VOID: the current-stream remedy wrapped mem_kernels:lmcache_memcpy_async but no "
     "pointer copy ran through it"),
    ([{"kind": "armed", "remedy": "current-stream"},
      {"kind": "applied", "remedy": "current-stream", "direction": "H2D"}], None),
])
def test_a_remedy_cell_that_changed_no_copy_is_void_and_decides_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines: list[dict[str, str]],
        why: str | None) -> None:
    """run_cell reads the log the relaunched server's hook wrote (here a fake server writes
    LINES where the cell's environment says): no applied copy, whatever the answers, is
    VOID and decides nothing."""
    from pytest_sharedkv.service import triage

    monkeypatch.setattr(triage, "right_answer", lambda *a: True)
    target = SimpleNamespace(launches=[], kv_audit_dir=None, sync_log=None,
                             close=lambda: [])

    def relaunch(changes: Any) -> Any:
        env = dict(changes.server_env)
        assert env[stream_remedy_hook.REMEDY_ENV] == "current-stream"
        Path(env[stream_remedy_hook.LOG_ENV]).write_text(
            "".join(json.dumps(line) + "\n" for line in lines))
        return target

    pair: Any = SimpleNamespace(labels={"provider": "vllm", "allocator": "lazy"})
    runner: Any = SimpleNamespace(chain=lambda *a: None, run=SimpleNamespace())
    cases: Any = [SimpleNamespace(id="3k-000")]
    cell = triage.run_cell(CONTROLS["current-stream"], pair, cases, [], lambda *a: runner,
                           lambda key: key, 4, tmp_path, lambda line: None, relaunch, True,
                           "torch-fallback")
    assert (cell.requests, cell.exact) == (1, 1)
    assert cell.removed is (None if why else True)
    assert (cell.why_unknown or "").startswith(why or "")
    assert cell.status == ("unknown" if why else "pass")
