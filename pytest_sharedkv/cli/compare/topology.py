"""Where the pair's KV lived between its replicas: one LMCache server both used (shared)
or one server per replica sharing only an L2 (hosts, over a named L2). Two reports of
different topologies, or of the hosts topology over different L2s, time different paths
(an L2 read against an L1 hit), so a slower cell between them is not a regression of the
software under test: TOPOLOGY DIFFERS, as PLACEMENT DIFFERS, keeps speed from being
judged; correctness is compared as always. Read from ``environment.settings`` (topology,
l2); a report that recorded settings but not the topology predates the option and ran the
shared topology; one without settings is unknown, and unknown is never a difference."""

from __future__ import annotations

from pytest_sharedkv.cli.compare.reading import Report, environment_of, setting_of

TOPOLOGY_DIFFERS = "TOPOLOGY DIFFERS"


def topology_of(report: Report) -> str | None:
    """REPORT's topology in words ('shared', 'hosts over L2 fs'); None where unknown."""
    if not isinstance(environment_of(report, "settings"), dict):
        return None
    topology = setting_of(report, "topology")
    if topology is None or topology == "shared":
        return "shared"
    l2 = setting_of(report, "l2")
    return f"{topology} over L2 {l2 if l2 is not None else 'unknown'}"


def topology_difference(before: Report, after: Report) -> tuple[str, str] | None:
    """(BEFORE's topology, AFTER's) where both are known and differ, else None."""
    b, a = topology_of(before), topology_of(after)
    if b is None or a is None or b == a:
        return None
    return b, a
