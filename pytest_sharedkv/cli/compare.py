"""``python -m pytest_sharedkv compare BEFORE.json AFTER.json``: the pre-upgrade check.

Correctness first: any failed or unfinished test, any VOID or CONFOUNDED result,
namespace leak, divergence, failed hit accounting, KV audit mismatch or PARTIAL pool hit in
AFTER, and any test that passed in BEFORE and did not pass in AFTER, fails the compare (new
ones, by test id, listed first). Records are judged by their kind and status (see
``report.records``), never by their message; records without them (reports written
before they existed) go to the legacy reader, which applies the old text rule.

Then speed: per cell (size x arm x step) the median TTFT, and per arm x
placement the median session wall time, with the observations and block pairs behind each
number and the relative change; a cell slower than ``--max-regression`` is a regression
when its block pairs also tell the change from noise (``significance.welch``, one-sided in
the change's direction; pyperf's ``compare_to`` judges the same way and prints "Not
significant"), else the verdict says "within noise" or "not judged" and the RESULT line
counts them, slower and faster: an A/A pair of H200 runs differs by 10-35% in some cells.

Exit status: 0 no difference, 1 a regression or a correctness difference, 2 a usage error
or reports that do not compare (another schema, model or corpus; a file that is missing or
not JSON). Bad input gets one line naming the file or option, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from pytest_sharedkv.perf.floor import invalid
from pytest_sharedkv.perf.hits import full_hit_tokens, partial_hits
from pytest_sharedkv.perf.observations import PerfReportError, from_json
from pytest_sharedkv.perf.significance import MIN_PAIRS, Welch, welch
from pytest_sharedkv.perf.statistics import Analysis, analyse
from pytest_sharedkv.perf.tables import behind, seconds
from pytest_sharedkv.report.markdown import markdown_table

REPORT_SCHEMA = "pytest-sharedkv/1"  # report_json.SCHEMA, without importing the plugin
DEFAULT_MAX_REGRESSION = "10%"
PROG = "python -m pytest_sharedkv compare"
FAILED = ("failed", "error")
SERVICE = "service_regression"
NOT_STEP_TOTALS = ("gate", "session", "protocol", "model", "warm-up")


class CompareError(Exception):
    """Exit status 2: a usage error or reports that cannot be compared."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise CompareError(f"{message}\n{self.format_usage().rstrip()}")


