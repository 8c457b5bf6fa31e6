"""The compare's Markdown: identities, the RESULT line with its noise notes, the
correctness table and the speed tables."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pytest_sharedkv.cli.compare import engines as engine_lines
from pytest_sharedkv.cli.compare import speed
from pytest_sharedkv.cli.compare.correctness import void_tiers
from pytest_sharedkv.cli.compare.finding import Finding
from pytest_sharedkv.cli.compare.flags import FLAGS_DIFFER
from pytest_sharedkv.cli.compare.kernels import kernel_line
from pytest_sharedkv.cli.compare.placement import PLACEMENT_DIFFERS
from pytest_sharedkv.cli.compare.reading import Report, tiers
from pytest_sharedkv.cli.compare.speed import Change
from pytest_sharedkv.cli.compare.stacks import STACK_CHANGE, Stack, change_line
from pytest_sharedkv.cli.compare.topology import TOPOLOGY_DIFFERS
from pytest_sharedkv.config.engine import Engine
from pytest_sharedkv.perf.significance import MIN_PAIRS
from pytest_sharedkv.report.markdown import markdown_table


def _percent(change: Change) -> str:
    relative = change.relative
    return "-" if relative is None else f"{relative:+.1%}"


def _verdict(change: Change, limit: float, blocked: Sequence[str]) -> str:
    """The cell's verdict; where BLOCKED names differences that keep speed from being
    judged (FLAGS DIFFER, PLACEMENT DIFFERS), a change the block pairs tell from noise is
    shown, not judged."""
    if not blocked or change.judge(limit) not in speed.JUDGED:
        return change.verdict(limit)
    return f"{change.direction()}, not judged: {', '.join(blocked)}"


def _rows(changes: Sequence[Change], limit: float, blocked: Sequence[str] = ()
          ) -> list[list[str]]:
    return [[*c.what, str(c.before) if c.before else "-", str(c.after) if c.after else "-",
             _percent(c), _verdict(c, limit, blocked)] for c in changes]


def _judging(label: str, option: str, blocked: Sequence[str], why: str) -> str:
    """What a difference (LABEL, lifted by OPTION) does to the speed verdicts, given the
    differences BLOCKED that keep them from being judged."""
    if label in blocked:
        return f"speed cells are shown but not judged as regressions ({why}); {option} " \
            "judges them"
    if not blocked:
        return f"speed cells judged anyway ({option})"
    return f"{option} given, but speed cells are still not judged: {', '.join(blocked)}"


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
        if run.runs:  # a merge-screenings report: say what it stands on
            parts.append(f"merged from {len(run.runs)} separate runs (created "
                         f"{', '.join(r.created for r in run.runs)})")
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


def report_lines(before: Report, after: Report, limit: float, *, status: int,
                 new: Sequence[Finding], old: Sequence[Finding], changes: Sequence[Change],
                 sessions: Sequence[Change], flags: Sequence[str] = (),
                 placement: tuple[str, str] | None = None,
                 topology: tuple[str, str] | None = None, blocked: Sequence[str] = (),
                 switched: str = "", arms: str = "", same: str = "",
                 sight: Sequence[str] = (), stacks: tuple[Stack, Stack] | None = None,
                 engines: tuple[Engine, Engine] | None = None) -> list[str]:
    """The compare's Markdown: STATUS decided, NEW and OLD correctness differences (AFTER's,
    new ones first), the TTFT CHANGES and session-wall SESSIONS; FLAGS: the engine
    settings that differ; PLACEMENT: (BEFORE's, AFTER's) replica placement where they
    differ; TOPOLOGY: (BEFORE's, AFTER's) topology and L2 where they differ; BLOCKED: the
    differences that keep speed from being judged (FLAGS DIFFER unless
    --allow-flag-change, PLACEMENT DIFFERS unless --allow-placement-change, TOPOLOGY
    DIFFERS unless --allow-topology-change);
    SWITCHED: the allocator switch BEFORE was read across, if any; ARMS: the perf arms
    only one side screened, if any (CHANGES and SESSIONS hold the shared arms only); SAME:
    the line that says BEFORE and AFTER are one report, if they are; SIGHT: the fault
    catalogue's lines (catalogue.sight_changes), if either side ran it; STACKS: (BEFORE's,
    AFTER's) KV stack where they differ (STACK CHANGE, not judged unless
    --allow-stack-change); ENGINES: (BEFORE's, AFTER's) serving engine where they differ
    (ENGINE CHANGE, speed never judged)."""
    every = [*changes, *sessions]
    regressions = [] if blocked else speed.regressions(every, limit)
    missing = speed.missing(every)
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
             f"- BEFORE: {_identity(before)}", f"- AFTER: {_identity(after)}",
             kernel_line(before, after), "",
             "; ".join([result, *_noise_notes(every, limit)]), ""]
    if same:
        lines += [same, ""]
    b_tiers, a_tiers = tiers(before), tiers(after)
    if b_tiers and a_tiers and b_tiers != a_tiers:
        only = [f"only {side} ran {', '.join(sorted(mine - theirs))}" for side, mine, theirs
                in (("BEFORE", b_tiers, a_tiers), ("AFTER", a_tiers, b_tiers))
                if mine - theirs]
        lines += [f"TIERS DIFFER: {'; '.join(only)}: a test of a tier only BEFORE ran is "
                  "lost here, whatever the stack did (run both with the same -m)", ""]
    if switched:
        lines += [switched, ""]
    if arms:
        lines += [arms, ""]
    void = sorted(void_tiers(before) & a_tiers)
    if void:
        lines += [f"BEFORE VOID in {', '.join(void)}: BEFORE proved nothing there, so its "
                  "failures are no baseline: AFTER's are counted as new", ""]
    if flags:
        lines += [f"{FLAGS_DIFFER}: {'; '.join(flags)}: " + (
            "the engines ran differently (no perf screening: correctness as usual)"
            if before.perf is None else _judging(
                FLAGS_DIFFER, "--allow-flag-change", blocked, "the engines ran differently")),
                  ""]
    if placement is not None:
        lines += [f"{PLACEMENT_DIFFERS}: BEFORE {placement[0]}, AFTER {placement[1]}: "
                  + _judging(PLACEMENT_DIFFERS, "--allow-placement-change", blocked,
                             "the replicas shared a GPU on one side only"), ""]
    if topology is not None:
        lines += [f"{TOPOLOGY_DIFFERS}: BEFORE {topology[0]}, AFTER {topology[1]}: " + (
            "correctness compared as always (no perf screening)" if before.perf is None
            else _judging(TOPOLOGY_DIFFERS, "--allow-topology-change", blocked,
                          "the KV took another path between the replicas")), ""]
    if stacks is not None:
        lines += [f"{change_line(stacks)}; " + (
            "correctness compared as always (no perf screening)" if before.perf is None
            else _judging(STACK_CHANGE, "--allow-stack-change", blocked,
                          "the KV moved through another integration")), ""]
    if engines is not None:
        lines += [engine_lines.change_line(engines), ""]
    if sight:
        lines += [*sight, ""]
    lines += ["## Correctness (AFTER)", ""]
    if new or old:
        rows = [["NEW" if f in new else "also in BEFORE", f.kind, f.subject, f.message]
                for f in [*new, *old]]
        lines += markdown_table(["", "kind", "test or record", "message"], rows)
    else:
        lines.append("No failed or unfinished test, no VOID result, namespace leak, divergence "
                     "or failed hit accounting; every test that passed in BEFORE passed.")
    lines += ["", f"## Performance (a regression: a cell slower than {limit:.0%} and beyond "
              "the noise of its block pairs, Welch's t on their medians, one-sided 95%)", ""]
    if before.perf is None:
        lines.append("Neither report holds a perf screening: speed not compared.")
        return lines
    if changes:
        lines += ["TTFT median s (n observations, block pairs behind each number):",
                  *markdown_table(["size", "arm", "step", "BEFORE", "AFTER", "change",
                                   "verdict"], _rows(changes, limit, blocked))]
    if sessions:
        lines += ["", "session wall time median s:",
                  *markdown_table(["arm", "placement", "BEFORE", "AFTER", "change",
                                   "verdict"], _rows(sessions, limit, blocked))]
    if not changes and not sessions:
        lines.append("The screenings recorded no measured observations.")
    return lines
