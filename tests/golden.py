"""One terminal golden file per tier (tests/data/terminal/<tier>.txt): the tier's part of the
sharedkv summary (its counts line, reasons, table, notes and verdict lines) and the run's
verdict line, as a whole, normalised for what changes between runs (numbers with a
decimal point, rates, paths, ports, digests, column widths). The wording is held there
once per tier; the other self-tests assert on the JSON report's records.

Every test that holds one is marked ``golden``; one command rewrites every file that
differs (review the diff):

    SHAREDKV_SELFTEST_GOLDEN=update .venv/bin/python -m pytest tests -m golden -p no:cacheprovider
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "terminal"
UPDATE_ENV = "SHAREDKV_SELFTEST_GOLDEN"
TIER_LINE = re.compile(r"\[\w+\] tests: ")
# what differs between two runs of one case, in the order they are replaced
VARYING = (
    (re.compile(re.escape(str(ROOT)) + r"(?=/)"), "<checkout>"),  # the worktree's own path
    (re.compile(r"/[^\s:;,()\]]*/(pytest-\d+|popen-gw\d+)/[^\s:;,()\]]*"), "<tmp>"),
    (re.compile(r"127\.0\.0\.1:\d+"), "127.0.0.1:<port>"),
    (re.compile(r"\b[0-9a-f]{16,64}\b"), "<hex>"),
    (re.compile(r"\d[\d,]*\.\d+"), "#.#"),
    (re.compile(r"\b\d+ checks/s\b"), "# checks/s"),
    (re.compile(r"-{3,}"), "---"),
)
TABLE_PADDING = re.compile(r"(?<=\S) {2,}")  # a Markdown cell's width follows its column's


def tier_section(stdout: str, tier: str) -> list[str]:
    """TIER's lines of the sharedkv summary in STDOUT, then the run's verdict line."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"[{tier}] tests: "))
    end = next((i for i in range(start + 1, len(lines))
                if TIER_LINE.match(lines[i]) or lines[i].startswith(
                    ("environment as the tests saw it:", "sharedkv: "))), len(lines))
    section = lines[start:end]
    while section and not section[-1].strip():
        section.pop()
    verdict = [line for line in lines[end:] if line.startswith("sharedkv: ")]
    return section + verdict[:1]


Volatile = tuple[tuple["re.Pattern[str]", str], ...]


def normalise(lines: list[str], volatile: Volatile = ()) -> list[str]:
    out = []
    for line in lines:
        for pattern, replacement in (*volatile, *VARYING):
            line = pattern.sub(replacement, line)
        if line.lstrip().startswith("|"):
            line = TABLE_PADDING.sub(" ", line)
        out.append(line.rstrip())
    return out


def assert_golden(stdout: str, tier: str, volatile: Volatile = ()) -> None:
    """TIER's summary in STDOUT is, normalised, its golden file; VOLATILE masks what the
    case itself leaves to chance (each with a comment where it is given)."""
    found = normalise(tier_section(stdout, tier), volatile)
    path = GOLDEN / f"{tier}.txt"
    expected = path.read_text().splitlines() if path.exists() else []
    if found == expected:
        return
    if os.environ.get(UPDATE_ENV) == "update":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(found) + "\n")
        return
    diff = "\n".join(difflib.unified_diff(expected, found, str(path), "this run", lineterm=""))
    raise AssertionError(f"the [{tier}] summary differs from {path.name} ({UPDATE_ENV}=update "
                         f"rewrites it):\n{diff}")
