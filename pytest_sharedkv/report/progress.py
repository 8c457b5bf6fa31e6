"""Progress lines for tiers whose work takes minutes (a service pass, a perf screening):
on the terminal outside xdist workers (stderr inside them), and to a file if given."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest


def progress_logger(config: pytest.Config, tier: str, log_path: Path | None = None
                    ) -> Callable[[str], None]:
    """A ``log(line)`` that stamps each line with the seconds since this call."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    worker = hasattr(config, "workerinput")
    started = time.monotonic()

    def log(line: str) -> None:
        stamped = f"[sharedkv {tier} {time.monotonic() - started:7.1f}s] {line}"
        if log_path is not None:
            with log_path.open("a", encoding="utf-8") as out:
                out.write(stamped + "\n")
        if reporter is not None and capture is not None and not worker:
            with capture.global_and_fixture_disabled():
                reporter.write_line(stamped)
        else:
            print(stamped, file=sys.stderr, flush=True)

    return log
