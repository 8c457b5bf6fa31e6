"""The service tier's summary: per pair, a table of size x step (exact answers, cached
tokens, the engines' own and pool hit counters, wall time) and one VERDICT line.

A pair whose sensitivity gate is VOID or CONFOUNDED gets VOID unless answers diverged (then
the divergences stand and the exact answers are said to prove nothing); external endpoints
get "sensitivity unproven"; otherwise the verdict counts the requests that diverged after
cross-replica hits. A remedy is said as proven only where a run proved it: a triage cell of
this run (``--sharedkv-triage``), the other allocator's exact pair in this run, or the
report given with ``--sharedkv-baseline``; otherwise it is a suggestion, said as one.
"""

from __future__ import annotations

from pytest_sharedkv.report.markdown import markdown_table
from pytest_sharedkv.report.records import Check
from pytest_sharedkv.report.run_log import RunLog
from pytest_sharedkv.service.baseline import NOT_STEPS, Baseline, exact_pair, remedies
from pytest_sharedkv.service.triage import (
    ALLOCATOR_REMEDY,
    OTHER_ALLOCATOR,
    proven_line,
    suggestion_line,
)

TIER = "service_regression"
PAIR_KEYS = ("provider", "allocator", "delay")
SUGGESTION = ("suggestion (not proven by this run; --sharedkv-triage or --sharedkv-baseline "
              "REPORT would test it): start the LMCache server with --no-l1-use-lazy, or run "
              "LMCache's compiled kernels (a build that loads against this torch)")


def _pair(check: Check) -> tuple[str, ...]:
    return tuple(check.key.get(k, "") for k in PAIR_KEYS)


def _n(value: object) -> str:
    return "-" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def table(checks: list[Check]) -> list[str]:
    rows = []
    for c in _steps(checks, warmups=True):
        d = c.detail
        rows.append([*_pair(c), c.key.get("size", ""), c.key.get("step", ""),
                     str(d.get("replica", "")), f"{c.passed}/{c.trials}", _n(d.get("cached")),
                     _n(d.get("local")), _n(d.get("external")), _n(d.get("wall_s"))])
    if not rows:
        return []
    return markdown_table([*PAIR_KEYS, "size", "step", "replica", "exact", "cached tokens",
                           "own-cache hits", "pool hits", "wall s"], rows)


def _steps(checks: list[Check], warmups: bool = False) -> list[Check]:
    """The step-total records (a failed request's own record has step "chain")."""
    return [c for c in checks if c.key.get("size") not in NOT_STEPS
            and c.key.get("step") != "chain" and (warmups or c.key.get("size") != "warm-up")]


def _tally(checks: list[Check], size: str) -> str:
    group = [c for c in checks if c.key.get("size") == size]
    if not group:
        return ""
    return f"{sum(c.passed for c in group)}/{sum(c.trials for c in group)}"


def remedy_line(checks: list[Check], allocator: str, baseline: Baseline | None = None,
                kernel_path: str | None = None) -> str:
    """The remedy for a diverging ALLOCATOR pair: every one a run proved, else the
    suggestion (said as one)."""
    removing = [c for c in checks if c.key.get("size") == "triage"  # cells that removed it
                and c.key.get("allocator") == allocator and c.status == "pass"]
    proven = [proven_line(str(c.detail["remedy"]), str(c.key.get("step")), c.passed,
                          c.trials, c.detail.get("mismatches"))
              for c in removing if c.detail.get("remedy")]
    other = OTHER_ALLOCATOR.get(allocator)
    exact = exact_pair(checks, other) if other else None
    if other and exact is not None and exact[0] == exact[1]:
        proven.append(f"{ALLOCATOR_REMEDY[other]} (proven in this run: the {other} pair "
                      f"answered {exact[0]}/{exact[1]} cross-replica requests exact)")
    proven += remedies(baseline, allocator, kernel_path)
    suggested = [suggestion_line(str(c.detail["suggestion"]), str(c.key.get("step")))
                 for c in removing if c.detail.get("suggestion")]
    also = ("; suggestion (not a proven remedy): " + "; or ".join(suggested)
            if suggested else "")
    if proven:
        return "remedy: " + "; or ".join(dict.fromkeys(proven)) + also
    if suggested:
        return also.removeprefix("; ")
    return SUGGESTION if allocator == "lazy" else ("suggestion: --sharedkv-triage re-runs "
                                                   "this pair under controls")


