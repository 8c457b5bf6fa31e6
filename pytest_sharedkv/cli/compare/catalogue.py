"""The fault catalogue in two reports: whether the suite's sight changed. A class whose
faults BEFORE's checks caught as its class expects and AFTER's did not (missed, VOID,
unknown) is a correctness difference, named per class: an upgrade that leaves every
answer right can still leave the suite blind to a fault it saw. A class only AFTER ran is
said, not judged; one AFTER did not run is said too (a catalogue test that passed in BEFORE
and did not run in AFTER is already a lost test). Read from the records' kind, status and
detections, never their messages."""

from __future__ import annotations

from typing import Any

from pytest_sharedkv.cli.compare.finding import Finding, Found
from pytest_sharedkv.cli.compare.reading import Report
from pytest_sharedkv.report.records import Kind, Status

PAIR_KEYS = ("provider", "allocator", "delay")


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def cells(report: Report) -> dict[tuple[str, ...], dict[str, Any]]:
    """(pair keys..., class) -> the class's record, for every fault-catalogue record."""
    out = {}
    for check in report.data.get("checks", []):
        if not isinstance(check, dict) or check.get("kind") != Kind.FAULT_CATALOGUE:
            continue
        key = _dict(check.get("key"))
        out[(*(str(key.get(k, "")) for k in PAIR_KEYS), str(key.get("step", "")))] = check
    return out


def sees(record: dict[str, Any]) -> bool:
    """Whether the run saw the class as its class expects a detection: the record passed,
    and the class is one that something should catch (not a control, not a race probe)."""
    detail = _dict(record.get("detail"))
    return (record.get("status") == Status.PASS and bool(detail.get("expected"))
            and not detail.get("race_probe"))


def _caught_by(record: dict[str, Any]) -> str:
    detail = _dict(record.get("detail"))
    caught = detail.get("caught_by") or []
    return ", ".join(map(str, caught)) or "nothing"


def _subject(key: tuple[str, ...]) -> str:
    *pair, name = key
    return (f"fault catalogue {name} [" + ", ".join(f"{k}={v}" for k, v in
                                                   zip(PAIR_KEYS, pair, strict=True)) + "]")


def _now(record: dict[str, Any] | None) -> str:
    if record is None:
        return "not run in AFTER"
    status = record.get("status")
    if status == Status.VOID:
        return "VOID in AFTER (the fault was never applied)"
    if status == Status.INFO:
        return "n/a in AFTER"
    if status == Status.UNKNOWN:
        return "unknown in AFTER (its cell could not be judged)"
    return f"missed in AFTER (caught by {_caught_by(record)})"


def sight_changes(before: Report, after: Report) -> tuple[list[Finding], list[str]]:
    """(the classes BEFORE saw and AFTER does not, as findings; the lines that say what
    else changed: new classes, classes not run, detections that moved)."""
    b, a = cells(before), cells(after)
    if not b and not a:
        return [], []
    lost, lines = [], []
    for key, record in b.items():
        mine = a.get(key)
        if not sees(record) or mine is None or mine.get("status") == Status.INFO:
            continue
        if not sees(mine):
            lost.append(Finding(Found.SIGHT_LOST, _subject(key),
                                f"the suite's sight changed: BEFORE caught it by "
                                f"{_caught_by(record)}, {_now(mine)}",
                                str(record.get("tier", "?"))))
    new = [key[-1] for key in a if key not in b]
    gone = [key[-1] for key in b if key not in a]
    moved = [f"{key[-1]} (BEFORE by {_caught_by(b[key])}, AFTER by {_caught_by(a[key])})"
             for key in b if key in a and sees(b[key]) and sees(a[key])
             and _caught_by(b[key]) != _caught_by(a[key])]
    seen_b, seen_a = sum(sees(r) for r in b.values()), sum(sees(r) for r in a.values())
    line = (f"FAULT CATALOGUE: BEFORE saw {seen_b} of {len(b)} classes as expected, AFTER "
            f"{seen_a} of {len(a)}")
    if lost:
        line += f"; the suite's sight changed: {len(lost)} class(es) no longer seen"
    lines.append(line)
    if new:
        lines.append(f"  new in AFTER (said, not judged): {', '.join(dict.fromkeys(new))}")
    if gone:
        lines.append(f"  not run in AFTER: {', '.join(dict.fromkeys(gone))}")
    if moved:
        lines.append(f"  caught by other checks: {'; '.join(moved)}")
    return lost, lines
