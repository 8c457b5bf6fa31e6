"""Every tier's correctness differences: failed, unfinished and lost tests, and the
records whose kind and status say a result is wrong or proves nothing, and the perf
screening's refused pairings, results below the floor and partial pool hits."""

from __future__ import annotations

from typing import Any

from pytest_sharedkv.cli.compare.finding import Finding, Found
from pytest_sharedkv.cli.compare.legacy import legacy_check_kind, legacy_note_kind
from pytest_sharedkv.cli.compare.reading import Report
from pytest_sharedkv.perf.floor import invalid
from pytest_sharedkv.perf.hits import full_hit_tokens, partial_hits
from pytest_sharedkv.perf.tables import seconds
from pytest_sharedkv.report.records import Kind, Status

FAILED = {"failed": Found.FAILED, "error": Found.ERROR}  # a test's outcome that fails it


def _short(text: object, limit: int = 240) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


# What a failed record of each kind is called in the compare (the other kinds' failures,
# protocol, bytes, ordering ..., fail their test, which the compare lists by test id).
FAILED_KINDS = {Kind.ISOLATION: Found.ISOLATION, Kind.LEAK: Found.ISOLATION,
                Kind.DIVERGENCE: Found.DIVERGENCE,
                Kind.HITS: Found.HITS, Kind.HITS_UNKNOWN: Found.HITS,
                Kind.AUDIT_MISMATCH: Found.AUDIT_MISMATCH}
STATUS_FINDINGS = {Status.VOID: Found.VOID, Status.CONFOUNDED: Found.CONFOUNDED}


def _check_kind(check: dict[str, Any]) -> Found | None:
    """The finding a check record makes, from its kind and status only (schema.validate
    made sure a record with a kind has a status, both words this plugin knows)."""
    if "kind" not in check:
        return legacy_check_kind(check)
    status = Status(check["status"])
    if status in STATUS_FINDINGS:
        return STATUS_FINDINGS[status]
    if status is Status.FAIL:
        return FAILED_KINDS.get(Kind(check["kind"]))
    return None


def _note_kind(note: dict[str, Any]) -> Found | None:
    if "status" not in note:
        return legacy_note_kind(note)
    return STATUS_FINDINGS.get(Status(note["status"]))


def _record(check: dict[str, Any]) -> str:
    key = check.get("key") or {}
    if isinstance(key, dict):  # a request's own record names its case (in its detail)
        detail = check.get("detail")
        case = detail.get("case") if isinstance(detail, dict) else None
        key = {**key, "case": case} if case is not None and "case" not in key else key
    where = ", ".join(f"{k}={v}" for k, v in key.items()) if isinstance(key, dict) else key
    return f"{check.get('tier', '?')} [{where}]"


def findings(report: Report) -> list[Finding]:
    """What in one report makes it fail a compare, in report order."""
    data = report.data
    found: list[Finding] = []
    if data.get("interrupted"):
        found.append(Finding(Found.INTERRUPTED, "the run", _short(data["interrupted"])))
    outcomes = {}
    for test in data.get("tests", []):
        if not isinstance(test, dict):
            continue
        nodeid, outcome = str(test.get("nodeid", "?")), test.get("outcome")
        outcomes[nodeid] = outcome
        if outcome in FAILED:
            found.append(Finding(FAILED[outcome], nodeid, _short(test.get("message", "")),
                                 str(test.get("tier"))))
        elif outcome is None:
            found.append(Finding(Found.UNFINISHED, nodeid, "the test never reported an outcome",
                                 str(test.get("tier"))))
    for entry in data.get("collection", []):
        if isinstance(entry, dict) and entry.get("outcome") in (*FAILED, "errors"):
            found.append(Finding(Found.COLLECTION_ERROR, str(entry.get("nodeid", "?")),
                                 _short(entry.get("message", ""))))
    for check in data.get("checks", []):
        if not isinstance(check, dict) or outcomes.get(str(check.get("nodeid"))) == "xfailed":
            continue
        kind = _check_kind(check)
        if kind:
            found.append(Finding(kind, _record(check), _short(check.get("message", "")),
                                 str(check.get("tier", "?"))))
    for note in data.get("notes", []):
        kind = _note_kind(note) if isinstance(note, dict) else None
        if isinstance(note, dict) and kind:
            found.append(Finding(kind, f"{note.get('tier', '?')} note",
                                 _short(note.get("text", ""))))
    if report.perf is not None:
        for refusal in report.perf.pairing.refusals:
            found.append(Finding(Found.PAIRING_REFUSED, f"request {refusal.request} block "
                                 f"{refusal.block} arm {refusal.arm}", refusal.reason))
        if report.perf.run.floor is not None:
            for o in invalid(report.perf.run.observations, report.perf.run.floor):
                found.append(Finding(
                    Found.BELOW_FLOOR, f"request {o.request} block {o.block} arm {o.arm}",
                    f"cross-replica TTFT {seconds(o.ttft_s)} s < floor "
                    f"{seconds(report.perf.run.floor.seconds(o.prompt_tokens))} s: the "
                    "receiver's own prefix cache answered"))
        run = report.perf.run
        for o in partial_hits(run.observations, run.chunk_tokens):
            chunk = run.chunk_tokens or 0
            found.append(Finding(
                Found.PARTIAL_HIT, f"request {o.request} block {o.block} arm {o.arm}",
                f"cross-replica request found {o.cached_tokens:,} of {o.prompt_tokens:,} "
                f"prompt tokens in a cache, a full hit is "
                f"{full_hit_tokens(o.prompt_tokens, chunk):,}: its TTFT includes a "
                "recompute (the pool evicted or B's lookup missed)"))
    return list({f.key: f for f in found}.values())


