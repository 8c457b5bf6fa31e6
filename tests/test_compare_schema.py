"""``compare`` reads both sides alike: a report that lacks what its schema holds (tests,
checks, notes as lists of objects with the fields a verdict reads) is refused on either
side with the field named (exit 2), never read as a report without failures; a file of
another tool says what it is; only a genuinely newer pytest-sharedkv schema is called
newer; BEFORE and AFTER that are one report say so. Every committed report reads."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.cli.compare.main import main
from pytest_sharedkv.cli.compare.reading import read_report

ROOT = Path(__file__).resolve().parents[1]
CLEAN = ROOT / "fixtures" / "lmcache" / "h200" / "service-0.5.6-fallback-mixed.json"
SCREENING = ROOT / "fixtures" / "perf" / "screening.json"
H200 = ROOT / "fixtures" / "perf" / "h200"
PROG = "python -m pytest_sharedkv compare"


@pytest.fixture(scope="module")
def clean() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(CLEAN.read_text())
    return data


def _with(data: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(data)
    for name, value in change.items():
        if value is KeyError:
            del out[name]
        else:
            out[name] = value
    return out


def _entry(data: dict[str, Any], name: str, index: int, **fields: Any) -> dict[str, Any]:
    out = copy.deepcopy(data)
    for field, value in fields.items():
        if value is KeyError:
            del out[name][index][field]
        else:
            out[name][index][field] = value
    return out


# (what the file holds, the line that names it)
MALFORMED = [
    ({"schema": "pytest-sharedkv/1"}, "tests: missing (every pytest-sharedkv/1 report lists "
                                      "its tests, checks, notes)"),
    ("tests=[1,2,3]", "tests[0]: expected an object, found int"),
    ("tests=null", "tests is not a list"),
    ("checks missing", "checks: missing (every pytest-sharedkv/1 report lists its tests, "
                       "checks, notes)"),
    ("notes=[\"VOID\"]", "notes[0]: expected an object, found str"),
    ("tests[0] without outcome", "tests[0].outcome: missing (each entry of tests holds "
                                 "nodeid, outcome)"),
    ("tests[0].nodeid=7", "tests[0].nodeid: expected a string, found int"),
    ("checks[0] without status", "checks[0].status: missing (a record with a kind carries "
                                 "its status)"),
    ("checks[0].status=bogus", "checks[0].status: 'bogus' is not a record status this plugin "
                               "knows (pass, fail, void, confounded, unproven, unknown, "
                               "xfail, info)"),
    ("checks[0].passed=true", "checks[0].passed: expected an integer, found bool"),
    ("interrupted=[1]", "interrupted: expected a string or true or false or null, found list"),
]


def _malformed(clean: dict[str, Any], what: Any) -> dict[str, Any]:
    if isinstance(what, dict):
        return what
    return {
        "tests=[1,2,3]": lambda: _with(clean, {"tests": [1, 2, 3]}),
        "tests=null": lambda: _with(clean, {"tests": None}),
        "checks missing": lambda: _with(clean, {"checks": KeyError}),
        "notes=[\"VOID\"]": lambda: _with(clean, {"notes": ["VOID"]}),
        "tests[0] without outcome": lambda: _entry(clean, "tests", 0, outcome=KeyError),
        "tests[0].nodeid=7": lambda: _entry(clean, "tests", 0, nodeid=7),
        "checks[0] without status": lambda: _entry(clean, "checks", 0, status=KeyError),
        "checks[0].status=bogus": lambda: _entry(clean, "checks", 0, status="bogus"),
        "checks[0].passed=true": lambda: _entry(clean, "checks", 0, passed=True),
        "interrupted=[1]": lambda: _with(clean, {"interrupted": [1]}),
    }[what]()


@pytest.mark.parametrize("side", ["BEFORE", "AFTER"])
@pytest.mark.parametrize(("what", "line"), MALFORMED, ids=[str(w) for w, _ in MALFORMED])
def test_a_malformed_report_is_refused_on_either_side(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], clean: dict[str, Any],
        side: str, what: Any, line: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_malformed(clean, what)))
    args = [bad, CLEAN] if side == "BEFORE" else [CLEAN, bad]
    assert main([str(a) for a in args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"{PROG}: {bad}: {line}\n"


OTHERS = [
    ('{"name": "x", "version": 1}', 'not a pytest-sharedkv report: it has no "schema" key '
                                    "(its top level holds name, version)"),
    ('{"schema": "https://json.schemastore.org/package"}',
     "not a pytest-sharedkv report: its schema is 'https://json.schemastore.org/package', "
     "another tool's"),
    ('{"schema": 3}', "schema: expected a string, found int (not a pytest-sharedkv report)"),
    ('{"schema": "pytest-sharedkv/corpus/1", "requests": []}',
     "not a report: its schema 'pytest-sharedkv/corpus/1' is another pytest-sharedkv file's "
     "(a report's is 'pytest-sharedkv/1')"),
    ('{"schema": "pytest-sharedkv/0"}',
     "schema 'pytest-sharedkv/0': no pytest-sharedkv wrote it (a report's is "
     "'pytest-sharedkv/1')"),
]


@pytest.mark.parametrize(("content", "line"), OTHERS, ids=[c for c, _ in OTHERS])
def test_a_file_of_another_tool_says_what_it_is(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, line: str) -> None:
    """Named for what it is (not "a newer plugin wrote them"), on whichever side it is."""
    other = tmp_path / "other.json"
    other.write_text(content)
    for args in ([other, other], [CLEAN, other], [other, CLEAN]):
        assert main([str(a) for a in args]) == 2
        err = capsys.readouterr().err
        assert err == f"{PROG}: {other}: {line}\n"
        assert "newer" not in err


def test_only_a_newer_sharedkv_schema_is_called_newer(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], clean: dict[str, Any]) -> None:
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({"schema": "pytest-sharedkv/2", "tests": "another shape"}))
    assert main([str(newer), str(newer)]) == 2
    assert capsys.readouterr().err == (
        f"{PROG}: incomparable reports: schema 'pytest-sharedkv/2' is not "
        "'pytest-sharedkv/1' (a newer plugin wrote them)\n")


def test_a_report_against_itself_says_it_is_one_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same file (any name, a hard link) or a copy: the compare runs (a report against
    itself is its sanity check: its own failures still fail it) and a line says BEFORE and
    AFTER are one report; two reports say nothing of the kind."""
    mine = tmp_path / "s.json"
    mine.write_bytes(SCREENING.read_bytes())
    link, copied = tmp_path / "link.json", tmp_path / "copy.json"
    os.link(mine, link)
    copied.write_bytes(SCREENING.read_bytes())
    for before, after, how in (
            (SCREENING, SCREENING, f"one file ({SCREENING})"),
            (mine, link, f"one file ({link})"),
            (SCREENING, copied, "one report under two names (created ")):
        assert main([str(before), str(after)]) == 0
        out = capsys.readouterr().out
        assert f"SAME REPORT: BEFORE and AFTER are {how}" in out, out
        assert "RESULT: OK" in out
    assert main([str(H200 / "perf-27b-compiled-s1.json"),
                 str(H200 / "perf-27b-compiled-s2.json")]) == 0
    assert "SAME REPORT" not in capsys.readouterr().out


def test_every_committed_report_reads() -> None:
    """The schema holds what the plugin has written: every committed report passes it."""
    reports = sorted((ROOT / "fixtures").rglob("*.json"))
    read = []
    for path in reports:
        data = json.loads(path.read_text())
        if isinstance(data, dict) and data.get("schema") == "pytest-sharedkv/1":
            read.append(read_report(path).path)
    assert len(read) >= 25
