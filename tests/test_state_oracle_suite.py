"""The state oracle in the suite's KV audit test, end to end on the stub provider
(issue 48): replica B reports a recurrent-state load for the last chunk of every pool hit
(``StubFaults.state_loads``), with the state it resumed from; the oracle judges each
against the stub's own state function of the tokens. The exact state passes and is said
with its positive control; a zeroed one fails, named by request and chunk;
``--sharedkv-state-oracle off`` does not excuse a wrong state; a bad value is a usage
error before any test."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_sharedkv.config.options import MEASURED_ENV
from tests.launch_faults import StubFaults, plant
from tests.test_service_suite import BASE, CHAINS, _stubs_left

AUDIT = [*BASE, "-k", "kv_audit", "--sharedkv-json=r.json"]


@pytest.fixture(autouse=True)
def _small_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEASURED_ENV, str(CHAINS))


def _oracle(pytester: pytest.Pytester) -> dict[str, Any]:
    report = json.loads((pytester.path / "r.json").read_text())
    return next(c for c in report["checks"] if c["key"].get("step") == "recurrent state")


def test_exact_states_pass_and_a_zeroed_one_fails(pytester: pytest.Pytester,
                                                  process_tag: str) -> None:
    plant(pytester, StubFaults(state_loads="exact"))
    pytester.runpytest_subprocess(*AUDIT).assert_outcomes(passed=1)
    oracle = _oracle(pytester)
    assert oracle["status"] == "pass" and oracle["kind"] == "audit-mismatch"
    assert oracle["detail"]["judged"] == oracle["passed"] == oracle["trials"] > 0
    assert oracle["detail"]["control_distance"] >= 0.99  # a zeroed state, relative
    assert not _stubs_left(process_tag)

    # a zeroed state (the stale and foreign ones: tests/test_state_oracle.py, on the model)
    plant(pytester, StubFaults(state_loads="zeroed"))
    result = pytester.runpytest_subprocess(*AUDIT)
    result.assert_outcomes(failed=1)
    oracle = _oracle(pytester)
    assert oracle["status"] == "fail" and oracle["passed"] == 0 < oracle["trials"]
    assert oracle["detail"]["wrong"][0].startswith("request ")
    assert "B resumed from a recurrent state" in oracle["detail"]["wrong"][0]
    result = pytester.runpytest_subprocess(*AUDIT, "--sharedkv-state-oracle", "off")
    result.assert_outcomes(failed=1)  # off counts unjudged loads; a wrong one still fails
    assert not _stubs_left(process_tag)


def test_a_bad_value_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(*AUDIT, "--sharedkv-state-oracle", "maybe")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--sharedkv-state-oracle*maybe*"])
