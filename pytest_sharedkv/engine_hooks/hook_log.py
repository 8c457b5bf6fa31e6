"""The JSON-lines logs the engine hooks append to, one object a line, read back by the
suite: a torn last line (a process killed mid-write) or a foreign line is skipped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_log(path: Path) -> list[dict[str, Any]]:
    """The log's records; none where it cannot be read."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records
