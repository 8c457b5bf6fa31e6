"""Engine flags: two screenings whose launched engines ran with different flags (CUDA
graphs or eager, a KV cache size, fp8, the user's own flags) time different things, so a
slower cell between them is not a regression of the software under test."""

from __future__ import annotations

import json
from typing import Any

from pytest_sharedkv.cli.compare.reading import Report

FLAGS_DIFFER = "FLAGS DIFFER"


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else repr(value)


def settings_of(report: Report) -> dict[str, Any] | None:
    """The perf screening's engine settings; None where it recorded none (an older report,
    external endpoints)."""
    if report.perf is None:
        return None
    return report.perf.run.engine_settings or None


def fact_settings(report: Report) -> dict[str, Any] | None:
    """The engine settings the other tiers recorded as facts ("engine_settings", one per
    launched pair), where they are the same for every pair; None where none were."""
    values = sorted({str(f["value"]) for f in report.data.get("facts", [])
                     if isinstance(f, dict) and f.get("name") == "engine_settings"
                     and isinstance(f.get("value"), str)})
    if not values:
        return None
    try:
        first = json.loads(values[0])
    except (ValueError, RecursionError):  # a string nested too deeply
        return None
    if len(values) > 1:  # pairs of one run that ran differently: say so, key by key
        return {"per pair": values}
    return first if isinstance(first, dict) else None


def flag_differences(before: Report, after: Report) -> list[str]:
    """One phrase per engine setting that differs ("enforce_eager: BEFORE True, AFTER
    False"); [] where both ran with the same (or neither recorded any). The perf
    screening's settings where both hold one; else the other tiers' facts, compared only
    where both reports recorded them (older reports did not)."""
    if before.perf is None or after.perf is None:
        fb, fa = fact_settings(before), fact_settings(after)
        if fb is None or fa is None:
            return []
        return [f"{key}: BEFORE {_show(fb.get(key))}, AFTER {_show(fa.get(key))}"
                for key in sorted(set(fb) | set(fa)) if fb.get(key) != fa.get(key)]
    b, a = settings_of(before), settings_of(after)
    if b is None and a is None:
        return []
    if b is None or a is None:
        which = "BEFORE" if b is None else "AFTER"
        return [f"engine settings: {which} recorded none (an older report or external "
                "endpoints), so its flags are unknown"]
    return [f"{key}: BEFORE {_show(b.get(key))}, AFTER {_show(a.get(key))}"
            for key in sorted(set(b) | set(a)) if b.get(key) != a.get(key)]
