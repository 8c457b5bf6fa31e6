"""The command line: arguments, the two reports, the exit status (0 same, 1 a regression
or a correctness difference, 2 a usage error or reports that do not compare)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from pytest_sharedkv.cli.compare import speed
from pytest_sharedkv.cli.compare.allocators import as_twin, switch, switch_line
from pytest_sharedkv.cli.compare.catalogue import sight_changes
from pytest_sharedkv.cli.compare.correctness import differences
from pytest_sharedkv.cli.compare.engines import ENGINE_CHANGE, engine_change
from pytest_sharedkv.cli.compare.flags import FLAGS_DIFFER, flag_differences
from pytest_sharedkv.cli.compare.kernels import lost_kernels
from pytest_sharedkv.cli.compare.placement import PLACEMENT_DIFFERS, placement_difference
from pytest_sharedkv.cli.compare.reading import (
    CompareError,
    Report,
    comparable,
    read_report,
    same_line,
)
from pytest_sharedkv.cli.compare.rendering import report_lines
from pytest_sharedkv.cli.compare.stacks import STACK_CHANGE, stack_change
from pytest_sharedkv.cli.compare.topology import TOPOLOGY_DIFFERS, topology_difference
from pytest_sharedkv.cli.output import Output, OutputError, to_stdout

DEFAULT_MAX_REGRESSION = "10%"
PROG = "python -m pytest_sharedkv compare"


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


def compare(before: Report, after: Report, limit: float, allow_flag_change: bool = False,
            allow_placement_change: bool = False,
            allow_topology_change: bool = False,
            allow_stack_change: bool = False) -> tuple[int, list[str]]:
    """(exit status, Markdown lines) of two comparable reports. Where the engines' flags
    differ, the replicas' placement (one GPU, one each) or the topology (one server, one
    per replica over an L2) or the KV stack (MP server, in-process, native offload), speed
    cells are shown but not judged (no regression) unless ALLOW_FLAG_CHANGE,
    ALLOW_PLACEMENT_CHANGE, ALLOW_TOPOLOGY_CHANGE, ALLOW_STACK_CHANGE respectively.
    Where each ran one allocator and they differ, BEFORE is read as its AFTER-allocator twin."""
    found = switch(before, after)
    if found is not None:
        before = as_twin(before, *found, after)
    new, old = differences(before, after)
    new = lost_kernels(before, after) + new  # an upgrade that lost the compiled kernels
    blind, sight = sight_changes(before, after)  # fault classes the suite no longer sees
    new = [*new, *blind]
    changes, sessions = speed.changes(before.perf, after.perf)
    every = changes + sessions
    flags = flag_differences(before, after)
    moved = placement_difference(before, after)
    topology = topology_difference(before, after)
    stacks = stack_change(before, after)
    engines = engine_change(before, after)  # vLLM -> SGLang: speed never judged across
    # the differences that keep speed from being judged, each unless its option allows it
    blocked = [label for label, differs, allowed in (
        (FLAGS_DIFFER, bool(flags), allow_flag_change),
        (PLACEMENT_DIFFERS, moved is not None, allow_placement_change),
        (TOPOLOGY_DIFFERS, topology is not None, allow_topology_change),
        (STACK_CHANGE, stacks is not None, allow_stack_change),
        (ENGINE_CHANGE, engines is not None, False))
        if differs and not allowed]
    regressed = not blocked and bool(speed.regressions(every, limit))
    status = 1 if new or old or regressed or speed.missing(every) else 0
    return status, report_lines(before, after, limit, status=status, new=new, old=old,
                                changes=changes, sessions=sessions, flags=flags,
                                placement=moved, topology=topology, blocked=blocked,
                                stacks=stacks, engines=engines,
                                switched=switch_line(found) if found is not None else "",
                                arms=speed.arms_line(before.perf, after.perf),
                                same=same_line(before, after), sight=sight)


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
    parser.add_argument("--allow-flag-change", action="store_true",
                        help="judge speed cells even where the two screenings' engine flags "
                             "differ (FLAGS DIFFER): the flag change is then what is measured")
    parser.add_argument("--allow-placement-change", action="store_true",
                        help="judge speed cells even where the two screenings placed their "
                             "replicas differently (PLACEMENT DIFFERS: both on one GPU, one "
                             "per GPU): the placement is then what is measured")
    parser.add_argument("--allow-topology-change", action="store_true",
                        help="judge speed cells even where the two runs' topologies differ "
                             "(TOPOLOGY DIFFERS: one LMCache server, or one per replica "
                             "over an L2, or another L2): the topology is then what is "
                             "measured")
    parser.add_argument("--allow-stack-change", action="store_true",
                        help="judge speed cells even where the two runs shared KV through "
                             "different stacks (STACK CHANGE: LMCache's MP server, its "
                             "in-process connector, vLLM's native offload): the stack is "
                             "then what is measured")
    parser.add_argument("--markdown", type=Path, metavar="OUT.md",
                        help="also write the report to this file (never BEFORE.json or "
                             "AFTER.json, under any name)")
    parser.add_argument("--force", action="store_true",
                        help="replace OUT.md if it exists")
    try:
        args = parser.parse_args(list(argv))
        markdown = None if args.markdown is None else Output(
            args.markdown, "--markdown", args.force,
            (("BEFORE.json", args.before), ("AFTER.json", args.after)))
        if markdown is not None:
            markdown.check()  # before any work: nothing is read only to be refused
        before, after = read_report(args.before), read_report(args.after)
        comparable(before, after)
        status, lines = compare(before, after, args.max_regression, args.allow_flag_change,
                                args.allow_placement_change, args.allow_topology_change,
                                args.allow_stack_change)
        text = "\n".join(lines) + "\n"
        if markdown is not None:
            markdown.write(text)
        to_stdout(text)
    except (CompareError, OutputError) as exc:
        sys.stderr.write(f"{PROG}: {exc}\n")
        return 2
    return status
