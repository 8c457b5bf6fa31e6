"""The H200's recorded engine logs beside the perf reports (``fixtures/perf/h200``): files
that hold several processes' logs, each after a ``== <block dir>/<log name>`` line."""

from __future__ import annotations

import re
from pathlib import Path

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "perf" / "h200"


def sections(path: Path) -> dict[str, str]:
    """Each process's log in PATH, by the name its ``== `` line gives."""
    found: dict[str, list[str]] = {}
    name = ""
    for line in path.read_text().splitlines():
        if line.startswith("== "):
            name = line[3:]
            found[name] = []
        else:
            found[name].append(line)
    return {k: "\n".join(v) for k, v in found.items()}


def transfer_seconds(log: str, verb: str, tokens: int = 3008) -> list[float]:
    """The seconds of each of an LMCache server's ``<VERB> <TOKENS> tokens in S seconds``
    lines in LOG (VERB: Stored or Retrieved)."""
    return [float(s) for s in re.findall(rf"{verb} {tokens} tokens in ([0-9.]+) seconds", log)]


def delayed_calls(counted: str) -> dict[str, int]:
    """Delayed calls per target from a section of counted inject-delay lines (``COUNT
    [ROLE] TARGET`` each: the count first, the target last)."""
    return {line.split()[-1]: int(line.split()[0]) for line in counted.splitlines()
            if line.strip()}
