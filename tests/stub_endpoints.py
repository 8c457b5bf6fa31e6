"""Two stub replicas started outside the suite: an external pair (``--sharedkv-endpoints``)
as the suite sees a real deployment, which it can neither start, stop nor restart."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from pytest_sharedkv.processes.managed import free_port, http_ok


@contextmanager
def external_stubs(*extra: str) -> Iterator[str]:
    """Yields "URL_A,URL_B" once both answer /health (EXTRA: stub arguments for both)."""
    procs, urls = [], []
    try:
        for name in ("A", "B"):
            port = free_port()
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "pytest_sharedkv.stack.stub.stub_openai", "--port",
                 str(port), "--name", name, *extra],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            urls.append(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 30
        while not all(http_ok(u + "/health") for u in urls) and time.monotonic() < deadline:
            time.sleep(0.1)
        yield ",".join(urls)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
