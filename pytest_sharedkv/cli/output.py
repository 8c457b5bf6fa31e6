"""The one writer of every file a ``python -m pytest_sharedkv`` subcommand writes
(``compare --markdown``, ``merge-screenings OUT``): nothing the user gave is ever lost.

An output that is one of the command's inputs is refused, whatever name it goes by (the
same path, a symlink, ``./``, a hard link: the file's device and inode, not its name), and
so is one that exists unless ``--force``. The text goes to a temporary file in the same
directory, is flushed to disk, and replaces the output in one rename, so a reader (or a
crash) sees the old file or the new one, never half of either.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


class OutputError(Exception):
    """Exit status 2: the output cannot be written without losing something."""


STDOUT_CLOSED = "stdout is closed: nothing can be printed (run it with stdout open)"


def to_stdout(text: str) -> None:
    """TEXT on stdout, flushed. A closed stdout (``>&-``) or one that refuses the write (a
    full disk, ``> /dev/full``) is an OutputError (exit status 2, never 1, which compare
    keeps for a regression); what could not be written is discarded, so the interpreter's
    own flush at exit finds nothing to fail on. A reader that went away (BrokenPipeError)
    is the caller's: its status is a SIGPIPE's."""
    stream = sys.stdout
    if stream is None:
        raise OutputError(STDOUT_CLOSED)
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as exc:  # ValueError: a stream closed in-process
        discard_stdout()
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise OutputError(f"cannot write to stdout ({why})") from None


def discard_stdout() -> None:
    """Point stdout's file descriptor at /dev/null and drop what is buffered for it."""
    stream = sys.stdout
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)
        stream.flush()


@dataclass(frozen=True)
class Output:
    """A file a subcommand writes: its PATH, the OPTION that named it (as the message says
    it), whether ``--force`` lets it replace a file, and the command's INPUTS by role."""

    path: Path
    option: str
    force: bool
    inputs: Sequence[tuple[str, Path]]

    def problem(self) -> str | None:
        """Why PATH cannot be written now, or None."""
        try:
            info = self.path.stat()  # follows a symlink: what a write would replace
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"cannot write {self.path} ({exc.strerror or exc})"
        if stat.S_ISDIR(info.st_mode):
            return f"cannot write {self.path} (it is a directory)"
        for role, given in self.inputs:
            try:
                theirs = given.stat()
            except OSError:
                continue  # an input that is not there is no file to lose
            if (info.st_dev, info.st_ino) == (theirs.st_dev, theirs.st_ino):
                return f"{self.path} is {role} {given} ({_how(self.path, given)}): an input " \
                    "is never replaced"
        if not self.force:
            return f"{self.path} exists (give --force to replace it)"
        return None

    def check(self) -> None:
        """OutputError naming the option and the file where it cannot be written."""
        problem = self.problem()
        if problem is not None:
            raise OutputError(f"{self.option}: {problem}")

    def write(self, text: str) -> None:
        """TEXT as the file, checked again just before (an input is never replaced)."""
        self.check()
        try:
            replace_atomically(self.path, text)
        except OSError as exc:
            raise OutputError(f"{self.option}: cannot write {self.path} "
                              f"({exc.strerror or exc})") from None


def _how(out: Path, given: Path) -> str:
    if out.is_symlink() or given.is_symlink():
        return "through a symlink"
    if os.path.abspath(out) == os.path.abspath(given):
        return "the same path"
    if out.resolve() == given.resolve():
        return "the same file by another path"
    return "a hard link to it"


def _mode(path: Path) -> int:
    """The mode the file gets: the replaced file's, else what open() would give."""
    with contextlib.suppress(OSError):
        return stat.S_IMODE(path.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def replace_atomically(path: Path, text: str) -> None:
    """Write TEXT to a temporary file beside PATH, fsync it, rename it over PATH and fsync
    the directory; the temporary file is removed if anything fails."""
    directory = path.parent
    mode = _mode(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    with contextlib.suppress(OSError):  # the rename itself on disk (not every FS can)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
