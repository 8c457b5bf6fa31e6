"""The H200's recorded engine logs beside the perf reports (``fixtures/perf/h200``): files
that hold several processes' logs, each after a ``== <block dir>/<log name>`` line."""

from __future__ import annotations

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
