"""The replica_pair tier's verdicts: per allocator, what the delayed byte check and the
delayed service check say together (no torch).

The transfer cells compare every byte B retrieves; the vllm cells compare answers. Under
an injected delay the first can fail while the second passes (a model's answer can survive
corrupted KV), and the summary says so, so nobody reads exact answers as integrity.
"""

from __future__ import annotations

from pytest_sharedkv.report.records import Check
from pytest_sharedkv.report.run_log import RunLog
from pytest_sharedkv.stack.lmcache_server import LAZY_REMEDY as REMEDY

TIER = "replica_pair"


def _cells(checks: list[Check], provider: str, allocator: str) -> dict[str, Check]:
    return {c.key.get("delay", "0"): c for c in checks
            if c.key.get("provider") == provider and c.key.get("allocator") == allocator}


def _rate(check: Check) -> str:
    return f"{check.passed}/{check.trials}"


def allocator_lines(checks: list[Check], allocator: str) -> list[str]:
    lines = []
    transfer = _cells(checks, "transfer (cuda)", allocator)
    served = _cells(checks, "vllm", allocator)
    control = transfer.get("0")
    for delay, cell in sorted(transfer.items()):
        if delay == "0" or control is None:
            continue
        if cell.status == "void":
            lines.append(f"VERDICT {allocator}: VOID at delay {delay} (the server never ran "
                         "the delay)")
        elif not control.ok:
            lines.append(f"VERDICT {allocator}: wrong bytes even without a delay "
                         f"({_rate(control)} pages right undelayed, {_rate(cell)} delayed)")
        elif cell.ok:
            lines.append(f"VERDICT {allocator}: stream-ordered ({_rate(cell)} KV pages right "
                         f"under a {delay}-cycle delay, {_rate(control)} undelayed)")
        else:
            lines.append(f"VERDICT {allocator}: NOT stream-ordered: under a {delay}-cycle "
                         f"delay {cell.trials - cell.passed} of {cell.trials} KV pages B "
                         f"retrieved hold wrong bytes ({_rate(control)} right undelayed); "
                         + REMEDY)
            answers = served.get(delay)
            if answers is not None and answers.ok:
                lines.append(
                    f"NOTE {allocator}: the served model's answers stayed exact "
                    f"({_rate(answers)}) under the same delay: at the service level it hides "
                    "the corrupted KV; exact answers after pool hits are not an integrity "
                    "check, the byte checks are")
    return lines


def summary_lines(log: RunLog) -> list[str]:
    checks = [c for c in log.bundle.checks if c.tier == TIER]
    allocators = sorted({c.key.get("allocator", "") for c in checks
                         if c.key.get("provider") == "transfer (cuda)"})
    return [line for a in allocators for line in allocator_lines(checks, a)]
