"""A closed stdout (``| head``, a pager quit early) ends a sharedkv run as an interrupt does,
without a traceback: what the terminal still writes goes to /dev/null, the run tears down
what it launched and writes its report.

Python ignores SIGPIPE, so the terminal's next write raises BrokenPipeError wherever pytest
happens to print, and pytest's own handling of it (an INTERNALERROR, printed to the same
closed stdout) loses the report. The guard wraps the stream pytest's terminal writer is
given; it is installed only in a run that uses the plugin and writes a report, and only
while the session runs does a closed stdout end it (one closed during the final summary
is only silenced).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any, TextIO

REASON = "stdout closed (its reader stopped reading): tearing down as for Ctrl-C"


class GuardedStdout:
    """STREAM, whose first BrokenPipeError calls ON_CLOSE; its fd then points at /dev/null
    (again whenever pytest's capture has put the closed pipe back)."""

    def __init__(self, stream: TextIO, on_close: Callable[[], None]) -> None:
        self.stream = stream
        self.on_close = on_close
        self.closed_by_reader = False

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._silence()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._silence()

    def _silence(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self.stream.fileno())
        finally:
            os.close(devnull)
        with contextlib.suppress(OSError):
            self.stream.flush()  # what was buffered for the pipe goes to /dev/null
        if not self.closed_by_reader:
            self.closed_by_reader = True
            self.on_close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)
