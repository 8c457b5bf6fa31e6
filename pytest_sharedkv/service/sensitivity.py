"""The service tier's negative control: proof, in every launched run, that the served model
sees corrupted KV. Without it an exact answer after a pool hit proves nothing.

Control requests answer cold on A; then, while the control file tells the LMCache server's
hook (``replicas/corrupt_hook.py``) to zero one chunk of every retrieve, B answers them
from the pool. The answers that copy from the zeroed chunk must change and the others must
not. If the hook never ran, or nothing changed, every result of the tier is VOID, with the
reason. With external endpoints nothing can be injected: sensitivity is unproven, and the
report says so.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_sharedkv.service.runner import Runner, Step

PROVEN, VOID, UNPROVEN = "proven", "VOID", "unproven"


@dataclass
class GateResult:
    status: str
    message: str
    zeroed_chunk: int | None = None
    copying: int = 0  # control requests that copy from the zeroed chunk
    changed: int = 0  # ... whose answer changed (must be all)
    others: int = 0  # control requests that copy from other chunks
    others_exact: int = 0  # ... whose answer stayed exact (should be all)
    zeroed_chunks_logged: int = 0
    details: list[dict[str, Any]] = field(default_factory=list)

    @property
    def void(self) -> bool:
        return self.status == VOID


def run_gate(runner: Runner, control: Path | None, log: Path | None) -> GateResult:
    from pytest_sharedkv.replicas.corrupt_hook import read_log
    from pytest_sharedkv.service.checks import diverged

    cases = runner.cases
    controls = cases.by_role("control")
    if control is None:
        return GateResult(UNPROVEN, "sensitivity unproven: the replicas are external "
                          "endpoints, so no corruption can be injected; exact answers from "
                          "them prove integrity only as far as the served model can see "
                          "corrupted KV")
    if not controls or cases.zeroed_chunk is None:
        return GateResult(UNPROVEN, "sensitivity unproven: this corpus has no control "
                          "requests")
    zeroed = cases.zeroed_chunk
    runner.step("gate", Step("cold", "A", "none"), controls)
    time.sleep(runner.settle_for(controls))
    control.write_text(json.dumps({"zero_chunks": [zeroed]}))
    try:
        runner.step("gate", Step("cross", "B", "external"), controls)
    finally:
        control.unlink(missing_ok=True)
    logged = [row for row in (read_log(log) if log is not None else []) if row[1] == zeroed]
    result = GateResult("", "", zeroed, zeroed_chunks_logged=len(logged))
    broken = []
    for case in controls:
        cold = runner.run.answer(case.id, "cold")
        cross = runner.run.answer(case.id, "cross")
        if cold is None or cross is None or cold.error or cross.error:
            broken.append(case.id)
            result.details.append({"case": case.id, "expected": list(case.expected or ()),
                                   "cold": cold.to_data() if cold else None,
                                   "cross": cross.to_data() if cross else None})
            continue
        # against the answer by construction (copy corpus) or A's cold answer (text corpus)
        right_cold = diverged(runner.run, case, cold) is None
        changed = diverged(runner.run, case, cross) is not None
        if not right_cold:
            broken.append(case.id)
        if case.source_chunk == zeroed:
            result.copying += 1
            result.changed += changed
        else:
            result.others += 1
            result.others_exact += not changed
        result.details.append({"case": case.id, "source_chunk": case.source_chunk,
                               "cold_exact": right_cold, "changed": changed,
                               "expected": list(case.expected or ()),
                               "cold": cold.to_data(), "cross": cross.to_data()})
    where = f"chunk {zeroed} zeroed in every retrieve"
    if broken:
        result.status, result.message = VOID, (
            f"VOID: the sensitivity gate's control requests {broken} failed before any "
            "corruption (cold answers wrong or errors): the model or engine is broken here")
    elif not logged:
        result.status, result.message = VOID, (
            "VOID: the sensitivity gate's hook never zeroed a chunk in the LMCache server "
            "(no log line): the wrapped entry point "
            "(corrupt_hook.TARGETS) is not what this LMCache version calls, so no result "
            "of this tier shows the model can see corrupted KV")
    elif result.changed < result.copying:
        result.status, result.message = VOID, (
            f"VOID: with {where}, only {result.changed} of {result.copying} answers that copy "
            "from it changed: the served model does not see a lost chunk, so exact answers "
            "prove nothing; serve a model that copies from its context (the copy model)")
    else:
        result.status = PROVEN
        result.message = (f"sensitivity proven: with {where}, {result.changed}/"
                          f"{result.copying} answers that copy from it changed and "
                          f"{result.others_exact}/{result.others} others stayed exact")
        if result.others_exact < result.others:
            result.message += (" (some answers from intact chunks changed too: the "
                               "corruption reached beyond the zeroed chunk)")
    return result
