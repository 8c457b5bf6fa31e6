"""LMCache #4991's interleaving, forced inside two launched LMCache servers whose L2 is the
``fs`` adapter (``lmcache/v1/distributed/l2_adapters/fs_l2_adapter.py``, 0.5.6), armed by
``DIR_ENV`` (the run directory: the barrier files and the JSON-lines log ``LOG``).

LMCache 0.5.6's ``FSL2Adapter._execute_store`` skips a key whose file exists, else opens
``<key>.tmp`` (``final.with_suffix(".tmp")``: one staging name per key, shared by every
server writing that key into the directory) with ``aiofiles.open(tmp, "wb")``, writes the
entry in one ``write``, ``aiofiles.os.replace``-s it onto ``<key>.data``, and on an
exception unlinks the staging file if it exists. The hook swaps the module's ``aiofiles``
for a proxy when the module loads; the proxy's file write, for the first staging file of
salt ``SALT_ENV`` this process writes:

- writer 1 (``Role.FAIL``): writes part of the entry (a short write, flushed to the file,
  ending mid-page), logs ``short`` (its offset and the entry's size), creates ``SHORT``,
  waits until writer 2 has created ``BEGUN``, logs ``raise`` and raises ``OSError``: the
  write failed part-way after the other writer began;
- writer 2 (``Role.RACE``): waits until writer 1 created ``SHORT``, logs ``begun``,
  creates ``BEGUN`` and writes its whole entry (``written``); with ``HOLD_ENV`` it then
  waits until writer 1's clean-up has unlinked the staging file (``held``), so that
  clean-up meets writer 2's staging file before writer 2 renames it (without it, the order
  is LMCache's: in the runs so far writer 2 renamed first).

With ``TRUNCATE_ENV`` (both writers) the other failure: writer 2 writes its whole entry
first (``written``, ``RACE_WRITTEN``); writer 1 opens the same staging file only then (its
``"wb"`` truncates it: ``open``, ``FAIL_OPENED``); writer 2 renames it onto the entry
(``replace``, ``RACE_RENAMED``) once writer 1 has opened it; writer 1's write then fails
before it writes a byte (``raise`` at offset 0): the entry left is what the failed store
made of it.

Every open of a staging file of the salt, and the adapter's ``replace`` and ``unlink`` of
one, is a line too (each with its outcome), so the log shows what the adapter did after the
failure. A wait that times out says so in its line (``saw``: false) and the cell is VOID.
Standard library only; nothing here raises into LMCache but the failure it is asked for.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pytest_sharedkv.engine_hooks import post_import

DIR_ENV = "SHAREDKV_WRITE_RACE_DIR"
ROLE_ENV = "SHAREDKV_WRITE_RACE_ROLE"
SALT_ENV = "SHAREDKV_WRITE_RACE_SALT"
HOLD_ENV = "SHAREDKV_WRITE_RACE_HOLD"  # writer 2 returns once writer 1 unlinked its staging
TRUNCATE_ENV = "SHAREDKV_WRITE_RACE_TRUNCATE"  # the truncating order (below), both writers
MODULE = "lmcache.v1.distributed.l2_adapters.fs_l2_adapter"
LOG = "write-race.jsonl"
SHORT = "writer-1-short"  # writer 1's short write is in the staging file
BEGUN = "writer-2-begun"  # writer 2's write of the same key has begun
UNLINKED = "writer-1-unlinked"  # writer 1's clean-up unlinked a staging file of the salt
RACE_WRITTEN = "writer-2-written"  # truncating order: writer 2 wrote its whole entry
FAIL_OPENED = "writer-1-opened"  # truncating order: writer 1 opened (truncated) the staging
RACE_RENAMED = "writer-2-renamed"  # truncating order: writer 2 renamed the staging file
TAG = "write-race"
WAIT_S = 30.0
POLL_S = 0.005
STAGING_SUFFIX = ".tmp"  # fs_l2_adapter.py: final.with_suffix(".tmp")


class Role(enum.Enum):
    FAIL = "fail"  # writer 1: a short write, then an error
    RACE = "race"  # writer 2: the whole entry, begun while writer 1's write is open


def short_length(size: int) -> int:
    """Where writer 1's write stops: past half the entry, mid-page (not a page boundary)."""
    return size // 2 + 7 if size > 16 else max(1, size - 1)


