"""``compare`` judges records by their kind and status, never by their message: rewording
every message leaves its verdict (exit status and each finding's kind and subject) the
same, and a record whose message merely sounds bad ("leak", "VOID:", "divergence") while
its status says pass is no finding. Records without a kind (reports written before they
had one) are read by the old text rule, in the legacy reader only."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.cli.compare.main import main

ROOT = Path(__file__).resolve().parents[1]
SCREENING = ROOT / "fixtures" / "perf" / "screening.json"
NODE = "suites/test_service_regression.py::test_request_chain[mixed-8k-0]"
TIER = "service_regression"
PAIR = {"provider": "vllm", "allocator": "mixed", "delay": "0"}


def _check(size: str, step: str, kind: str, status: str, message: str,
           tier: str = TIER) -> dict[str, Any]:
    return {"tier": tier, "key": {**PAIR, "size": size, "step": step}, "passed": 0,
            "trials": 1, "role": "check", "message": message, "detail": {}, "nodeid": NODE,
            "kind": kind, "status": status}


ISOLATION = "ISOLATION (KV served across cache_salt namespaces)"
# (record, the finding it makes or None)
RECORDS = [
    (_check("gate", "zeroed chunk", "gate", "void", "VOID: the hook never ran"), "VOID"),
    (_check("gate", "confounded", "gate", "confounded", "CONFOUNDED: intact chunks changed"),
     "CONFOUNDED"),
    (_check("8k", "cold", "leak", "fail", "8k cold on A: 3 local hit tokens (a namespace leak)"),
     ISOLATION),  # an older report's word for it
    (_check("3k", "cold", "isolation", "fail", "3k cold on A: 3 local hit tokens (isolation)"),
     ISOLATION),
    (_check("8k", "chain", "divergence", "fail", "request 8k-0: first divergent token 3"),
     "divergence"),
    (_check("8k", "local", "hits", "fail", "12 tokens came from the pool"), "hit accounting"),
    (_check("8k", "cross", "hits-unknown", "fail", "the engine exposes no pool hit counter"),
     "hit accounting"),
    (_check("audit", "kv digests", "audit-mismatch", "fail", "chunk 3: B loaded other bytes"),
     "KV audit mismatch"),
    (_check("round", "-", "divergence", "fail", "B answered 'x', A answered 'y'",
            tier="replica_pair"), "divergence"),
    (_check("4KiB", "D2H", "ordering", "void", "the negative control passed 3/3 delayed",
            tier="ordering"), "VOID"),
    # what these say sounds bad; their status says otherwise
    (_check("8k", "receiver-local", "hits", "pass", "no leak, no divergence, nothing VOID:"),
     None),
    (_check("warm-up", "cold", "leak", "info", "warm-up: 9 hit tokens (a namespace leak)"),
     None),
    (_check("gate", "unproven", "gate", "unproven", "VOID: sensitivity unproven"), None),
    (_check("protocol", "stream", "protocol", "fail", "the stream ended early"), None),
    # a tier's own word in the detail is evidence; only the record's status is read
    ({**_check("4KiB", "H2D", "ordering", "pass", "", tier="ordering"),
      "detail": {"status": "VOID"}}, None),
]
NOTES = [
    ({"tier": TIER, "text": "KV AUDIT mixed: VOID: the hook never saw replica B",
      "level": "info", "nodeid": NODE, "kind": "audit-mismatch", "status": "void"}, "VOID"),
    ({"tier": "perf", "text": "a VOID-looking line that judges nothing", "level": "info",
      "nodeid": NODE, "kind": "note", "status": "info"}, None),
]


def _findings(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, list[tuple[str,
                                                                                        str]]]:
    """(exit status, (kind, test or record) of each correctness row)."""
    status = main([str(SCREENING), str(path)])
    out = capsys.readouterr().out
    rows = [[cell.strip() for cell in line.strip("|").split("|")]
            for line in out.split("## Correctness (AFTER)")[1].split("## Performance")[0]
            .splitlines() if line.startswith("| NEW") or line.startswith("| also")]
    return status, [(row[1], row[2]) for row in rows]


def _after(tmp_path: Path, name: str, reword: bool) -> Path:
    data: dict[str, Any] = json.loads(SCREENING.read_text())
    data["checks"] += copy.deepcopy([r for r, _ in RECORDS])
    data["notes"] += copy.deepcopy([n for n, _ in NOTES])
    if reword:
        for i, check in enumerate(data["checks"]):
            check["message"] = f"reworded {i}" if i % 2 else ""
        for i, note in enumerate(data["notes"]):
            note["text"] = f"reworded note {i}"
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_rewording_every_message_leaves_the_verdict_the_same(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, found = _findings(capsys, _after(tmp_path, "after.json", reword=False))
    expected = [kind for _, kind in RECORDS + NOTES if kind is not None]
    assert status == 1
    # isolation (KV across cache_salt namespaces) is named first, whatever else is wrong
    assert [kind for kind, _ in found] == sorted(expected, key=lambda k: k != ISOLATION)
    assert found[0][0] == ISOLATION
    assert _findings(capsys, _after(tmp_path, "reworded.json", reword=True)) == (status, found)


def test_a_record_that_passed_is_no_finding_whatever_it_says(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    data: dict[str, Any] = json.loads(SCREENING.read_text())
    data["checks"] += [r for r, kind in RECORDS if kind is None]
    data["notes"] += [n for n, kind in NOTES if kind is None]
    path = tmp_path / "after.json"
    path.write_text(json.dumps(data))
    assert _findings(capsys, path) == (0, [])


@pytest.mark.parametrize(("record", "kind"), [
    ({"key": {"size": "gate", "step": "zeroed chunk"}, "message": "VOID: the hook never ran",
      "detail": {"status": "VOID"}}, "VOID"),
    ({"key": {"size": "8k", "step": "cold"},
      "message": "8k cold on A: 3 local and 0 pool hit tokens in cold requests (a namespace "
                 "leak)"}, ISOLATION),
    ({"key": {"size": "8k", "step": "chain"}, "passed": 0,
      "message": "request 8k-0, step cross on replica B: first divergent token 3"},
     "divergence"),
    ({"key": {"size": "8k", "step": "local"},
      "message": "8k local on A: 12 tokens came from the pool where the engine's own prefix "
                 "cache should have served"}, "hit accounting"),
])
def test_a_record_without_a_kind_is_read_by_the_legacy_rule(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, record: dict[str, Any],
        kind: str) -> None:
    """A report written before records had a kind: the old rule, warm-ups judging
    nothing."""
    after: dict[str, Any] = json.loads(SCREENING.read_text())
    check = {"tier": TIER, "passed": 1, "trials": 1, "role": "check", "detail": {},
             "nodeid": NODE, **record}
    check["key"] = {**PAIR, **record["key"]}
    after["checks"].append(check)
    path = tmp_path / "after.json"
    path.write_text(json.dumps(after))
    status, found = _findings(capsys, path)
    assert status == 1 and [k for k, _ in found] == [kind]
    assert found[0][1].startswith("service_regression [provider=vllm")
    check["key"]["size"] = "warm-up"
    path.write_text(json.dumps(after))
    assert _findings(capsys, path) == (0, [])


@pytest.mark.parametrize(("where", "record"), [
    ("checks[5].status: expected a string, found list", {"kind": "leak", "status": ["fail"]}),
    ("checks[5].kind: expected a string, found dict", {"kind": {"a": 1}, "status": "fail"}),
])
def test_a_kind_or_status_that_is_not_text_is_named(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, where: str,
        record: dict[str, Any]) -> None:
    data: dict[str, Any] = json.loads(SCREENING.read_text())
    data["checks"].append(record)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    assert main([str(SCREENING), str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"python -m pytest_sharedkv compare: {path}: {where}\n"


@pytest.mark.parametrize(("kinds", "lost"), [(["triage"], False), (["triage", "divergence"], True),
                                             ([], True)])
def test_a_diagnostic_that_does_not_run_again_is_not_lost(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, kinds: list[str],
        lost: bool) -> None:
    """The triage's pass says a diagnosis ran (something diverged): when AFTER has nothing to
    triage it skips, and that is no lost test; a test with any other record, or none, is."""
    node = "suites/test_service_regression.py::test_triage[lazy]"
    before: dict[str, Any] = json.loads(SCREENING.read_text())
    before["tests"].append({"nodeid": node, "tier": TIER, "outcome": "passed", "message": ""})
    before["checks"] += [{**_check("triage", f"cell-{i}", kind, "pass", ""), "nodeid": node}
                         for i, kind in enumerate(kinds)]
    after: dict[str, Any] = json.loads(SCREENING.read_text())
    after["tests"].append({"nodeid": node, "tier": TIER, "outcome": "skipped",
                           "message": "nothing to triage"})
    paths = tmp_path / "before.json", tmp_path / "after.json"
    for path, data in zip(paths, (before, after), strict=True):
        path.write_text(json.dumps(data))
    status = main([str(p) for p in paths])
    out = capsys.readouterr().out
    assert (status, f"| NEW | lost | {node}" in " ".join(out.split())) == (int(lost), lost)
