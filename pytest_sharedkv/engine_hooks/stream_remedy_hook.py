"""The triage's code remedies for LMCache 0.5.6's torch-fallback copy, as cells a run tests:
make the copy between a memory object and the server's staging buffer wait for the stream
that produces and reads that buffer.

Where LMCache's compiled ``lmcache.cuda_ops`` does not load, the server's transfers copy
each chunk with ``lmcache_memcpy_async`` from ``lmcache.v1.platform.torch_ops``
(mem_kernels.py:532, reached through ``DeviceOps.lmcache_memcpy_async``,
platform/base/device_ops.py:275; with the lazy allocator, gpu_connector/gpu_ops.py:47 and
:90): a synchronous ``cudaMemcpy`` on the legacy default stream, unordered with the
server's own non-blocking stream, where the staging kernel writes the buffer a store reads
(and reads the buffer a retrieve overwrites). Two remedies, one per process
(``REMEDY_ENV``):

* ``current-stream``: the copy is issued on the current stream with ``cudaMemcpyAsync``,
  split at pin-chunk boundaries of the host buffer (each chunk a separate
  ``cudaHostRegister``, as the compiled kernel splits it);
* ``wait-producer``: an event recorded on the current stream, waited by the legacy default
  stream, before LMCache's own copy runs there.

Every application is one JSON line in ``LOG_ENV``; a run where the fallback was not found
(where it was looked for is logged) or never called (the compiled kernels bound) is VOID.
Standard library at import; torch and libcudart only when a copy is made.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from pytest_sharedkv.engine_hooks import post_import
from pytest_sharedkv.engine_hooks.hook_log import read_log as read_log  # the suite reads it here

REMEDY_ENV = "SHAREDKV_STREAM_REMEDY"  # "current-stream" or "wait-producer"
LOG_ENV = "SHAREDKV_STREAM_REMEDY_LOG"
TAG = "remedy"
VOID = "VOID"
CURRENT_STREAM = "current-stream"
WAIT_PRODUCER = "wait-producer"
REMEDIES = (CURRENT_STREAM, WAIT_PRODUCER)
# Where LMCache keeps the fallback, newest first (host/lmcache_api.py's "fallback
# lmcache_memcpy_async"); the package's name is the one DeviceOps calls through.
PLACES = ("lmcache.v1.platform.torch_ops.mem_kernels:lmcache_memcpy_async",
          "lmcache.v1.platform.torch_ops:lmcache_memcpy_async")
CUDA_MEMCPY_DEFAULT = 4


class Cuda(Protocol):
    """What a remedy asks of CUDA (a fake stands in on CPU)."""

    def usable(self) -> bool: ...

    def current_stream(self) -> int: ...

    def memcpy_async(self, dest: int, src: int, nbytes: int, stream: int) -> None: ...

    def wait_producer(self) -> None: ...


class TorchCuda:
    """torch's streams and events, and the libcudart torch loaded."""

    def usable(self) -> bool:
        torch = sys.modules.get("torch")
        return bool(torch is not None and torch.cuda.is_available()
                    and torch.cuda.is_initialized())

    def current_stream(self) -> int:
        import torch

        return int(torch.cuda.current_stream().cuda_stream)

    def memcpy_async(self, dest: int, src: int, nbytes: int, stream: int) -> None:
        import ctypes

        from pytest_sharedkv.host.cudart import check, cudart

        check(cudart().cudaMemcpyAsync(ctypes.c_void_p(dest), ctypes.c_void_p(src),
                                       ctypes.c_size_t(nbytes), CUDA_MEMCPY_DEFAULT,
                                       ctypes.c_void_p(stream)), "cudaMemcpyAsync")

    def wait_producer(self) -> None:
        import torch

        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream())
        torch.cuda.default_stream().wait_event(event)  # the stream cudaMemcpy runs on


def pieces(host_offset: int, nbytes: int, alignment: int) -> list[tuple[int, int]]:
    """(start, length) of each copy, split where the host buffer's offset crosses a
    multiple of ALIGNMENT (a pin chunk's end)."""
    out, start = [], 0
    while start < nbytes:
        room = alignment - (host_offset + start) % alignment
        length = min(nbytes - start, room)
        out.append((start, length))
        start += length
    return out