# records that explain a fault, not claim correctness
DIAGNOSTIC_KINDS: frozenset[Kind | None] = frozenset({Kind.TRIAGE})


def _diagnostic_tests(report: Report) -> set[str]:
    """Tests whose every record is a diagnostic (the triage of a diverging pair): their pass
    says a diagnosis ran, so one that does not run later (nothing diverged) is not lost. A
    record without a kind (an older report) is no diagnostic."""
    kinds: dict[str, set[Kind | None]] = {}
    for check in report.data.get("checks", []):
        if isinstance(check, dict) and check.get("nodeid"):
            kind = Kind(check["kind"]) if "kind" in check else None
            kinds.setdefault(str(check["nodeid"]), set()).add(kind)
    return {nodeid for nodeid, found in kinds.items() if found <= DIAGNOSTIC_KINDS}


def lost_tests(before: Report, after: Report) -> list[Finding]:
    """Tests that passed in BEFORE and did not pass (or did not run) in AFTER; a
    diagnostic's pass is not a correctness claim, so it cannot be lost."""
    now = {str(t.get("nodeid")): t for t in after.data.get("tests", []) if isinstance(t, dict)}
    diagnostic = _diagnostic_tests(before)
    lost = []
    for test in before.data.get("tests", []):
        if not isinstance(test, dict) or test.get("outcome") != "passed":
            continue
        nodeid = str(test.get("nodeid"))
        if nodeid in diagnostic:
            continue
        mine = now.get(nodeid)
        outcome = None if mine is None else mine.get("outcome")
        if mine is None or outcome in ("skipped", "xfailed", "deselected"):
            why = "not in AFTER" if mine is None else \
                f"{outcome} in AFTER: {_short(mine.get('message', ''))}"
            lost.append(Finding(Found.LOST, nodeid, f"passed in BEFORE, {why}"))
    return lost


def void_tiers(report: Report) -> set[str]:
    """Tiers in which REPORT proved nothing: a record of status void (a sensitivity gate
    whose hook never reached the server, an insensitive probe). A fault catalogue cell
    whose fault was never applied voids that cell only, not its tier's results."""
    return {str(c.get("tier")) for c in report.data.get("checks", [])
            if isinstance(c, dict) and c.get("status") == Status.VOID
            and c.get("kind") != Kind.FAULT_CATALOGUE}


def differences(before: Report, after: Report) -> tuple[list[Finding], list[Finding]]:
    """AFTER's correctness differences: (new ones, those also in BEFORE), in report order,
    isolation failures (KV served across cache_salt namespaces) first;
    a test that passed in BEFORE and not in AFTER is always new, and so is one that failed
    in a tier BEFORE proved nothing in (VOID): no baseline, not an old fault."""
    void = void_tiers(before)
    earlier = {f.key for f in findings(before) if f.tier not in void}
    problems = findings(after) + lost_tests(before, after)
    problems.sort(key=lambda f: f.kind is not Found.ISOLATION)  # a security failure first
    return ([f for f in problems if f.key not in earlier],
            [f for f in problems if f.key in earlier])
