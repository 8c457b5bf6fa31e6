"""Thread pools that an interrupted run does not wait on.

``with ThreadPoolExecutor() as pool`` joins its threads on the way out, an interruption
included: a Ctrl-C or the suite's SIGTERM during a step then waits for every request still
in flight, and those wait on the very engines the teardown would stop. Here an exception
leaves at once: queued work is cancelled, running threads are left to fail when the
teardown stops what they wait on."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


@contextmanager
def thread_pool(workers: int) -> Iterator[ThreadPoolExecutor]:
    """A pool of WORKERS threads, joined when its block ends normally and not joined when
    an exception (KeyboardInterrupt too) leaves it."""
    pool = ThreadPoolExecutor(max_workers=max(workers, 1))
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def map_concurrently(fn: Callable[[T], R], items: Iterable[T], workers: int) -> list[R]:
    """``list(pool.map(fn, items))`` on a thread_pool of WORKERS threads: results in the
    order of ITEMS."""
    with thread_pool(workers) as pool:
        return list(pool.map(fn, items))
