"""The errors a failed process logged, for its failure message.

A replica that dies at start-up usually ends its log with a wrapper's traceback ("Engine
core initialization failed. See root cause above."), so the last lines alone hide the
cause (LMCache 0.5.3's ``ValueError`` about ``max_num_batched_tokens`` was 50 lines up).
This module finds every traceback's exception line with its innermost ``File ...,
line N`` frame, so the message can name the root cause, bounded in size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_ERRORS = 4  # distinct exceptions quoted: the last ones logged
MAX_ERROR_CHARS = 600  # per exception line
TAIL_LINES = 15  # the shorter tail quoted after them

# vLLM and LMCache prefix each line: "(EngineCore pid=1) ERROR 12-01 08:43:15 [core.py:1330] "
_PROCESS_TAG = re.compile(r"^\((?:[\w.-]+ )?pid=\d+\)\s?")
_LOG_PREFIX = re.compile(
    r"^(?:\x1b\[[\d;]*m)*(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)(?:\x1b\[[\d;]*m)*\s+"
    r"\d\d-\d\d\s+[\d:.]+\s+\[[^\]]*\]\s?")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>.+))?$')
_CHAIN = ("During handling of the above exception", "The above exception was the direct cause")
# An exception line outside a traceback: "SomethingError: ..." at the start of a line.
_BARE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)(?::\s.*)?$")


@dataclass(frozen=True)
class LoggedError:
    """One exception line and where it was raised (its traceback's innermost frame)."""

    text: str
    where: str | None = None

    def describe(self) -> str:
        text = self.text if len(self.text) <= MAX_ERROR_CHARS else (
            self.text[:MAX_ERROR_CHARS - 3] + "...")
        return f"{text}  [at {self.where}]" if self.where else text


def strip_prefix(line: str) -> str:
    """The line as Python printed it, without a process tag or a logger's prefix."""
    line = _PROCESS_TAG.sub("", line.rstrip("\r\n"), count=1)
    return _LOG_PREFIX.sub("", line, count=1)


def logged_errors(text: str) -> list[LoggedError]:
    """Each distinct exception the log shows, in the order it first appeared."""
    found: list[LoggedError] = []
    seen: set[str] = set()
    in_traceback = False
    where: str | None = None

    def add(error: LoggedError) -> None:
        if error.text not in seen:
            seen.add(error.text)
            found.append(error)

    for raw in text.splitlines():
        line = strip_prefix(raw)
        if line.startswith("Traceback (most recent call last):"):
            in_traceback, where = True, None
            continue
        if in_traceback:
            frame = _FRAME.match(line)
            if frame:
                func = frame.group("func")
                where = f"{frame.group('file')}:{frame.group('line')}" + (
                    f" in {func}" if func else "")
                continue
            if not line.strip() or line[:1].isspace() or line.startswith("^"):
                continue  # source lines and carets of a frame
            add(LoggedError(line.strip(), where))
            in_traceback = False
            continue
        if line.startswith(_CHAIN):
            continue
        if _BARE.match(line.strip()) and not line[:1].isspace():
            add(LoggedError(line.strip()))
    return found


def failure_context(text: str, log_name: str, plain_tail: int, errors: int = MAX_ERRORS,
                    tail_lines: int = TAIL_LINES) -> str:
    """The log's last ERRORS distinct exceptions (root cause first), then its last
    TAIL_LINES lines; PLAIN_TAIL lines where it logged no exception."""
    found = logged_errors(text)
    keep = tail_lines if found else plain_tail
    lines = text.rstrip().splitlines()[-keep:] if text.strip() else ["(empty log)"]
    parts: list[str] = []
    if found:
        shown = found[-errors:]
        left = len(found) - len(shown)
        head = f"--- exceptions in {log_name} (in the order logged"
        head += f"; {left} earlier not shown" if left else ""
        parts.append(head + ") ---")
        parts.extend(e.describe() for e in shown)
    parts.append(f"--- last lines of {log_name} ---")
    parts.extend(line[:MAX_ERROR_CHARS] for line in lines)
    return "\n".join(parts)
