"""The self-tests' matrix cache belongs to one run: a second run, here or anywhere on the
machine, computes its own matrices instead of reading what an earlier run (other code,
another checkout) left behind."""

from __future__ import annotations

import pytest

FIRST_IN_ITS_RUN = """
import os
from pathlib import Path

def test_cache_starts_empty():
    cache = Path(os.environ["SHAREDKV_MATRIX_CACHE"])
    seen = sorted(p.name for p in cache.glob("*")) if cache.exists() else []
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "copy-matrix-left-by-an-earlier-run.json").write_text("[]")
    assert seen == [], f"a new run found {seen}"
"""


def test_a_second_run_does_not_see_the_first_runs_matrices(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(FIRST_IN_ITS_RUN)
    for run in ("first", "second"):  # the same --basetemp, as two runs on one machine share
        result = pytester.runpytest("-p", "tests.conftest", "-p", "no:cacheprovider")
        assert result.ret == 0, f"{run} run: {result.stdout.str()[-1500:]}"
