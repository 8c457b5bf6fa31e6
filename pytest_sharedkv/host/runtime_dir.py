"""The one directory per machine and user that every run shares: GPU leases, the host-memory
ledger, the record of launched processes, and an xdist run's spooled records (one
directory a run, ``report/spool.py``).

It must not depend on the run (its basetemp, xdist or not): two runs on one machine must
see each other's leases, or they book the same GPU. ``$XDG_RUNTIME_DIR`` is not used: login
sessions set it and CI agents and services of the same user usually do not, which would
split the runs again. ``SHAREDKV_RUNTIME_DIR`` overrides the place (containers that share a
GPU can mount one directory there; the self-tests isolate themselves with it).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

RUNTIME_DIR_ENV = "SHAREDKV_RUNTIME_DIR"


class RuntimeDirError(RuntimeError):
    """The shared directory cannot be used safely; the message names it and the variable."""


def default_path() -> Path:
    return Path("/tmp") / f"pytest-sharedkv-{os.getuid()}"


def runtime_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The shared directory, created 0700; it must be a directory this user owns."""
    env = os.environ if environ is None else environ
    chosen = env.get(RUNTIME_DIR_ENV)
    path = Path(chosen).expanduser() if chosen else default_path()
    where = (f"{RUNTIME_DIR_ENV}={chosen}" if chosen
             else f"{path} (set {RUNTIME_DIR_ENV} to move it)")
    try:
        if not path.exists():
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.lstat() if not chosen else path.stat()  # a chosen path may be a link
    except OSError as exc:
        raise RuntimeDirError(f"cannot create the shared run directory {where}: {exc}") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise RuntimeDirError(f"the shared run directory {where} is not a plain directory")
    if info.st_uid != os.getuid():
        raise RuntimeDirError(f"the shared run directory {where} belongs to uid {info.st_uid}, "
                              f"not to this user ({os.getuid()})")
    if info.st_mode & 0o077:
        path.chmod(0o700)
    return path


def chosen_problem(environ: Mapping[str, str] | None = None) -> str | None:
    """Why an explicitly set SHAREDKV_RUNTIME_DIR cannot be used, checked without creating
    anything (the plugin asks at start, so a bad value is a usage error)."""
    env = os.environ if environ is None else environ
    chosen = env.get(RUNTIME_DIR_ENV)
    if not chosen:
        return None
    path = Path(chosen).expanduser()
    where = f"{RUNTIME_DIR_ENV}={chosen}"
    if path.exists():
        if not path.is_dir():
            return f"{where}: not a directory"
        if path.stat().st_uid != os.getuid():
            return f"{where}: belongs to uid {path.stat().st_uid}, not to this user"
        return None
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        return f"{where}: cannot be created (nothing writable above it)"
    return None


def subdir(name: str, environ: Mapping[str, str] | None = None) -> Path:
    """``<runtime dir>/NAME``, created 0700."""
    path = runtime_dir(environ) / name
    path.mkdir(mode=0o700, exist_ok=True)
    return path
