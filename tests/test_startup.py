"""Plugin start-up must add at most 0.5 s to a run that selects no GPU test."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

BUDGET_S = 0.5
ROUNDS = 5


def _wall(args: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                   cwd=cwd, check=True, capture_output=True, timeout=120)
    return time.perf_counter() - started


def test_startup_overhead(tmp_path: Path, record_property: Callable[[str, object], None]) -> None:
    (tmp_path / "test_plain.py").write_text("def test_x():\n    pass\n")
    with_plugin: list[float] = []
    without: list[float] = []
    for _ in range(ROUNDS):  # interleaved, so machine noise hits both alike
        without.append(_wall(["-p", "no:sharedkv"], tmp_path))
        with_plugin.append(_wall([], tmp_path))
    overhead = min(with_plugin) - min(without)
    record_property("sharedkv_startup_overhead_s", round(overhead, 3))
    print(f"\nplugin start-up overhead: {overhead * 1000:.0f} ms "
          f"(best of {ROUNDS}: {min(with_plugin):.3f}s with, {min(without):.3f}s without)")
    assert overhead < BUDGET_S
