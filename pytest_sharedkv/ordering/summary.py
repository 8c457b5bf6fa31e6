"""The ordering tier's lines under its table: sensitivity, one verdict per target, speed.

Works on the records the controller gathered from every worker (no torch here).
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_sharedkv.host.cuda_check import LAUNCH_BLOCKING_ENV
from pytest_sharedkv.ordering.targets import REFERENCE_REASON, remedy_lines
from pytest_sharedkv.report.records import Check
from pytest_sharedkv.report.run_log import RunLog

TIER = "ordering"


def _tally(checks: Sequence[Check]) -> tuple[int, int]:
    return sum(c.passed for c in checks), sum(c.trials for c in checks)


def _delayed(checks: Sequence[Check]) -> list[Check]:
    return [c for c in checks if int(c.detail.get("delay_cycles", 0)) > 0]


def _undelayed(checks: Sequence[Check]) -> list[Check]:
    return [c for c in checks if int(c.detail.get("delay_cycles", 0)) == 0]


def sensitivity_line(checks: Sequence[Check]) -> tuple[bool, str]:
    negative = [c for c in checks if c.role == "negative-control"]
    delayed = _delayed(negative)
    if not delayed:
        return False, ("WARNING: the negative control did not run under delay, so nothing shows "
                       "the probe can see an ordering fault: treat every result as VOID")
    name = delayed[0].key.get("target", "negative control")
    passed, total = _tally(delayed)
    up, ut = _tally(_undelayed(negative))
    hidden = f"; {up}/{ut} undelayed checks held" if ut else ""
    if passed == 0:
        return True, (f"probe sensitivity: {name} saw stale bytes in {total}/{total} delayed "
                      f"checks{hidden}: the probe can see ordering faults")
    if any(c.detail.get("launch_blocking") for c in delayed):
        why = (f"{LAUNCH_BLOCKING_ENV} was set where the probe ran, so every launch was "
               f"synchronous: unset it for the ordering tier")
    else:
        why = "raise --sharedkv-delay-cycles; check the probe stream is non-blocking"
    return False, (f"WARNING: probe NOT sensitive: {name} saw stale bytes in only "
                   f"{total - passed}/{total} delayed checks; every result of this run is VOID "
                   f"({why})")


def compiled_proof(checks: Sequence[Check], package: str) -> list[str]:
    """Targets of this run whose copies went through PACKAGE's bound compiled kernels (not
    a fallback reference) and held every check, delayed and undelayed: what makes the
    compiled build a PROVEN remedy rather than a suggestion."""
    proof = []
    targets = list(dict.fromkeys(c.key.get("target", "") for c in checks))
    for target in targets:
        mine = [c for c in checks if c.key.get("target") == target]
        first = mine[0].detail
        if (first.get("compiled_for") == package and first.get("kernel_path") == "compiled"
                and not first.get("reference") and _delayed(mine) and _undelayed(mine)
                and all(c.ok and c.detail.get("sensitive", True) for c in mine)):
            proof.append(target)
    return proof


def verdict_lines(checks: Sequence[Check], sensitive: bool = True) -> list[str]:
    lines: list[str] = []
    targets = list(dict.fromkeys(c.key.get("target", "") for c in checks))
    for target in targets:
        mine = [c for c in checks if c.key.get("target") == target]
        role = mine[0].role
        if role == "negative-control":
            continue
        dp, dt = _tally(_delayed(mine))
        up, ut = _tally(_undelayed(mine))
        description = str(mine[0].detail.get("description", ""))
        missing = next((c.detail for c in mine if c.detail.get("missing")), None)
        if missing is not None:
            verdict = (f"VOID (this LMCache release has no {missing['missing']}; looked in: "
                       f"{'; '.join(missing.get('tried', []))})")
        elif not sensitive:
            verdict = (f"VOID (the probe is not sensitive; {dp}/{dt} delayed and {up}/{ut} "
                       "undelayed checks held, which proves nothing)")
        elif dp == dt and up == ut:
            verdict = (f"stream-ordered ({dp}/{dt} delayed and {up}/{ut} undelayed checks held)")
        else:
            parts = []
            if dp < dt:
                parts.append(f"{dt - dp}/{dt} delayed checks saw stale bytes")
            if up < ut:
                parts.append(f"{ut - up}/{ut} undelayed checks saw stale bytes")
            verdict = "NOT stream-ordered: " + ", ".join(parts)
            if role == "control":
                verdict = "CONTROL FAILED (probe or platform broken): " + ", ".join(parts)
        detail = mine[0].detail
        reference = bool(detail.get("reference"))
        tag = f"{role}; reference, not the path under test" if reference else role
        lines.append(f"VERDICT {target} [{tag}]: {verdict}")
        lines.append(f"    {description}")
        if reference:
            lines.append(f"    xfail: {REFERENCE_REASON} ({detail.get('kernel_module')}); "
                         "its fault is shown, and does not fail the run")
        if sensitive and missing is None and (dp < dt or up < ut):
            package = str(detail.get("compiled_for", ""))
            proof = compiled_proof(checks, package) if package else []
            for remedy in remedy_lines(str(detail.get("remedy", "")), package, reference,
                                       str(detail.get("kernel_path", "")),
                                       str(detail.get("kernel_module", "")), proof):
                lines.append(f"    {remedy}")
    return lines


def speed_line(log: RunLog, checks: Sequence[Check]) -> str:
    wall = sum(r.duration for r in log.tests.values() if r.tier == TIER)
    trials = sum(c.trials for c in checks)
    floor = sum(float(c.detail.get("imposed_delay_s", 0.0)) for c in checks)
    rate = f"{trials / wall:.0f} checks/s" if wall > 0 else "n/a"
    ratio = f"{wall / floor:.2f}" if floor > 0 else "n/a"
    return (f"speed: {trials} checks in {wall:.1f} s of ordering test time = {rate}; imposed "
            f"delays sum to {floor:.1f} s (the floor); time/floor = {ratio}")


def summary_lines(log: RunLog) -> list[str]:
    checks = [c for c in log.bundle.checks if c.tier == TIER]
    if not checks:
        return []
    lines = []
    if any(c.detail.get("simulated") for c in checks):
        lines.append("SIMULATED STREAMS (test double): these rows check the harness; "
                     "they are not GPU results")
    sensitive, sensitivity = sensitivity_line(checks)
    lines.append(sensitivity)
    lines.extend(verdict_lines(checks, sensitive))
    lines.append(speed_line(log, checks))
    return lines