class WriteRace:
    def __init__(self, run_dir: Path, role: Role, salt: str, wait_s: float = WAIT_S,
                 hold: bool = False, truncate: bool = False) -> None:
        self.run_dir = run_dir
        self.hold = hold
        self.truncate = truncate
        self.opened = False  # truncating order: writer 1's raced open has been taken
        self.name: str | None = None  # the staging file this process races
        self.role = role
        self.salt = salt
        self.wait_s = wait_s
        self.claimed = False  # the one raced write of this process has been taken
        self.lock = threading.Lock()

    def raced(self, path: Path) -> bool:
        return path.name.endswith(f"@{self.salt}{STAGING_SUFFIX}")

    def log(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "role": self.role.value, "pid": os.getpid(),
                           "t_ns": time.time_ns(), **fields})
        with self.lock, open(self.run_dir / LOG, "a", encoding="utf-8") as log:
            log.write(line + "\n")

    async def wait(self, name: str) -> bool:
        deadline = time.monotonic() + self.wait_s
        while not (self.run_dir / name).exists():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(POLL_S)
        return True

    def claim(self, path: Path) -> bool:
        with self.lock:
            if self.claimed or not self.raced(path):
                return False
            self.claimed = True
            self.name = path.name
            return True

    def claim_open(self, path: Path) -> bool:
        """Truncating order, writer 1: its first open of a staging file of the salt."""
        with self.lock:
            if not (self.truncate and self.role is Role.FAIL) or self.opened \
                    or not self.raced(path):
                return False
            self.opened = True
            return True

    async def before_open(self, path: Path) -> None:
        if self.claim_open(path):
            self.log("waited", file=path.name, saw=await self.wait(RACE_WRITTEN))

    def after_open(self, path: Path) -> None:
        self.log("open", file=path.name, on_disk=_size(path))
        if self.truncate and self.role is Role.FAIL and self.opened \
                and not (self.run_dir / FAIL_OPENED).exists():
            (self.run_dir / FAIL_OPENED).touch()

    def renamed(self, path: Path) -> None:
        if self.truncate and self.role is Role.RACE and path.name == self.name:
            (self.run_dir / RACE_RENAMED).touch()

    async def write(self, f: Any, path: Path, data: Any) -> Any:
        if not self.claim(path):
            return await f.write(data)
        buf = memoryview(data).cast("B")
        size = len(buf)
        if self.truncate:
            return await self._truncating(f, path, buf, size)
        if self.role is Role.FAIL:
            written = await f.write(buf[:short_length(size)])
            await f.flush()
            self.log("short", file=path.name, offset=written, size=size,
                     on_disk=_size(path))
            (self.run_dir / SHORT).touch()
            saw = await self.wait(BEGUN)
            self.log("raise", file=path.name, offset=written, size=size, saw=saw,
                     on_disk=_size(path))
            raise OSError(errno.EIO, f"sharedkv write race: the write of {path.name} failed "
                          f"part-way, at offset {written} of {size}")
        saw = await self.wait(SHORT)
        self.log("begun", file=path.name, size=size, saw=saw, on_disk=_size(path))
        (self.run_dir / BEGUN).touch()
        written = await f.write(buf)
        self.log("written", file=path.name, offset=written, size=size)
        if self.hold:
            self.log("held", file=path.name, saw=await self.wait(UNLINKED))
        return written

    async def _truncating(self, f: Any, path: Path, buf: memoryview, size: int) -> Any:
        if self.role is Role.RACE:
            written = await f.write(buf)
            await f.flush()
            self.log("written", file=path.name, offset=written, size=size, on_disk=_size(path))
            (self.run_dir / RACE_WRITTEN).touch()
            saw = await self.wait(FAIL_OPENED)
            self.log("held", file=path.name, saw=saw, on_disk=_size(path))
            return written
        saw = await self.wait(RACE_RENAMED)
        self.log("raise", file=path.name, offset=0, size=size, saw=saw,
                 on_disk=_size(path.with_suffix(".data")))
        raise OSError(errno.EIO, f"sharedkv write race: the write of {path.name} failed "
                      f"before its first byte, after opening (truncating) the staging file")


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


