"""An interruption during a step does not wait for the requests in flight
(processes/thread_pool.py): the run's teardown, which stops what they wait on, comes at
once."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from pytest_sharedkv.processes.thread_pool import map_concurrently, thread_pool


def test_results_come_in_the_order_of_the_items() -> None:
    assert map_concurrently(lambda x: x * 2, [3, 1, 2], 2) == [6, 2, 4]


def test_an_interrupt_leaves_without_joining_the_threads_still_waiting() -> None:
    """A SIGALRM raising KeyboardInterrupt in the main thread, as the suite's SIGTERM
    handler does, while every worker waits 30 s: the call ends within a second, where
    ``with ThreadPoolExecutor()`` would wait the 30 s out; queued items never start."""
    release = threading.Event()
    started: list[int] = []

    def wait(i: int) -> int:
        started.append(i)
        release.wait(30)
        return i

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt("SIGTERM: tearing down as for Ctrl-C")

    previous = signal.signal(signal.SIGALRM, interrupt)
    begun = time.monotonic()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            map_concurrently(wait, range(6), 2)
        assert time.monotonic() - begun < 1.5
        assert len(started) == 2  # the four queued were cancelled
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        release.set()


def test_a_block_that_ends_normally_joins_its_threads() -> None:
    done: list[int] = []

    def slow() -> None:
        time.sleep(0.1)
        done.append(1)

    with thread_pool(2) as pool:
        pool.submit(slow)
    assert done == [1]
