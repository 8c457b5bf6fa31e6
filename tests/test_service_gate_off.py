"""--no-sharedkv-gate: no gate hook is launched (the stub's B gets no corrupt control, a
launched server or replica no hook variables), the gate test skips naming the option, its
record is unproven, and the VERDICT says the exact answers prove nothing; the rest of the
pass runs as with the gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_sharedkv.config.options import MEASURED_ENV
from pytest_sharedkv.report.records import Bundle
from pytest_sharedkv.service import summary

BASE = ["--pyargs", "pytest_sharedkv.suites", "-m", "service_regression",
        "-p", "no:cacheprovider", "--sharedkv-provider=stub", "--sharedkv-settle-s=0.05",
        "--sharedkv-service-sizes=3k", "--sharedkv-json=r.json"]


def test_a_run_without_the_gate_says_its_answers_are_unproven(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEASURED_ENV, "2")
    result = pytester.runpytest_subprocess(*BASE, "--no-sharedkv-gate", "-k",
                                           "gate or chain or audit")
    result.assert_outcomes(passed=3, skipped=1)  # 2 chains and the audit; the gate
    report = json.loads((pytester.path / "r.json").read_text())
    [gate] = [t for t in report["tests"] if "test_sensitivity_gate" in t["nodeid"]]
    assert gate["outcome"] == "skipped"
    assert gate["message"].startswith("sensitivity unproven: the gate was not run "
                                      "(--no-sharedkv-gate)"), gate["message"]
    [check] = [c for c in report["checks"] if c["kind"] == "gate"]
    assert (check["status"], check["detail"]["zeroed_chunks_logged"]) == ("unproven", 0)
    lines = summary.verdicts(Bundle.from_data(report).checks)
    assert any("sensitivity unproven: the gate was not run (--no-sharedkv-gate)" in line
               for line in lines), lines
    assert not any(line.startswith("GATE") and "proven:" in line for line in lines), lines
    launches = {launch["name"]: launch["argv"] for launch in
                (json.loads(f["value"]) for f in report["facts"] if f["name"] == "launch")}
    assert "--corrupt-control" not in launches["stub replica B"]  # no hook in the stub's B
    audit = next(c for c in report["checks"] if c["key"].get("size") == "audit")
    assert audit["status"] == "pass"  # the audit runs; it has no positive control here
    assert not any("positive control" in n["text"] for n in report["notes"])


def test_no_hook_reaches_a_launched_server_or_replica(tmp_path: Path) -> None:
    """The launched MP stack's server gets no corrupt hook variables (the environment the
    suite builds for it); the native stack's model on the stub records its gate off."""
    from pytest_sharedkv.engine_hooks import corrupt_hook, native_gate_hook
    from pytest_sharedkv.engine_hooks.delay_hook import SERVER_ROLE
    from pytest_sharedkv.stack.launch.providers import process_env
    from pytest_sharedkv.stack.launch.spec import LaunchSpec

    on, off = LaunchSpec(log_dir=tmp_path), LaunchSpec(log_dir=tmp_path, gate=False)
    assert corrupt_hook.CONTROL_ENV in process_env(on, base={}, role=SERVER_ROLE)
    assert corrupt_hook.CONTROL_ENV not in process_env(off, base={}, role=SERVER_ROLE)
    from pytest_sharedkv.stack.launch import stacks as stack_launch

    native = stack_launch.stub_spec(off, "native")
    assert native.stack is not None
    assert native_gate_hook.CONTROL_ENV not in native.stack.replica_env("B")
    assert (native.stack.gate, native.stack.record.get("gate")) == (None, "off")
    armed = stack_launch.stub_spec(on, "native").stack
    assert armed is not None and str(armed.record.get("gate")).startswith("the stub's own")
