"""Engine flags: two screenings whose launched engines ran with different flags (CUDA
graphs or eager, a KV cache size, fp8, the user's own flags) time different things, so a
slower cell between them is not a regression of the software under test."""

from __future__ import annotations

import json
from typing import Any

from pytest_sharedkv.cli.compare.reading import Report


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else repr(value)


def settings_of(report: Report) -> dict[str, Any] | None:
    """The perf screening's engine settings; None where it recorded none (an older report,
    external endpoints)."""
    if report.perf is None:
        return None
    return report.perf.run.engine_settings or None


def flag_differences(before: Report, after: Report) -> list[str]:
    """One phrase per engine setting that differs ("enforce_eager: BEFORE True, AFTER
    False"); [] where both screenings ran with the same (or neither recorded any)."""
    b, a = settings_of(before), settings_of(after)
    if b is None and a is None:
        return []
    if b is None or a is None:
        which = "BEFORE" if b is None else "AFTER"
        return [f"engine settings: {which} recorded none (an older report or external "
                "endpoints), so its flags are unknown"]
    return [f"{key}: BEFORE {_show(b.get(key))}, AFTER {_show(a.get(key))}"
            for key in sorted(set(b) | set(a)) if b.get(key) != a.get(key)]