def triage_table(checks: list[Check]) -> list[str]:
    rows = [[str(c.key.get("allocator", "")), str(c.key.get("step", "")),
             str(c.detail.get("control", "")), str(c.detail.get("group", "")),
             f"{c.passed}/{c.trials}", _n(c.detail.get("mismatches")),
             {"pass": "removed", "fail": "persists", "info": "n/a"}.get(c.status, "unknown"),
             _n(c.detail.get("wall_s"))]
            for c in checks if c.key.get("size") == "triage"]
    if not rows:
        return []
    return ["triage: the diverging size group again under each control (its own cell, "
            "KV audit on):",
            *markdown_table(["allocator", "cell", "control", "group", "exact",
                             "mismatching digests", "fault", "wall s"], rows)]


def verdicts(checks: list[Check], baseline: Baseline | None = None,
             kernel_path: str | None = None) -> list[str]:
    lines = []
    for pair in dict.fromkeys(_pair(c) for c in checks if c.key.get("size") != "model"):
        mine = [c for c in checks if _pair(c) == pair]
        name = pair[1] if pair[1] not in ("", "n/a", "unknown") else pair[0]
        gate = next((c for c in mine if c.key.get("size") == "gate"), None)
        steps = _steps(mine)
        cross = [c for c in steps if c.key.get("step") == "cross"]
        total = sum(c.trials for c in cross)
        wrong = sum(c.trials - c.passed for c in cross)
        chains = [c for c in mine if c.key.get("step") == "chain"]
        all_ok = all(c.ok for c in steps) and not chains
        sessions, protocol = _tally(mine, "session"), _tally(mine, "protocol")
        extra = ", ".join(x for x in (f"sessions {sessions} turns" if sessions else "",
                                      f"protocol {protocol}" if protocol else "") if x)
        status = gate.status if gate is not None else None
        void = gate if gate is not None and status in ("void", "confounded") else None
        if void is not None and not wrong:
            lines.append(f"VERDICT {name}: VOID: {void.message.removeprefix('VOID: ')}")
            continue
        if gate is not None and status == "unproven":
            lines.append(f"NOTE {name}: {gate.message}")
        elif gate is not None and void is None:
            lines.append(f"GATE {name}: {gate.message}")
        if not steps:
            continue
        if all_ok:
            lines.append(f"VERDICT {name}: {total}/{total} requests exact in every step (cold, "
                         f"local, cross-replica, receiver-local), hits as expected"
                         + (f"; {extra}" if extra else ""))
        elif wrong:  # under a VOID or CONFOUNDED gate the divergences stand all the same
            remedy = f"; {remedy_line(checks, pair[1], baseline, kernel_path)}" \
                if pair[0] == "vllm" else ""
            voids = (f"; the {total - wrong} exact answers prove nothing: {void.message}"
                     if void is not None else "")
            lines.append(f"VERDICT {name}: {wrong} of {total} requests answered wrong after "
                         "cross-replica pool hits (HTTP 200, the prompt served from the pool)"
                         + remedy + voids)
        else:
            bad = [f"{c.key.get('size')} {c.key.get('step')}" for c in steps
                   if c.status == "fail"]
            lines.append(f"VERDICT {name}: {total}/{total} answers exact after cross-replica "
                         f"hits, but {len(chains)} request chains failed their hit accounting"
                         + (f" ({', '.join(bad)})" if bad else "")
                         + (f"; {extra}" if extra else ""))
    return lines


def model_table(checks: list[Check]) -> list[str]:
    """The copy model's corruption matrix (CPU): answers changed, as they must or not."""
    rows = [[c.key.get("step", ""), f"{c.detail.get('changed')}/{c.trials}",
             str(c.detail.get("must", "")), "yes" if c.ok else "NO",
             str(c.detail.get("min_margin_nats", ""))]
            for c in checks if c.key.get("size") == "model"]
    if not rows:
        return []
    return ["the served model's corruption matrix (copy model, transformers on CPU):",
            *markdown_table(["corruption", "answers changed", "must", "as constructed",
                             "min margin (nats)"], rows)]


def summary_lines(log: RunLog, baseline: Baseline | None = None,
                  kernel_path: str | None = None) -> list[str]:
    checks = [c for c in log.bundle.checks if c.tier == TIER]
    lines: list[str] = []  # the triage's verdict is a note: the summary shows notes first
    for block in (model_table(checks), table(checks), triage_table(checks),
                  verdicts(checks, baseline, kernel_path)):
        if block:
            lines += ([""] if lines else []) + block
    return lines