class RemedyLog:
    def __init__(self, path: str | None) -> None:
        self.path = path

    def write(self, record: dict[str, Any]) -> None:
        if self.path:
            line = json.dumps({"pid": os.getpid(), **record}, sort_keys=True) + "\n"
            with open(self.path, "a", encoding="utf-8") as out:
                out.write(line)


def _direction(value: Any) -> str:
    text = str(value)
    return "H2D" if "H2D" in text else "D2H" if "D2H" in text else text


def wrap(name: str, fn: Callable[..., Any], remedy: str, cuda: Cuda, log: RemedyLog
         ) -> Callable[..., Any]:
    """FN (LMCache's fallback, its signature ``(dest, src, nbytes, direction,
    host_buffer_offset, host_buffer_alignments)``) with REMEDY applied to pointer copies on
    a usable CUDA device; anything else (tensor mode, no CUDA) runs as LMCache wrote it."""
    log.write({"kind": "wrapped", "target": name, "remedy": remedy})

    @functools.wraps(fn)
    def remedied(dest: Any, src: Any, nbytes: Any, direction: Any, host_buffer_offset: Any,
                 host_buffer_alignments: Any, *rest: Any, **kwargs: Any) -> Any:
        pointers = isinstance(dest, int) and isinstance(src, int) and not rest and not kwargs
        if not pointers or not cuda.usable():
            return fn(dest, src, nbytes, direction, host_buffer_offset,
                      host_buffer_alignments, *rest, **kwargs)
        record = {"kind": "applied", "remedy": remedy, "target": name,
                  "direction": _direction(direction), "bytes": int(nbytes)}
        if remedy == WAIT_PRODUCER:
            cuda.wait_producer()
            log.write(record)
            return fn(dest, src, nbytes, direction, host_buffer_offset, host_buffer_alignments)
        stream = cuda.current_stream()
        split = pieces(int(host_buffer_offset), int(nbytes), int(host_buffer_alignments))
        for start, length in split:
            cuda.memcpy_async(dest + start, src + start, length, stream)
        log.write({**record, "pieces": len(split)})
        return None

    return remedied


def void_problem(records: Sequence[dict[str, Any]], remedy: str) -> str | None:
    """Why a remedy cell proves nothing, or None: it must have changed the server's copies
    (the places looked in are the ones the armed line names)."""
    if any(r.get("kind") == "applied" and r.get("remedy") == remedy for r in records):
        return None
    armed = [r for r in records if r.get("kind") == "armed"]
    if not armed:
        return f"{VOID}: the {remedy} remedy never loaded in the LMCache server"
    wrapped = sorted({str(r.get("target")) for r in records if r.get("kind") == "wrapped"})
    if not wrapped:
        places = armed[-1].get("places") or list(PLACES)
        return (f"{VOID}: the {remedy} remedy found no fallback lmcache_memcpy_async "
                f"(looked in: {'; '.join(map(str, places))})")
    return (f"{VOID}: the {remedy} remedy wrapped {', '.join(wrapped)} but no pointer copy "
            "ran through it on a CUDA device (LMCache's compiled kernels bound, or an "
            "allocator whose copies are torch's own)")


def install(remedy: str | None = None, cuda: Cuda | None = None,
            places: Sequence[str] = PLACES) -> post_import.PostImportFinder | None:
    """Wrap the fallback where LMCache keeps it (already imported now, else as it loads)."""
    chosen = remedy if remedy is not None else os.environ.get(REMEDY_ENV, "")
    if not chosen:
        return None
    log = RemedyLog(os.environ.get(LOG_ENV))
    if chosen not in REMEDIES:
        log.write({"kind": "error", "why": f"{REMEDY_ENV}={chosen!r}: not one of {REMEDIES}"})
        print(f"sharedkv-{TAG}: {REMEDY_ENV}={chosen!r} is not one of {REMEDIES}",
              file=sys.stderr, flush=True)
        return None
    log.write({"kind": "armed", "remedy": chosen, "places": list(places)})
    targets: dict[str, list[str]] = {}
    for place in places:
        module, _, attribute = place.partition(":")
        targets.setdefault(module, []).append(attribute)
    used = cuda or TorchCuda()
    finder = post_import.install(targets, lambda name, fn: wrap(name, fn, chosen, used, log),
                                 TAG, verb=f"{chosen} remedy in")
    print(f"sharedkv-{TAG}: {chosen} remedy for LMCache's fallback copy", file=sys.stderr,
          flush=True)
    return finder
