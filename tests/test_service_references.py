"""Stored references (syrupy) on the stub provider: --snapshot-update writes one file per
request under model/engine, a later run compares against them (also under -n 2), a changed
reference fails, and references recorded with another engine report ENGINE DRIFT."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.config.options import MEASURED_ENV

BASE = ["--pyargs", "pytest_sharedkv.suites", "-m", "service_regression",
        "-p", "no:cacheprovider", "--sharedkv-provider=stub", "--sharedkv-settle-s=0.05",
        "--sharedkv-service-sizes=3k", "--sharedkv-snapshot-dir=refs", "-k",
        "reference and 3k-00"]


# The first 3 measured requests (the ones -k selects) instead of all 200: enough for one
# reference that changes while the others still match.
REQUESTS = 3


def _tests(pytester: pytest.Pytester) -> list[dict[str, Any]]:
    """The inner run's tests[] from its JSON report (their outcome and message)."""
    tests: list[dict[str, Any]] = json.loads((pytester.path / "r.json").read_text())["tests"]
    return tests


@pytest.fixture(autouse=True)
def _small_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEASURED_ENV, str(REQUESTS))


def test_write_then_compare_then_drift(pytester: pytest.Pytester) -> None:
    written = pytester.runpytest_subprocess(*BASE, "--snapshot-update", "-n", "2",
                                            "--dist", "loadgroup")
    written.assert_outcomes(passed=REQUESTS)
    assert "Can not relate" not in written.stdout.str()  # syrupy location warnings
    stored = pytester.path / "refs" / "copy-rule" / "stub"
    files = sorted(p.name for p in stored.glob("*.json"))
    assert files == [f"3k-00{i}.json" for i in range(REQUESTS)]
    data = json.loads((stored / "3k-000.json").read_text())
    assert data["cached_tokens"] == {"cold": 0, "local": 3008, "cross": 3008,
                                     "receiver-local": 3008}
    assert len(data["answer"]["ids"]) == 16 and data["prompt_tokens"] == 3009

    pytester.runpytest_subprocess(*BASE, "-n", "2", "--dist", "loadgroup").assert_outcomes(
        passed=REQUESTS)

    data["answer"]["text"] = " w00 w00"
    (stored / "3k-001.json").write_text(json.dumps(data))
    changed = pytester.runpytest_subprocess(*BASE)
    changed.assert_outcomes(passed=REQUESTS - 1, failed=1)

    stored.rename(stored.parent / "vllm-0.25.0+lmcache-0.5.5")
    drift = pytester.runpytest_subprocess(*BASE, "--sharedkv-json=r.json")
    drift.assert_outcomes(passed=REQUESTS - 1, failed=1)
    [failed] = [t for t in _tests(pytester) if t["outcome"] == "failed"]
    assert failed["nodeid"].endswith("[3k-001-stub]")
    assert failed["message"].startswith(
        "Failed: ENGINE DRIFT (not cache-induced): replica A's cold answer to 3k-001 with stub "
        "differs from the reference recorded with vllm-0.25.0+lmcache-0.5.5"), failed


def test_no_reference_is_a_skip_that_says_how_to_record(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(*BASE, "--sharedkv-json=r.json")
    result.assert_outcomes(skipped=REQUESTS)
    assert {t["message"] for t in _tests(pytester)} == {
        f"no stored reference for copy-rule/stub under {pytester.path}/refs: record them with "
        "--snapshot-update"}
    assert not Path(pytester.path / "refs").exists()


def test_the_baseline_is_chosen_by_the_recorded_key_not_by_file_times(tmp_path: Path) -> None:
    """Another engine's references: the newest engine by its key (vLLM's version, then
    LMCache's), whatever order a checkout gave the directories' times."""
    import os

    from pytest_sharedkv.service.references import baseline, engine_order

    keys = ["vllm-0.26.0+lmcache-0.5.6-torch-fallback", "vllm-0.9.2+lmcache-0.6.0-compiled",
            "vllm-0.26.0+lmcache-0.5.10-compiled-cuda_ops", "stub", "vllm-unknown+lmcache-x"]
    for age, key in enumerate(keys):  # the oldest key the newest directory, and so on
        (tmp_path / "m" / key).mkdir(parents=True)
        os.utime(tmp_path / "m" / key, (1_000_000 + 10 * age, 1_000_000 + 10 * age))
    assert sorted(keys, key=engine_order) == [
        "stub", "vllm-unknown+lmcache-x", "vllm-0.9.2+lmcache-0.6.0-compiled",
        "vllm-0.26.0+lmcache-0.5.6-torch-fallback", "vllm-0.26.0+lmcache-0.5.10-compiled-cuda_ops"]
    found = baseline(tmp_path, "m", "vllm-0.27.0+lmcache-0.6.1-compiled-cuda_ops")
    assert found is not None and found.name == "vllm-0.26.0+lmcache-0.5.10-compiled-cuda_ops"
    found = baseline(tmp_path, "m", found.name)  # a run of that key: the next newest
    assert found is not None and found.name == "vllm-0.26.0+lmcache-0.5.6-torch-fallback"
    assert baseline(tmp_path, "other-model", "stub") is None
