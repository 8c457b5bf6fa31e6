"""The service tier's sensitivity gate, inside the launched LMCache server: while a control
file exists, every KV retrieve hands the engine zeros for the chunks it names.

A service check proves something only if the served model can see corrupted KV. The gate
proves it in every launched run: the suite writes the control file, replica B retrieves
the control requests from the pool, and the answers that copy from the zeroed chunk must
change (the others must not). The hook zeroes the L1 copy of that chunk in place before
LMCache's H2D transfer (the control requests live in their own namespace, so nothing else
reads those chunks), and logs each zeroed chunk so a gate whose hook never fired is VOID.

Launched processes load it through ``inject/sitecustomize.py`` when
``SHAREDKV_CORRUPT_CONTROL`` is set; it wraps, after import, the function LMCache 0.5.6's
server calls per object group (``TARGETS``). Standard library only at import.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_sharedkv.engine_hooks import post_import

CONTROL_ENV = "SHAREDKV_CORRUPT_CONTROL"  # path of the control file the suite writes
LOG_ENV = "SHAREDKV_CORRUPT_LOG"  # one line per zeroed chunk
TAG = "corrupt"
# The server's retrieve calls this per object group with one memory object per chunk
# (None-padded before the window of sliding/recurrent groups): 0.5.6 keeps it in
# object_group_transfer, 0.5.3 in modules.lmcache_driven_transfer (which 0.5.6 imports it
# into: the wrap is marked, so a function is zeroing once, wherever it is reached from).
TARGETS = {
    "lmcache.v1.multiprocess.object_group_transfer": ["transfer_kv_per_object_group"],
    "lmcache.v1.multiprocess.modules.lmcache_driven_transfer": ["transfer_kv_per_object_group"],
}
_H2D = "H2D"


def chunks_to_zero(control: Path) -> list[int]:
    """The chunk indices the control file names (none when it is absent or unreadable)."""
    try:
        data = json.loads(control.read_text())
    except (OSError, ValueError):
        return []
    chunks = data.get("zero_chunks", []) if isinstance(data, dict) else []
    return [int(c) for c in chunks if isinstance(c, int) and c >= 0]


def armed_path(log: str | Path) -> Path:
    """Where the hook records that it loaded (its pid), beside the zeroed-chunk log: a gate
    that zeroed nothing is then told apart from a hook that never loaded."""
    return Path(f"{log}.armed")


def wrapped_path(log: str | Path) -> Path:
    """Where the hook names each function it wrapped: a gate that zeroed nothing then says
    whether no target was found (an LMCache that keeps the transfer elsewhere) or one was
    wrapped and never called with a retrieve."""
    return Path(f"{log}.wrapped")


def log_wrapped(log: str | None, name: str) -> None:
    if log:
        with open(wrapped_path(log), "a", encoding="utf-8") as out:
            out.write(f"{name}\n")


def read_wrapped(log: Path) -> list[str] | None:
    """The functions the hook wrapped (module:function), once each, in order; None where no
    hook recorded any (the stub zeroes by itself; an older hook did not say)."""
    try:
        names = wrapped_path(log).read_text(encoding="utf-8").split()
    except OSError:
        return None
    return list(dict.fromkeys(names))


def log_armed(log: str | None) -> None:
    if log:
        with open(armed_path(log), "a", encoding="utf-8") as out:
            out.write(f"{os.getpid()}\n")


def log_zeroed(log: str | None, group: int, chunk: int, nbytes: int) -> None:
    if log:
        with open(log, "a", encoding="utf-8") as out:  # one short line: an atomic append
            out.write(f"{os.getpid()}\t{group}\t{chunk}\t{nbytes}\n")


def read_log(path: Path) -> list[tuple[int, int, int]]:
    """(object group, chunk, bytes) per zeroed chunk."""
    rows = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.split("\t")
            if len(parts) == 4:
                rows.append((int(parts[1]), int(parts[2]), int(parts[3])))
    return rows


def zero(obj: Any, log: str | None, group: int, chunk: int) -> None:
    """Zero one memory object's bytes; never raise into LMCache (a failed retrieve takes
    a hybrid vLLM engine down): a failure is logged and the gate, seeing no zeroed chunk,
    is VOID. The raw byte buffer, not ``.tensor``: LMCache 0.5.6's ``.tensor`` view raises
    for hybrid object groups whose metadata shape is one block, not the chunk."""
    try:
        raw = getattr(obj, "raw_data", None)
        size = int(obj.get_size())
        target = raw[:size] if raw is not None and hasattr(raw, "zero_") else obj.tensor
        target.zero_()
        log_zeroed(log, group, chunk, size)
    except Exception as exc:  # report, never break the server
        print(f"sharedkv-{TAG}: could not zero chunk {chunk} of group {group}: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def wrapper(control: Path, log: str | None) -> post_import.Wrapper:
    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        log_wrapped(log, name)

        @functools.wraps(fn)
        def corrupting(cache_context: Any, block_ids_gpu: Any, memory_objs: Any,
                       object_group_id: int, *args: Any, **kwargs: Any) -> Any:
            direction = kwargs.get("direction", args[2] if len(args) > 2 else None)
            if _H2D in str(direction):
                for chunk in chunks_to_zero(control):
                    if chunk < len(memory_objs) and memory_objs[chunk] is not None:
                        zero(memory_objs[chunk], log, object_group_id, chunk)
            return fn(cache_context, block_ids_gpu, memory_objs, object_group_id, *args,
                      **kwargs)

        return corrupting

    return wrap


def arm(tag: str, targets: Any, make: Callable[..., post_import.Wrapper], control_env: str,
        log_env: str, verb: str, chunk_env: str | None = None, where: str = ""
        ) -> post_import.PostImportFinder | None:
    """Every gate hook's start (this one's, the in-process connector's, native offload's):
    armed only where CONTROL_ENV names a control file; the wrapped list made empty (not
    unknown) before anything is wrapped; MAKE(control, log[, chunk_size]) the wrapper; the
    start logged for the gate to read. With CHUNK_ENV, a chunk size it must name: else the
    hook stays unarmed, and the gate, reading no start, says VOID."""
    path = os.environ.get(control_env)
    if not path:
        return None
    log = os.environ.get(log_env)
    extra: tuple[int, ...] = ()
    if chunk_env is not None:
        try:
            chunk_size = int(os.environ.get(chunk_env, ""))
        except ValueError:
            chunk_size = 0
        if chunk_size <= 0:
            print(f"sharedkv-{tag}: {chunk_env} is not a chunk size; the gate is not armed",
                  file=sys.stderr, flush=True)
            return None
        extra = (chunk_size,)
    if log:
        wrapped_path(log).touch()  # an empty list, not an unknown one, if nothing is wrapped
    finder = post_import.install(targets, make(Path(path), log, *extra), tag, verb=verb)
    log_armed(log)
    print(f"sharedkv-{tag}: sensitivity gate armed{where} (control file {path})",
          file=sys.stderr, flush=True)
    return finder


def install() -> post_import.PostImportFinder | None:
    return arm(TAG, TARGETS, wrapper, CONTROL_ENV, LOG_ENV, verb="zeroing named chunks in")
