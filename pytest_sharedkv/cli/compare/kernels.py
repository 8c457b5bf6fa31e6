"""LMCache's kernel path in two reports: an upgrade that loses the compiled kernels (a wheel
built for another torch falls back to torch copies, with one warning) is a finding, even
where every answer stayed right, because the fallback is the path whose copies are not
stream-ordered. Read from ``environment.lmcache``; a report without it says unknown."""

from __future__ import annotations

from typing import Any

from pytest_sharedkv.cli.compare.finding import Finding, Found
from pytest_sharedkv.cli.compare.reading import Report, environment_of

COMPILED = "compiled"


def lmcache_of(report: Report) -> dict[str, Any] | None:
    lmcache = environment_of(report, "lmcache")
    return lmcache if isinstance(lmcache, dict) else None


def kernel_words(lmcache: dict[str, Any]) -> str:
    """The kernel path, with the compiled extension's name or why there is none."""
    path = str(lmcache.get("kernel_path", "unknown"))
    module = f" ({lmcache['kernel_module']})" if path == COMPILED and lmcache.get(
        "kernel_module") else ""
    why = f": {str(lmcache['why'])[:160]}" if path != COMPILED and lmcache.get("why") else ""
    return f"{path}{module}{why}"


def describe(lmcache: dict[str, Any] | None) -> str:
    if lmcache is None:
        return "unknown (the report predates environment.lmcache)"
    return f"LMCache {lmcache.get('version') or '?'} on {kernel_words(lmcache)}"


def kernel_line(before: Report, after: Report) -> str:
    return (f"- LMCache: BEFORE {describe(lmcache_of(before))}; AFTER "
            f"{describe(lmcache_of(after))}")


def lost_kernels(before: Report, after: Report) -> list[Finding]:
    """A finding where BEFORE ran the compiled kernels and AFTER, known, does not."""
    b, a = lmcache_of(before), lmcache_of(after)
    if b is None or a is None or b.get("kernel_path") != COMPILED \
            or a.get("kernel_path") == COMPILED:
        return []
    return [Finding(Found.KERNEL_PATH_LOST, f"LMCache {b.get('version')} -> {a.get('version')}",
                    f"BEFORE ran LMCache's compiled kernels ({b.get('kernel_module')}); "
                    f"AFTER runs {kernel_words(a)}")]
