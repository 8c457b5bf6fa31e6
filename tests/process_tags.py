"""Finding the processes a self-test started, and only those, on a shared machine: a tag in
the environment of the inner run is inherited by everything it launches."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TAG_ENV = "SHAREDKV_SELF_TEST_TAG"


@dataclass(frozen=True)
class Proc:
    pid: int
    cmdline: str


def tagged(tag: str) -> list[Proc]:
    """Live processes (zombies excluded) whose environment carries TAG."""
    found = []
    needle = f"{TAG_ENV}={tag}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if state != "Z":
            found.append(Proc(int(entry.name), cmdline.strip()))
    return found
