"""A closed stdout (``| head``) ends a run without a traceback: a run that writes a report
ends as an interrupt and writes it; ``python -m pytest_sharedkv --help`` stops printing and
exits as a tool whose pipe closed (128 + SIGPIPE)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Each test waits until the outer test has closed the pipe, so output follows the close.
WAITS = """
import os, time
import pytest

@pytest.mark.ordering
@pytest.mark.parametrize("i", range(3))
def test_wait(i):
    while not os.path.exists(os.environ["FLAG"]):
        time.sleep(0.01)
"""


def _closed_after(argv: list[str], cwd: Path, until: bytes, flag: Path | None = None
                  ) -> tuple[int, str]:
    """Run ARGV, read its stdout up to the line holding UNTIL, close it (then create FLAG);
    its exit status and stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(ROOT)
    if flag is not None:
        env["FLAG"] = str(flag)
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        for line in proc.stdout:
            if until in line:
                break
        proc.stdout.close()  # the reader is gone
        if flag is not None:
            flag.write_text("")
        err = proc.stderr.read().decode(errors="replace")
        return proc.wait(timeout=300), err
    finally:
        proc.kill()
        proc.wait()


def test_a_run_whose_stdout_closes_ends_with_its_report(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(WAITS)
    rc, err = _closed_after([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                             "--sharedkv-json=r.json"], pytester.path, b"collected",
                            pytester.path / "flag")
    assert rc == pytest.ExitCode.INTERRUPTED, err
    assert err == ""  # no traceback, no "Exception ignored" at exit
    data = json.loads((pytester.path / "r.json").read_text())
    assert data["complete"] is False
    assert "stdout closed" in data["interrupted"]
    assert len(data["tests"]) < 3  # it ended, it did not run on


def test_the_suite_piped_into_head_writes_its_report(tmp_path: Path) -> None:
    """``python -m pytest_sharedkv -m ordering | head -1``: the stdout closes while the
    header is printed, before the session started."""
    rc, err = _closed_after([sys.executable, "-m", "pytest_sharedkv", "-m", "ordering", "-p",
                             "no:cacheprovider"], tmp_path, b"test session starts")
    assert rc == pytest.ExitCode.INTERRUPTED, err
    assert "Traceback" not in err
    data = json.loads((tmp_path / "sharedkv-report.json").read_text())
    assert data["complete"] is False and "stdout closed" in data["interrupted"]


def test_help_piped_into_head_exits_as_a_closed_pipe(tmp_path: Path) -> None:
    rc, err = _closed_after([sys.executable, "-m", "pytest_sharedkv", "--help"], tmp_path,
                            b"usage:")
    assert rc == 128 + signal.SIGPIPE, err
    assert err == ""
