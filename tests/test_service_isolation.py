"""Tenant isolation reads as a security failure (issue 52): a cache hit across cache_salt
namespaces is a record of its own kind, ``isolation``, that the VERDICT line names first,
whatever the answers. A salt-blind pool is planted in the stub double (``StubFaults.
ignore_salt``: every namespace shares blocks, while the audit hook keys each chunk by its
request's own salt, as in a real engine) and judged on CPU through the service tier."""

from __future__ import annotations

import json

import pytest

from pytest_sharedkv.config.options import MEASURED_ENV
from pytest_sharedkv.stack.kv_audit import compare
from tests.launch_faults import LaunchFaults, Planted, StubFaults
from tests.test_service_gate_off import BASE  # the stub's 3k pass, its report in r.json


def test_a_salt_blind_pool_is_an_isolation_failure_named_first(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEASURED_ENV, "2")
    result = pytester.runpytest(
        *BASE, "-k", "identical or cache-salt or kv_audit",
        plugins=[Planted(LaunchFaults(stub=StubFaults(ignore_salt=True)))])
    report = json.loads((pytester.path / "r.json").read_text())
    isolation = {f"{c['key']['size']} {c['key']['step']}": c["status"]
                 for c in report["checks"] if c["kind"] == "isolation"}
    # the identical stage's cold request on A hit what the pass stored under other salts;
    # both cache_salt protocol checks hit across namespaces
    assert isolation.get("protocol cache-salt-separates-namespaces") == "fail", isolation
    assert isolation.get("protocol cache-salt-separates-namespaces-across-replicas") == "fail"
    assert isolation.get("audit salt isolation") == "fail"  # B's loads under a foreign salt
    assert any(k.startswith("3k identical") and v == "fail" for k, v in isolation.items()), \
        isolation
    assert not [c for c in report["checks"] if c["kind"] in ("leak", "protocol")
                and c["status"] == "fail"]
    result.stdout.fnmatch_lines(["*VERDICT stub (test double): ISOLATION FAILED: KV served "
                                 "across cache_salt namespaces in * record(s) (*): one "
                                 "tenant's cache answered another's, a security failure "
                                 "whatever the answers; first: *"])


def _store(key: str) -> dict[str, object]:
    return {"kind": "store", "role": "A", "request": "r1", "key": key, "group": 0,
            "layer": "l0", "chunk": 0, "digest": "d-" + key}


def _load(key: str, request: str) -> dict[str, object]:
    return {"kind": "load", "role": "B", "request": request, "key": key, "group": 0,
            "layer": "l0", "chunk": 0, "digest": "d-" + key}


def test_an_audited_load_of_a_chunk_its_salt_never_stored_is_an_isolation_failure() -> None:
    """A load keyed under a salt no replica stored (the key hashes the salt and tokens) is
    KV served across namespaces, not a load "not judged"."""
    registered = [{"kind": "registered", "role": r} for r in ("A", "B")]
    clean = compare([*registered, _store("k-salt1"), _load("k-salt1", "r1")])
    assert clean.foreign == {} and clean.isolation() is None
    leaked = compare([*registered, _store("k-salt1"), _load("k-salt1", "r1"),
                      _load("k-salt2", "r2")])
    assert leaked.foreign == {"r2": 1}
    assert leaked.isolation() == (
        "isolation: B loaded 1 chunk(s) that no replica ever stored under the request's "
        "cache_salt, in 1 request(s) (r2): the pool served KV across cache_salt namespaces")
    assert "isolation: B loaded 1 chunk(s)" in leaked.summary("x")