def max_regression(text: str) -> float:
    """"10%" -> 0.10, "0.1" -> 0.1 (a plain number is a fraction)."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage (10%) or a fraction "
                                         "(0.1)") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a non-negative percentage or "
                                         "fraction")
    if not raw.endswith("%") and value >= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is ambiguous: write {raw}% or a fraction "
                                         "such as 0.1")
    return value


# --- reading ----------------------------------------------------------------------------


@dataclass
class Report:
    path: Path
    data: dict[str, Any]
    perf: Analysis | None


def read_report(path: Path) -> Report:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CompareError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CompareError(f"{path}: is a directory, not a JSON report") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CompareError(f"{path}: cannot be read ({exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CompareError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: "
                           f"{exc.msg})") from None
    if not isinstance(data, dict):
        raise CompareError(f"{path}: not a sharedkv JSON report (the top level is a "
                           f"{type(data).__name__}, not an object)")
    perf = None
    if data.get("perf") is not None:
        try:
            perf = analyse(from_json(data["perf"]))
        except PerfReportError as exc:
            raise CompareError(f"{path}: {exc}") from None
    for name in ("tests", "checks", "notes", "collection"):
        if not isinstance(data.get(name, []), list):
            raise CompareError(f"{path}: {name} is not a list")
    return Report(path, data, perf)


def comparable(before: Report, after: Report) -> None:
    """Raise CompareError saying which identity differs, with both values."""
    b, a = before.data.get("schema"), after.data.get("schema")
    if b != a:
        raise CompareError(f"incomparable reports: schema differs: BEFORE {b!r}, AFTER {a!r}")
    if b != REPORT_SCHEMA:
        raise CompareError(f"incomparable reports: schema {b!r} is not {REPORT_SCHEMA!r} "
                           "(a newer plugin wrote them)")
    if (before.perf is None) != (after.perf is None):
        has, lacks = ("BEFORE", "AFTER") if after.perf is None else ("AFTER", "BEFORE")
        raise CompareError(f"incomparable reports: {has} holds a perf screening and {lacks} "
                           "none (run both with the perf tier)")
    if before.perf is None or after.perf is None:
        return
    for name in ("schema", "model_digest", "corpus_digest"):
        b, a = getattr(before.perf.run, name), getattr(after.perf.run, name)
        if b != a:
            what = {"schema": "perf schema", "model_digest": "model digest",
                    "corpus_digest": "corpus digest"}[name]
            raise CompareError(f"incomparable reports: {what} differs: BEFORE {b!r}, "
                               f"AFTER {a!r}")


# --- correctness ------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    kind: str  # failed | error | unfinished | lost | VOID | CONFOUNDED | divergence | ...
    subject: str  # the test id, or the record's tier and key
    message: str

    @property
    def key(self) -> tuple[str, str]:
        return self.kind, self.subject


def _short(text: object, limit: int = 240) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


# What a failed record of each kind is called in the compare (the other kinds' failures,
# protocol, bytes, ordering ..., fail their test, which the compare lists by test id).
FAILED_KINDS = {"leak": "namespace leak", "divergence": "divergence",
                "hits": "hit accounting", "hits-unknown": "hit accounting",
                "audit-mismatch": "KV audit mismatch"}
STATUS_FINDINGS = {"void": "VOID", "confounded": "CONFOUNDED"}


def _check_kind(check: dict[str, Any]) -> str | None:
    """The finding a check record makes, from its kind and status only."""
    if "kind" not in check:
        return legacy_check_kind(check)
    status = check.get("status")
    if status in STATUS_FINDINGS:
        return STATUS_FINDINGS[str(status)]
    if status == "fail":
        return FAILED_KINDS.get(str(check.get("kind")))
    return None


def _note_kind(note: dict[str, Any]) -> str | None:
    if "status" not in note:
        return legacy_note_kind(note)
    return STATUS_FINDINGS.get(str(note.get("status")))


# --- legacy: reports written before records carried a kind and status -------------------


def legacy_check_kind(check: dict[str, Any]) -> str | None:
    """A check record without a kind (an older report), read by the text rule the compare
    used before records had one. Only for such records; never for a current report."""
    key = check.get("key") or {}
    message = str(check.get("message") or "")
    detail = check.get("detail") or {}
    status = detail.get("status") if isinstance(detail, dict) else None
    if not isinstance(key, dict) or key.get("size") == "warm-up":
        return None
    lower = message.lower()
    if status == "VOID" or message.startswith("VOID") or "VOID:" in message:
        return "VOID"
    if "leak" in lower:
        return "namespace leak"
    if "divergen" in lower or (key.get("step") == "chain" and
                               check.get("passed") != check.get("trials")):
        return "divergence"
    if (check.get("tier") == SERVICE and message and key.get("size") not in NOT_STEP_TOTALS
            and key.get("step") != "chain"):
        return "hit accounting"
    return None


def legacy_note_kind(note: dict[str, Any]) -> str | None:
    """A note without a status (an older report): VOID when its text says so."""
    return "VOID" if "VOID" in str(note.get("text", "")) else None


def _record(check: dict[str, Any]) -> str:
    key = check.get("key") or {}
    where = ", ".join(f"{k}={v}" for k, v in key.items()) if isinstance(key, dict) else key
    return f"{check.get('tier', '?')} [{where}]"


def findings(report: Report) -> list[Finding]:
    """What in one report makes it fail a compare, in report order."""
    data = report.data
    found: list[Finding] = []
    if data.get("interrupted"):
        found.append(Finding("interrupted", "the run", _short(data["interrupted"])))
    outcomes = {}
    for test in data.get("tests", []):
        if not isinstance(test, dict):
            continue
        nodeid, outcome = str(test.get("nodeid", "?")), test.get("outcome")
        outcomes[nodeid] = outcome
        if outcome in FAILED:
            found.append(Finding(str(outcome), nodeid, _short(test.get("message", ""))))
        elif outcome is None:
            found.append(Finding("unfinished", nodeid, "the test never reported an outcome"))
    for entry in data.get("collection", []):
        if isinstance(entry, dict) and entry.get("outcome") in (*FAILED, "errors"):
            found.append(Finding("collection error", str(entry.get("nodeid", "?")),
                                 _short(entry.get("message", ""))))
    for check in data.get("checks", []):
        if not isinstance(check, dict) or outcomes.get(str(check.get("nodeid"))) == "xfailed":
            continue
        kind = _check_kind(check)
        if kind:
            found.append(Finding(kind, _record(check), _short(check.get("message", ""))))
    for note in data.get("notes", []):
        kind = _note_kind(note) if isinstance(note, dict) else None
        if isinstance(note, dict) and kind:
            found.append(Finding(kind, f"{note.get('tier', '?')} note",
                                 _short(note.get("text", ""))))
    if report.perf is not None:
        for refusal in report.perf.pairing.refusals:
            found.append(Finding("perf pairing refused", f"request {refusal.request} block "
                                 f"{refusal.block} arm {refusal.arm}", refusal.reason))
        if report.perf.run.floor is not None:
            for o in invalid(report.perf.run.observations, report.perf.run.floor):
                found.append(Finding(
                    "INVALID (below floor)", f"request {o.request} block {o.block} arm {o.arm}",
                    f"cross-replica TTFT {seconds(o.ttft_s)} s < floor "
                    f"{seconds(report.perf.run.floor.seconds(o.prompt_tokens))} s: the "
                    "receiver's own prefix cache answered"))
        run = report.perf.run
        for o in partial_hits(run.observations, run.chunk_tokens):
            chunk = run.chunk_tokens or 0
            found.append(Finding(
                "PARTIAL pool hit", f"request {o.request} block {o.block} arm {o.arm}",
                f"cross-replica request found {o.cached_tokens:,} of {o.prompt_tokens:,} "
                f"prompt tokens in a cache, a full hit is "
                f"{full_hit_tokens(o.prompt_tokens, chunk):,}: its TTFT includes a "
                "recompute (the pool evicted or B's lookup missed)"))
    return list({f.key: f for f in found}.values())


def lost_tests(before: Report, after: Report) -> list[Finding]:
    """Tests that passed in BEFORE and did not pass (or did not run) in AFTER."""
    now = {str(t.get("nodeid")): t for t in after.data.get("tests", []) if isinstance(t, dict)}
    lost = []
    for test in before.data.get("tests", []):
        if not isinstance(test, dict) or test.get("outcome") != "passed":
            continue
        nodeid = str(test.get("nodeid"))
        mine = now.get(nodeid)
        outcome = None if mine is None else mine.get("outcome")
        if mine is None or outcome in ("skipped", "xfailed", "deselected"):
            why = "not in AFTER" if mine is None else \
                f"{outcome} in AFTER: {_short(mine.get('message', ''))}"
            lost.append(Finding("lost", nodeid, f"passed in BEFORE, {why}"))
    return lost


# --- performance ------------------------------------------------------------------------


@dataclass(frozen=True)
class Stat:
    median: float
    n: int
    pairs: int
    per_pair: tuple[float, ...] = ()  # the cell's median in each block pair

    def __str__(self) -> str:
        return f"{seconds(self.median)} ({behind(self.n, self.pairs)})"


@dataclass(frozen=True)
class Change:
    what: tuple[str, ...]  # (size, arm, step) or (arm, placement)
    before: Stat | None
    after: Stat | None

    @property
    def relative(self) -> float | None:
        if self.before is None or self.after is None or self.before.median <= 0:
            return None
        return self.after.median / self.before.median - 1

    def test(self) -> Welch | None:
        """Welch's t on the per-pair medians, or None where it cannot run (a side with
        fewer than ``MIN_PAIRS`` block pairs, or a per-pair median that is not positive)."""
        if self.before is None or self.after is None:
            return None
        if min(self.before.per_pair + self.after.per_pair, default=0.0) <= 0:
            return None
        return welch(self.before.per_pair, self.after.per_pair)

    def significant(self, test: Welch) -> bool:
        """One-sided, in the direction of the median change: a slower median whose t says
        AFTER is faster (or is small) is not a regression."""
        change = self.relative
        if not change:
            return False
        return test.shows(slower=change > 0)

    def beyond(self, limit: float) -> bool:
        """Changed by more than LIMIT either way (judged or not)."""
        change = self.relative
        return change is not None and abs(change) > limit

    def verdict(self, limit: float) -> str:
        """ok; REGRESSION or faster (beyond LIMIT and beyond the noise); slower/faster
        within noise or not judged (beyond LIMIT, too few block pairs to tell)."""
        if self.after is None:
            return "MISSING in AFTER"
        if self.before is None:
            return "new in AFTER"
        change = self.relative
        if change is None or not self.beyond(limit):
            return "ok"
        direction = f"{'slower' if change > 0 else 'faster'} {change:+.1%}"
        test = self.test()
        if test is None:
            return (f"{direction}, not judged: BEFORE {self.before.pairs}, AFTER "
                    f"{self.after.pairs} block pairs (the t-test needs >= {MIN_PAIRS} on "
                    "each side)")
        if not self.significant(test):
            return f"{direction}, within noise ({test.describe(slower=change > 0)})"
        return "REGRESSION" if change > 0 else "faster"

    def failed(self, limit: float) -> bool:
        return self.verdict(limit) in ("REGRESSION", "MISSING in AFTER")

    def not_judged(self, limit: float) -> bool:
        """Beyond LIMIT, and the t-test cannot run (too few block pairs on a side)."""
        return self.before is not None and self.after is not None and \
            self.beyond(limit) and self.test() is None

    def within_noise(self, limit: float) -> bool:
        """Beyond LIMIT, and the t-test ran and cannot tell the change from noise."""
        test = self.test()
        return self.before is not None and self.after is not None and \
            self.beyond(limit) and test is not None and not self.significant(test)


def _changes(before: dict[tuple[str, ...], Stat], after: dict[tuple[str, ...], Stat]
             ) -> list[Change]:
    keys = list(before) + [k for k in after if k not in before]
    return [Change(k, before.get(k), after.get(k)) for k in keys]


def ttft_changes(before: Analysis, after: Analysis) -> list[Change]:
    def stats(a: Analysis) -> dict[tuple[str, ...], Stat]:
        return {(c.size, c.arm, c.step): Stat(
            c.median_ttft_s, c.n, c.block_pairs, c.per_pair_ttft_s) for c in a.cells}

    return _changes(stats(before), stats(after))


def session_changes(before: Analysis, after: Analysis) -> list[Change]:
    def stats(a: Analysis) -> dict[tuple[str, ...], Stat]:
        return {(c.arm, c.placement): Stat(
            c.median_wall_s, c.n, c.block_pairs, c.per_pair_wall_s) for c in a.session_cells}

    return _changes(stats(before), stats(after))


def _percent(change: Change) -> str:
    relative = change.relative
    return "-" if relative is None else f"{relative:+.1%}"


def _rows(changes: Sequence[Change], limit: float) -> list[list[str]]:
    return [[*c.what, str(c.before) if c.before else "-", str(c.after) if c.after else "-",
             _percent(c), c.verdict(limit)] for c in changes]


# --- the report -------------------------------------------------------------------------


def _identity(report: Report) -> str:
    data = report.data
    parts = [f"created {data.get('created', '?')}", f"plugin {data.get('plugin_version', '?')}"]
    if data.get("complete") is False:
        parts.append("INCOMPLETE")
    if report.perf is not None:
        run = report.perf.run
        engine = ", ".join(f"{k} {v}" for k, v in run.engine.items())
        parts.append(f"model {run.model_digest}, corpus {run.corpus_digest}"
                     + (f", {engine}" if engine else ""))
    return "; ".join(parts)


def _directions(changes: Sequence[Change]) -> str:
    slower = sum(1 for c in changes if (c.relative or 0) > 0)
    return f"{slower} slower, {len(changes) - slower} faster"


def _span(counts: Iterable[int]) -> str:
    values = sorted(set(counts))
    return str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}"


def _noise_notes(changes: Sequence[Change], limit: float) -> list[str]:
    """The cells beyond LIMIT that were not called slower or faster, counted, so that an OK
    never hides a slower cell the block pairs could not judge."""
    notes = []
    unjudged = [c for c in changes if c.not_judged(limit)]
    if unjudged:
        b = _span(c.before.pairs for c in unjudged if c.before is not None)
        a = _span(c.after.pairs for c in unjudged if c.after is not None)
        notes.append(f"{len(unjudged)} cell(s) changed by more than {limit:.0%} without enough "
                     f"block pairs to tell from noise ({_directions(unjudged)}; BEFORE {b}, "
                     f"AFTER {a} block pairs: run --sharedkv-blocks {MIN_PAIRS} or more on "
                     "both sides to judge them)")
    noisy = [c for c in changes if c.within_noise(limit)]
    if noisy:
        notes.append(f"{len(noisy)} cell(s) changed by more than {limit:.0%} within the noise "
                     f"of their block pairs ({_directions(noisy)})")
    return notes


def compare(before: Report, after: Report, limit: float) -> tuple[int, list[str]]:
    """(exit status, Markdown lines) of two comparable reports."""
    earlier = {f.key for f in findings(before)}
    problems = findings(after) + lost_tests(before, after)
    new = [f for f in problems if f.key not in earlier]
    old = [f for f in problems if f.key in earlier]
    changes: list[Change] = []
    sessions: list[Change] = []
    if before.perf is not None and after.perf is not None:
        changes = ttft_changes(before.perf, after.perf)
        sessions = session_changes(before.perf, after.perf)
    every = changes + sessions
    regressions = [c for c in every if c.verdict(limit) == "REGRESSION"]
    missing = [c for c in every if c.after is None]
    status = 1 if problems or regressions or missing else 0
    summary = []
    if new:
        summary.append(f"{len(new)} new correctness difference(s)")
    if old:
        summary.append(f"{len(old)} correctness difference(s) also in BEFORE")
    if regressions:
        summary.append(f"{len(regressions)} significant regression(s) beyond {limit:.0%}")
    if missing:
        summary.append(f"{len(missing)} cell(s) MISSING in AFTER")
    result = ("RESULT: FAIL: " + ", ".join(summary)) if status else \
        f"RESULT: OK: no correctness difference, no significant regression beyond {limit:.0%}"
    lines = [f"# sharedkv compare: {before.path} -> {after.path}", "",
             f"- BEFORE: {_identity(before)}", f"- AFTER: {_identity(after)}", "",
             "; ".join([result, *_noise_notes(every, limit)]), "",
             "## Correctness (AFTER)", ""]
    if problems:
        rows = [["NEW" if f in new else "also in BEFORE", f.kind, f.subject, f.message]
                for f in new + old]
        lines += markdown_table(["", "kind", "test or record", "message"], rows)
    else:
        lines.append("No failed or unfinished test, no VOID result, namespace leak, divergence "
                     "or failed hit accounting; every test that passed in BEFORE passed.")
    lines += ["", f"## Performance (a regression: a cell slower than {limit:.0%} and beyond "
              "the noise of its block pairs, Welch's t on their medians, one-sided 95%)", ""]
    if before.perf is None:
        lines.append("Neither report holds a perf screening: speed not compared.")
        return status, lines
    if changes:
        lines += ["TTFT median s (n observations, block pairs behind each number):",
                  *markdown_table(["size", "arm", "step", "BEFORE", "AFTER", "change",
                                   "verdict"], _rows(changes, limit))]
    if sessions:
        lines += ["", "session wall time median s:",
                  *markdown_table(["arm", "placement", "BEFORE", "AFTER", "change",
                                   "verdict"], _rows(sessions, limit))]
    if not changes and not sessions:
        lines.append("The screenings recorded no measured observations.")
    return status, lines


def main(argv: Sequence[str]) -> int:
    import sys

    parser = _Parser(prog=PROG, description="Compare two sharedkv JSON reports: correctness "
                     "first, then median TTFT and session wall time per cell.")
    parser.add_argument("before", type=Path, metavar="BEFORE.json")
    parser.add_argument("after", type=Path, metavar="AFTER.json")
    parser.add_argument("--max-regression", type=max_regression,
                        default=max_regression(DEFAULT_MAX_REGRESSION), metavar="LIMIT",
                        help="a cell slower by more than this is a regression: 10%% or 0.1 "
                             f"(default {DEFAULT_MAX_REGRESSION.replace('%', '%%')})")
    parser.add_argument("--markdown", type=Path, metavar="OUT.md",
                        help="also write the report to this file")
    try:
        args = parser.parse_args(list(argv))
        before, after = read_report(args.before), read_report(args.after)
        comparable(before, after)
        status, lines = compare(before, after, args.max_regression)
        text = "\n".join(lines) + "\n"
        if args.markdown is not None:
            try:
                args.markdown.write_text(text, encoding="utf-8")
            except OSError as exc:
                raise CompareError(f"--markdown: cannot write {args.markdown} ({exc})") \
                    from None
    except CompareError as exc:
        sys.stderr.write(f"{PROG}: {exc}\n")
        return 2
    sys.stdout.write(text)
    return status
