"""The identity tier's VERDICT line, from the records' kinds and statuses (never their
words): a hit across tenants first, as an isolation breach whatever the answers; then a
hit across identities that answered wrong, naming the dimension and the stack; then
what was proven, what proved nothing, and the GPU stacks' table still to run."""

from __future__ import annotations

from pytest_sharedkv.report.records import Check, Kind, Status
from pytest_sharedkv.report.run_log import RunLog

TIER = "identity"


def _where(check: Check) -> str:
    direction = check.key.get("direction")
    return (f"{check.key.get('dimension')} on {check.key.get('stack')}"
            + (f" ({direction})" if direction else ""))


def verdict_lines(checks: list[Check]) -> list[str]:
    if not checks:
        return []
    breaches = [c for c in checks if c.kind is Kind.ISOLATION and c.status is Status.FAIL]
    wrong = [c for c in checks if c.kind is Kind.IDENTITY and c.status is Status.FAIL]
    other_fail = [c for c in checks if c.status is Status.FAIL
                  and c not in breaches and c not in wrong]
    void = [c for c in checks if c.status in (Status.VOID, Status.UNKNOWN)]
    pairs = {(c.key.get("stack"), c.key.get("dimension"), c.key.get("direction"))
             for c in checks}
    lines = []
    if breaches:
        lines.append("VERDICT identity: ISOLATION BREACH: a hit across tenants (cache_salt) "
                      "in " + ", ".join(sorted({_where(c) for c in breaches}))
                      + ": a security failure whatever the answers; the key must carry the "
                      "salt (LMCache #4825 / vLLM #53495's class)")
    if wrong:
        lines.append("VERDICT identity: WRONG KV ACROSS IDENTITIES: "
                     + ", ".join(sorted({_where(c) for c in wrong}))
                     + " hit KV another identity wrote and answered wrong; the key must "
                     "carry that dimension")
    if other_fail:
        lines.append("VERDICT identity: FAILED: " + ", ".join(sorted({_where(c)
                                                                     for c in other_fail})))
    if void:
        lines.append("VERDICT identity: VOID: " + ", ".join(sorted({_where(c) for c in void}))
                     + " (the same identity did not hit, so a miss proves nothing)")
    if not lines:
        lines.append(f"VERDICT identity: {len(pairs)} pair(s) proven: the same identity hit "
                     "and another did not, or answered exactly")
    return lines


def release_lines(checks: list[Check]) -> list[str]:
    """Each two-release direction's verdict (keys found and bytes exact / keys refused /
    wrong bytes served), from the other side's record, with the releases it ran."""
    lines = []
    for c in checks:
        word = c.detail.get("direction_verdict")
        if not word or c.key.get("side") != "other":
            continue
        servers = c.detail.get("servers") or {}
        releases = " / ".join(sorted({v.split(",")[0] for v in servers.values()}))
        lines.append(f"RELEASE {c.key.get('direction')}: {word}"
                     + (f" ({releases}, one fs L2)" if releases else "")
                     + ("" if c.status is Status.PASS else f" [{c.status}]"))
    return lines


def gpu_lines(checks: list[Check]) -> list[str]:
    """The GPU stacks' rows of the same table, said where the CPU ones ran."""
    from pytest_sharedkv.identity.table import NOT_BUILT, IdentityStack

    if not checks:
        return []
    gpu = ", ".join(str(s) for s in IdentityStack if s.gpu)
    return [f"TABLE {gpu}: the same dimensions, not collected here: {NOT_BUILT}"]


def summary_lines(log: RunLog) -> list[str]:
    checks = [c for c in log.bundle.checks if c.tier == TIER]
    return verdict_lines(checks) + release_lines(checks) + gpu_lines(checks)