class _File:
    def __init__(self, inner: Any, path: Path, race: WriteRace) -> None:
        self._inner = inner
        self._path = path
        self._race = race

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def write(self, data: Any) -> Any:
        return await self._race.write(self._inner, self._path, data)


class _Opened:
    def __init__(self, inner: Any, path: Path, race: WriteRace) -> None:
        self._inner = inner
        self._path = path
        self._race = race

    async def __aenter__(self) -> _File:
        await self._race.before_open(self._path)
        f = await self._inner.__aenter__()
        self._race.after_open(self._path)
        return _File(f, self._path, self._race)

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._inner.__aexit__(*exc)


class _OsProxy:
    """``aiofiles.os`` with ``replace`` and ``unlink`` of the salt's staging files logged."""

    def __init__(self, inner: Any, race: WriteRace) -> None:
        self._inner = inner
        self._race = race

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def _logged(self, event: str, fn: Any, path: Any, *args: Any) -> Any:
        if not self._race.raced(Path(str(path))):
            return await fn(path, *args)
        try:
            result = await fn(path, *args)
        except OSError as exc:
            self._race.log(event, file=Path(str(path)).name, ok=False,
                           error=type(exc).__name__)
            raise
        finally:
            if event == "unlink" and self._race.role is Role.FAIL:
                (self._race.run_dir / UNLINKED).touch()
        self._race.log(event, file=Path(str(path)).name, ok=True)
        if event == "replace":
            self._race.renamed(Path(str(path)))
        return result

    async def replace(self, src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
        return await self._logged("replace", self._inner.replace, src, dst)

    async def unlink(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        return await self._logged("unlink", self._inner.unlink, path)


class AiofilesProxy:
    """What the fs adapter's module sees as ``aiofiles``."""

    def __init__(self, inner: Any, race: WriteRace) -> None:
        self._inner = inner
        self._race = race
        self.os = _OsProxy(inner.os, race)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def open(self, file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        opened = self._inner.open(file, mode, *args, **kwargs)
        path = Path(str(file))
        if "w" in mode and self._race.raced(path):
            return _Opened(opened, path, self._race)
        return opened


def swap(module: Any, race: WriteRace) -> None:
    """MODULE's ``aiofiles`` (read at each call) becomes the proxy, once."""
    if not isinstance(module.aiofiles, AiofilesProxy):  # it imported aiofiles.os too
        module.aiofiles = AiofilesProxy(module.aiofiles, race)
        race.log("swapped", module=module.__name__)


def install() -> post_import.PostImportFinder | None:
    """Armed where DIR_ENV, ROLE_ENV and SALT_ENV are set. post_import calls the wrapper
    with a function of the adapter's module once it has run (``_filename_to_object_key``,
    returned as it is): that is when the module's ``aiofiles`` is swapped."""
    run_dir, role, salt = (os.environ.get(DIR_ENV), os.environ.get(ROLE_ENV),
                           os.environ.get(SALT_ENV))
    if not (run_dir and role and salt):
        return None
    race = WriteRace(Path(run_dir), Role(role), salt, hold=bool(os.environ.get(HOLD_ENV)),
                     truncate=bool(os.environ.get(TRUNCATE_ENV)))
    race.log("armed", salt=salt, hold=race.hold, truncate=race.truncate)

    def wrapper(name: str, fn: Any) -> Any:
        swap(sys.modules[name.partition(":")[0]], race)
        return fn

    finder = post_import.install({MODULE: ["_filename_to_object_key"]}, wrapper, TAG,
                                 verb="racing the staging writes of")
    print(f"sharedkv-{TAG}: armed as writer {role} for salt {salt}", file=sys.stderr,
          flush=True)
    return finder
