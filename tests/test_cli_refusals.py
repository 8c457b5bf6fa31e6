"""Issue 52: ``compare`` and ``merge-screenings`` refuse timings and reports that cannot be
right, and no input or output gives a traceback: every refusal is one line on stderr and
exit 2 (compare's 1 is a regression, so never 1), whatever the file or the stdout."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCREENING = ROOT / "fixtures" / "perf" / "screening.json"


@pytest.fixture(scope="module")
def screening() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SCREENING.read_text())
    return data


def _cli(*args: str | Path, stdout: str = "pipe") -> subprocess.CompletedProcess[str]:
    """``python -m pytest_sharedkv ARGS`` with stdout a pipe, closed (``>&-``) or full
    (``> /dev/full``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, "-m", "pytest_sharedkv", *map(str, args)]
    if stdout == "pipe":
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120,
                              check=False)
    shell = " ".join(f"'{c}'" for c in command) + (" >&-" if stdout == "closed"
                                                    else " >/dev/full")
    return subprocess.run(["sh", "-c", shell], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=120, check=False)


def _one_line(out: subprocess.CompletedProcess[str], *words: str) -> str:
    assert out.returncode == 2, (out.returncode, out.stderr)
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("ttft", [0.0, -1.0])
def test_a_ttft_of_no_time_is_refused_by_compare_and_merge(
        tmp_path: Path, screening: dict[str, Any], ttft: float) -> None:
    bad = copy.deepcopy(screening)
    for o in bad["perf"]["observations"]:
        o["ttft_s"] = ttft
    before = _write(tmp_path / "before.json", bad)
    after = _write(tmp_path / "after.json", screening)
    _one_line(_cli("compare", before, after), str(before), "ttft_s",
              "a finite number of seconds above 0")
    _one_line(_cli("merge-screenings", tmp_path / "out.json", after, before), str(before),
              "ttft_s")
    assert not (tmp_path / "out.json").exists()


def test_an_empty_screening_or_a_report_of_no_test_is_refused_naming_it(
        tmp_path: Path, screening: dict[str, Any]) -> None:
    empty = copy.deepcopy(screening)
    empty["perf"]["observations"] = []
    before = _write(tmp_path / "before.json", empty)
    after = _write(tmp_path / "after.json", screening)
    _one_line(_cli("compare", before, after), str(before), "perf.observations: empty")
    nothing = copy.deepcopy(screening)
    nothing["tests"], nothing["tiers"] = [], {}
    del nothing["perf"]
    before = _write(tmp_path / "nothing.json", nothing)
    _one_line(_cli("compare", before, after), str(before), "BEFORE holds no test")


def test_json_nested_too_deeply_exits_2_naming_the_file(tmp_path: Path,
                                                        screening: dict[str, Any]) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    after = _write(tmp_path / "after.json", screening)
    _one_line(_cli("compare", deep, after), str(deep), "nested too deeply")


@pytest.mark.parametrize("stdout", ["closed", "full"])
@pytest.mark.parametrize("command", ["compare", "--help"])
def test_a_closed_or_full_stdout_is_one_line_and_never_exit_1(
        tmp_path: Path, screening: dict[str, Any], stdout: str, command: str) -> None:
    report = _write(tmp_path / "r.json", screening)
    args = ("compare", report, report) if command == "compare" else ("--help",)
    _one_line(_cli(*args, stdout=stdout), "stdout")
