"""``--help`` works for every subcommand ``python -m pytest_sharedkv`` has (the suite's
own, ``run``, ``make-model``, ``compare``, ``merge-screenings``): exit 0, the usage line
first, no traceback.
Argparse formats help text with ``%``, so an unescaped ``10%`` crashes only here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_sharedkv.__main__ import USAGE

ROOT = Path(__file__).resolve().parents[1]
PROG = "python -m pytest_sharedkv"
# argv -> how its output begins (run passes --help to pytest, which names itself)
HELPS = {
    ("--help",): f"usage: {PROG} [run]",
    ("run", "--help"): "usage: ",
    ("make-model", "--help"): f"usage: {PROG} make-model",
    ("compare", "--help"): f"usage: {PROG} compare",
    ("merge-screenings", "--help"): f"usage: {PROG} merge-screenings",
}


def test_every_subcommand_in_the_usage_is_covered() -> None:
    named = {m.strip("[]") for m in re.findall(rf"{PROG} (\S+)", USAGE)}
    assert named == {argv[0] for argv in HELPS if argv[0] != "--help"}


@pytest.mark.parametrize(("argv", "usage"), HELPS.items(), ids=[" ".join(a) for a in HELPS])
def test_help_exits_0_with_its_usage(tmp_path: Path, argv: tuple[str, ...], usage: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-m", "pytest_sharedkv", *argv], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(usage), out.stdout[:200]
    assert "Traceback" not in out.stderr
    if argv[0] == "run":  # pytest's help, with the plugin's options
        assert "--sharedkv-require-gpu" in out.stdout
    elif argv[0] != "--help":  # a subcommand's own options are all in the wrapper's usage
        synopsis = _synopsis(argv[0])
        missing = sorted({o for o in re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", out.stdout)
                          if o != "--help" and o not in synopsis})
        assert missing == [], f"{argv[0]}: {missing} not in USAGE's synopsis"


def _synopsis(command: str) -> str:
    """USAGE's synopsis of COMMAND: its line and the continuation lines below it."""
    lines = USAGE.split("\n\n", 1)[0].splitlines()
    start = next(i for i, line in enumerate(lines) if f"{PROG} {command} " in line)
    end = next((i for i in range(start + 1, len(lines)) if PROG in lines[i]), len(lines))
    return "\n".join(lines[start:end])
