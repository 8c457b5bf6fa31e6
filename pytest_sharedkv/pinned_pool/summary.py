"""The pinned_pool tier's table: per route, what was asked, pinned, how fast (no torch)."""

from __future__ import annotations

from pytest_sharedkv.report.markdown import markdown_table
from pytest_sharedkv.report.records import Check
from pytest_sharedkv.report.run_log import RunLog

TIER = "pinned_pool"
OWN_ROUTE = "sharedkv-register"
GOAL_GIB_S = 9.0


def _gib(value: object) -> str:
    return f"{float(value) / (1 << 30):.2f}" if isinstance(value, (int, float)) else "?"


def row(check: Check) -> list[str]:
    d = check.detail
    ratio = d.get("ratio")
    rate = d.get("gib_per_s")
    seconds = d.get("seconds")
    return [
        check.key.get("route", ""), _gib(d.get("requested")), _gib(d.get("reserved")),
        f"{ratio:.3f}x" if isinstance(ratio, float) else "?",
        f"{seconds:.1f}" if isinstance(seconds, float) else "?",
        f"{rate:.1f}" if isinstance(rate, float) else "?",
        f"{d.get('pinned')}/{d.get('checked')}",
        "ok" if check.ok else "FAIL",
    ]


def summary_lines(log: RunLog) -> list[str]:
    checks = [c for c in log.bundle.checks if c.tier == TIER and "requested" in c.detail]
    if not checks:
        return []
    header = ["route", "asked GiB", "reserved GiB", "reserved/asked", "seconds", "GiB/s",
              "pinned samples", "result"]
    lines = markdown_table(header, [row(c) for c in checks])
    for c in checks:
        if not c.ok:
            lines.append(f"{c.key.get('route')}: {c.message}")
    lines.extend(speed_findings(checks))
    return lines


def speed_findings(checks: list[Check]) -> list[str]:
    """Each route's pinning rate against the suite's own route at the same size."""
    own = {c.key.get("size"): c.detail.get("gib_per_s") for c in checks
           if c.key.get("route") == OWN_ROUTE and isinstance(c.detail.get("gib_per_s"), float)}
    lines = []
    for size, rate in own.items():
        assert isinstance(rate, float)
        goal = "meets" if rate >= GOAL_GIB_S else "MISSES"
        lines.append(f"{OWN_ROUTE} pinned {size} at {rate:.1f} GiB/s ({goal} the "
                     f"{GOAL_GIB_S:g} GiB/s goal)")
        for c in checks:
            other = c.detail.get("gib_per_s")
            if c.key.get("size") != size or c.key.get("route") == OWN_ROUTE:
                continue
            if isinstance(other, float) and other < rate:
                lines.append(f"finding: {c.key.get('route')} pins at {other:.1f} GiB/s, "
                             f"{other / rate:.2f}x the suite's own route")
    return lines
