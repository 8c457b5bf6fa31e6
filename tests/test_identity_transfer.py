"""The identity tier on the real LMCache server with LMCache's own client (CPU): the salt,
chunk-size and restart pairs through one fs L2 pass clean, the drivers' salt-blind fault
(every call without its salt, LMCache #4825's class) is an isolation failure, the release
pair skips naming the option without a second release, and the committed CPU run of
0.5.6 and 0.5.7rc2 through one L2 says each direction's verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_sharedkv.identity.judge import judge
from pytest_sharedkv.identity.table import Dimension
from pytest_sharedkv.identity.transfer_cells import sides
from pytest_sharedkv.report.records import Kind, Status

pytest.importorskip("lmcache")
ROOT = Path(__file__).resolve().parents[1]
SUITE = str(ROOT / "suites" / "test_identity.py")
RELEASE_RUN = ROOT / "docs" / "runs" / "identity-release-cpu.json"


def test_the_real_server_pairs_pass_and_the_release_pair_names_its_option(
        pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess(SUITE, "-p", "no:cacheprovider", "-k", "transfer",
                                          "-rs", "--sharedkv-json=r.json")
    result.assert_outcomes(passed=3, skipped=6)
    result.stdout.fnmatch_lines(["*lmcache-release on transfer: *give "
                                 "--sharedkv-identity-release-site DIR*",
                                 "*VERDICT identity: 3 pair(s) proven*"])
    report = json.loads((pytester.path / "r.json").read_text())
    found = {(c["key"]["dimension"], c["key"]["side"]): c for c in report["checks"]}
    assert {d for d, _ in found} == {"salt", "chunk-size", "restart-server"}
    assert all(c["status"] == "pass" for c in found.values())
    assert found[("salt", "same")]["detail"]["hit_tokens"] == 2048  # every token, exact
    assert found[("salt", "other")]["detail"]["hit_tokens"] == 0
    assert found[("restart-server", "same")]["detail"]["exact"] is True  # through the L2
    assert found[("chunk-size", "other")]["detail"]["hit_tokens"] == 0  # chunk 512: refused


def test_the_drivers_salt_blind_fault_is_an_isolation_failure(tmp_path: Path) -> None:
    from pytest_sharedkv.stack.checks.identity_transfer import run_identity

    observed = run_identity(tmp_path, "tenant-1", "tenant-2", salt_blind=True, restart=False)
    same, other = judge(Dimension.SALT, *sides(observed, Dimension.SALT))
    assert same.status is Status.PASS
    assert (other.kind, other.status) == (Kind.ISOLATION, Status.FAIL), other.message
    assert "2048 tokens" in other.message


def test_the_committed_two_release_run_says_each_direction() -> None:
    """docs/runs/identity-release-cpu.json: LMCache 0.5.6 and 0.5.7rc2 (a --target site)
    through one fs L2 on CPU; each direction found the keys and served exact bytes."""
    report = json.loads(RELEASE_RUN.read_text())
    others = {c["key"]["direction"]: c for c in report["checks"]
              if c["tier"] == "identity" and c["key"]["side"] == "other"}
    assert set(others) == {"old writes, new reads", "new writes, old reads"}
    for check in others.values():
        assert check["status"] == "pass"
        assert check["detail"]["direction_verdict"] == "keys found, bytes exact"
        assert check["detail"]["hit_tokens"] == 2048
        releases = set(check["detail"]["servers"].values())
        assert {"LMCache 0.5.6, chunk 256", "LMCache 0.5.7rc2, chunk 256"} == releases
