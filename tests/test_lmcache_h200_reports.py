"""The H200 runs on LMCache 0.5.6's compiled path (fixtures/lmcache/h200/, cuda_ops built
against the host's torch 2.11): the reports say what the closing notes quote, so a change to
the report format or a reader that misreads them fails here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "lmcache" / "h200"
STEPS = ("cold", "local", "cross", "receiver-local")


def report(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((H200 / name).read_text())
    return data


def exact(data: dict[str, Any], allocator: str) -> dict[str, tuple[int, int]]:
    return {c["key"]["step"]: (c["passed"], c["trials"]) for c in data["checks"]
            if c["tier"] == "service_regression" and c["key"].get("size") == "3k"
            and c["key"].get("allocator") == allocator and c["key"].get("step") in STEPS}


@pytest.mark.parametrize(("name", "allocators"), [
    ("service-0.5.6-compiled.json", ("lazy", "mixed")),
    ("service-0.5.6-compiled-lazy-repeat.json", ("lazy",)),
])
def test_compiled_path_is_exact_for_both_allocators(name: str,
                                                    allocators: tuple[str, ...]) -> None:
    data = report(name)
    assert "sharedkv: lmcache.cuda_ops loaded: LMCache copies run its compiled kernels" in (
        data["environment"]["header"])
    assert data["complete"] and data["summary"]["failed"] == 0
    for allocator in allocators:
        assert exact(data, allocator) == {step: (200, 200) for step in STEPS}


def test_the_audit_saw_only_the_gates_chunk() -> None:
    log = (H200 / "service-0.5.6-compiled.log").read_text()
    for allocator in ("lazy", "mixed"):
        assert (f"KV AUDIT {allocator}: 21246 chunk-group-layer digests compared" in log)
        assert (f"KV AUDIT {allocator} positive control: the gate's zeroed chunk 47 showed as "
                "a mismatch in 8 of 8 control requests") in log
    assert log.count("8 mismatching digests in 8 requests") == 2


def test_ordering_on_the_compiled_path() -> None:
    log = (H200 / "ordering-0.5.6-compiled.log").read_text()
    assert ("VERDICT lmcache-device-ops [under-test]: stream-ordered (60/60 delayed and 60/60"
            " undelayed checks held)") in log
    assert "VERDICT lmcache-fallback [under-test]: NOT stream-ordered" in log
