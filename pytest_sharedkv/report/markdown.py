"""Markdown tables: what users paste into an issue."""

from __future__ import annotations

import re
from collections.abc import Sequence


def escape_cell(text: str) -> str:
    """A '|' inside a cell would end it; escape it (unless it already is)."""
    return re.sub(r"(?<!\\)\|", r"\\|", text)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    header = [escape_cell(h) for h in header]
    rows = [[escape_cell(c) for c in row] for row in rows]
    widths = [len(h) for h in header]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
            *(line(r) for r in rows)]
