"""The report given with ``--sharedkv-baseline``: an earlier run whose exact pairs can prove
a remedy this run names (LMCache's compiled kernels where this run is on the fallback, the
other allocator), read from its records' kind and status and its ``environment.lmcache``.

Read once, before any test: a file that is not a sharedkv JSON report is a usage error
naming the option and the file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_sharedkv.report.records import Check

TIER = "service_regression"
# the record sizes that are not step totals (the summary's too)
NOT_STEPS = ("gate", "session", "protocol", "model", "audit", "triage", "catalogue")


class BaselineError(ValueError):
    """A baseline that cannot be read; the message names the file and what is wrong."""


@dataclass(frozen=True)
class BaselinePair:
    """One service pair of the baseline: its cross-replica answers and whether every one
    of its step, request, audit and gate records held."""

    allocator: str
    cross_exact: int
    cross_total: int
    clean: bool

    @property
    def exact(self) -> bool:
        return self.clean and self.cross_total > 0 and self.cross_exact == self.cross_total


@dataclass(frozen=True)
class Baseline:
    path: str
    lmcache_version: str | None
    kernel_path: str  # compiled | torch-fallback | unknown | not-installed | not-checked
    kernel_module: str | None
    pairs: tuple[BaselinePair, ...]

    def pair(self, allocator: str) -> BaselinePair | None:
        return next((p for p in self.pairs if p.allocator == allocator), None)

    def describe(self) -> str:
        module = f" ({self.kernel_module})" if self.kernel_module else ""
        return (f"{Path(self.path).name}: LMCache {self.lmcache_version or '?'} on "
                f"{self.kernel_path}{module}")


def exact_pair(checks: Sequence[Check], allocator: str) -> tuple[int, int] | None:
    """(exact, total) cross-replica answers of the ALLOCATOR pair where it proves something:
    its gate record passed and every one of its judged records (model and triage aside)
    has status pass; else None. The one rule for this run's pairs and a baseline's."""
    mine = [c for c in checks if c.tier == TIER and c.key.get("allocator") == allocator
            and c.key.get("size") not in ("model", "triage") and c.status != "info"]
    cross = _cross(mine, allocator)
    gate = next((c for c in mine if c.key.get("size") == "gate"), None)
    if not cross or gate is None or not all(c.status == "pass" for c in mine):
        return None
    return sum(c.passed for c in cross), sum(c.trials for c in cross)


def _cross(checks: Sequence[Check], allocator: str) -> list[Check]:
    """The ALLOCATOR pair's cross-replica step totals (warm-ups aside)."""
    return [c for c in checks if c.key.get("allocator") == allocator
            and c.key.get("step") == "cross"
            and c.key.get("size") not in (*NOT_STEPS, "warm-up")]


def _check(record: Any) -> Check | None:
    """A report's check record as a Check; None where it is not one of this tier's. A
    record of this tier that does not read back counts as a failed one, never a pass."""
    if not isinstance(record, dict) or record.get("tier") != TIER or not isinstance(
            record.get("key"), dict):
        return None
    key = {str(k): str(v) for k, v in record["key"].items()}
    try:
        return Check(TIER, key, int(record.get("passed", 0)), int(record.get("trials", 0)),
                     kind=str(record.get("kind", "check")), status=str(record.get("status", "")))
    except (TypeError, ValueError):
        return Check(TIER, key, 0, 1, kind="check", status="fail")


def _pairs(records: list[Any]) -> tuple[BaselinePair, ...]:
    checks = [c for c in map(_check, records) if c is not None]
    pairs = []
    for allocator in dict.fromkeys(c.key.get("allocator", "") for c in checks
                                   if c.key.get("size") != "model"):
        exact = exact_pair(checks, allocator)
        cross = _cross(checks, allocator)
        pairs.append(BaselinePair(allocator, sum(c.passed for c in cross),
                                  sum(c.trials for c in cross), clean=exact is not None))
    return tuple(pairs)


def read_baseline(path: Path) -> Baseline:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BaselineError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"{path}: cannot be read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise BaselineError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except RecursionError:
        raise BaselineError(f"{path}: not a sharedkv JSON report (nested too deeply to "
                            "read)") from None
    if not isinstance(data, dict) or not str(data.get("schema", "")).startswith(
            "pytest-sharedkv/"):
        raise BaselineError(f"{path}: not a sharedkv JSON report (no pytest-sharedkv schema; "
                            "write one with --sharedkv-json)")
    environment = data.get("environment")
    environment = environment if isinstance(environment, dict) else {}
    lmcache = environment.get("lmcache")
    lmcache = lmcache if isinstance(lmcache, dict) else {}
    checks = data.get("checks")
    if not isinstance(checks, list):
        raise BaselineError(f"{path}: its checks are not a list")
    pairs = _pairs(checks)
    if not pairs:
        raise BaselineError(f"{path}: holds no service_regression pair (run it with "
                            "-m service_regression)")
    return Baseline(str(path), lmcache.get("version"),
                    str(lmcache.get("kernel_path") or "unknown (an older report: no "
                        "environment.lmcache)"),
                    lmcache.get("kernel_module"), pairs)


def remedies(baseline: Baseline | None, allocator: str, kernel_path: str | None
             ) -> list[str]:
    """What BASELINE proves for a diverging ALLOCATOR pair of a run on KERNEL_PATH."""
    if baseline is None:
        return []
    found = []
    mine = baseline.pair(allocator)
    if (mine is not None and mine.exact and baseline.kernel_path == "compiled"
            and kernel_path != "compiled"):
        found.append(f"run LMCache's compiled kernels, a build that loads against this "
                     f"torch (proven by the baseline {baseline.describe()}: the {allocator} "
                     f"pair answered {mine.cross_exact}/{mine.cross_total} cross-replica "
                     "requests exact)")
    other = {"lazy": "mixed", "mixed": "lazy"}.get(allocator)
    theirs = baseline.pair(other) if other else None
    if theirs is not None and theirs.exact and baseline.kernel_path == kernel_path:
        flag = "--no-l1-use-lazy" if other == "mixed" else "--l1-use-lazy"
        found.append(f"start the LMCache server with {flag} (proven by the baseline "
                     f"{baseline.describe()}: the {other} pair answered "
                     f"{theirs.cross_exact}/{theirs.cross_total} exact)")
    return found
