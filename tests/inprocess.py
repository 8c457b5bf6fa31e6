"""An inner pytest run in this process for a module-scoped fixture, whose run several tests
read: ``pytester`` is function-scoped, so its run would belong to whichever test asked
first. What ``pytester.runpytest_inprocess`` keeps apart is kept apart here too (through
pytest's public API): the working directory, HOME and the temp root, pytest's options from
the environment, colours, and the modules and import paths the inner run adds."""

from __future__ import annotations

import contextlib
import importlib
import io
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest


def run_inprocess(path: Path, temproot: Path, *args: str, plugins: Sequence[object] = ()
                  ) -> pytest.RunResult:
    """``pytest ARGS`` run in PATH, its temp directories under TEMPROOT, with PLUGINS."""
    modules, paths, finders = dict(sys.modules), list(sys.path), list(sys.meta_path)
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(path)
        for name, value in (("HOME", str(path)), ("PY_COLORS", "0"),
                            ("PYTEST_DEBUG_TEMPROOT", str(temproot))):
            patch.setenv(name, value)
        for name in ("PYTEST_ADDOPTS", "TOX_ENV_DIR"):
            patch.delenv(name, raising=False)
        importlib.invalidate_caches()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                ret = pytest.main(list(args), plugins=list(plugins))
        finally:  # a later inner run may name its modules alike (test_perf.py)
            sys.modules.clear()
            sys.modules.update(modules)
            sys.path[:], sys.meta_path[:] = paths, finders
    return pytest.RunResult(ret, out.getvalue().splitlines(), err.getvalue().splitlines(),
                            time.monotonic() - started)
