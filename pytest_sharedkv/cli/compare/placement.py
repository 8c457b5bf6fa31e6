"""Replica placement: two screenings whose replicas ran on one GPU on one side (contending
for it) and one GPU each on the other time different things, so a slower cell between
them is not a regression of the software under test. Read from ``perf.replica_placement``,
else (reports written before it) from the run's ``--sharedkv-pair-gpus`` setting; a side
that recorded neither is unknown, and unknown is never called a difference (every report
before the setting was recorded would otherwise differ from every later one)."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_sharedkv.cli.compare.reading import Report, setting_of
from pytest_sharedkv.perf.observations import describe_placement

PLACEMENT_DIFFERS = "PLACEMENT DIFFERS"
RECORDED_FIELD = "perf.replica_placement.pair_gpus"
SETTING_FIELD = "environment.settings.pair_gpus"
LAUNCHED = "vllm"  # the provider whose engines the setting placed


@dataclass(frozen=True)
class Placement:
    pair_gpus: int  # the GPUs the two replicas ran on
    field: str  # where the report says so (RECORDED_FIELD or SETTING_FIELD)


def _setting(report: Report) -> int | None:
    value = setting_of(report, "pair_gpus")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    text = str(value).strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def placement_of(report: Report) -> Placement | None:
    """Where REPORT's screening ran its replicas; None where unknown: no screening, a
    screening of no launched engine (stub double, external endpoints: the setting placed
    nothing), or a report that recorded neither the placement nor the setting."""
    if report.perf is None:
        return None
    run = report.perf.run
    if run.replica_placement is not None:
        gpus = run.replica_placement.pair_gpus
        return None if gpus is None else Placement(gpus, RECORDED_FIELD)
    if run.engine.get("provider", LAUNCHED) != LAUNCHED:
        return None
    setting = _setting(report)
    return None if setting is None else Placement(setting, SETTING_FIELD)


def placement_difference(before: Report, after: Report) -> tuple[str, str] | None:
    """(BEFORE's placement, AFTER's) in words where both are known and differ, else None."""
    b, a = placement_of(before), placement_of(after)
    if b is None or a is None or b.pair_gpus == a.pair_gpus:
        return None
    return describe_placement(b.pair_gpus), describe_placement(a.pair_gpus)
