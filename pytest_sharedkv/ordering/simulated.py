"""A simulated-stream backend: the TEST DOUBLE that lets CPU CI prove the harness's logic.

Each stream is a FIFO of work run asynchronously by its own thread, delays included. A
"raw" copy runs at once on the calling thread and waits for nothing (like a stream-less
``cudaMemcpy`` against a non-blocking stream); an "ordered" copy is queued on the current
stream. With ``blocking_default_stream=True`` the raw copy first waits for every stream
(the legacy default-stream semantics), which makes the negative control blind: the
sensitivity gate must then void the run. ``CUDA_LAUNCH_BLOCKING=1`` in the environment
makes every queued piece of work finish before the call returns, as it makes every CUDA
launch synchronous: the delay ends before the copy starts, and the negative control is
blind again.

It is selected only through ``SHAREDKV_SIMULATED_STREAMS`` (the self-tests' seam); its
records are labelled ``backend=simulated`` and are never GPU results.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from pytest_sharedkv.host.cuda_check import launch_blocking
from pytest_sharedkv.ordering.probe import StreamBackend, SymmetricCopy

SIMULATED_ENV = "SHAREDKV_SIMULATED_STREAMS"
BLOCKING_VALUE = "blocking-default-stream"


def _copier(dst: torch.Tensor, src: torch.Tensor) -> Callable[[], None]:
    def copy() -> None:
        dst.copy_(src)

    return copy


class _Stream:
    def __init__(self, name: str) -> None:
        self.work: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            fn = self.work.get()
            try:
                if fn is None:
                    return
                fn()
            finally:
                self.work.task_done()

    def submit(self, fn: Callable[[], None]) -> None:
        self.work.put(fn)

    def wait(self) -> None:
        self.work.join()

    def close(self) -> None:
        self.work.put(None)
        self.thread.join(timeout=10)


class SimulatedBackend:
    name = "simulated"
    simulated = True

    def __init__(self, clock_hz: float = 1e9, blocking_default_stream: bool = False) -> None:
        self.clock_hz = clock_hz
        self.blocking_default_stream = blocking_default_stream
        self.stream = _Stream("sharedkv-simulated-stream")
        self.current: _Stream | None = None
        self.launch_blocking = launch_blocking()

    def describe(self) -> str:
        mode = " with a blocking default stream" if self.blocking_default_stream else ""
        mode += " and synchronous launches (CUDA_LAUNCH_BLOCKING)" if self.launch_blocking else ""
        return f"SIMULATED streams{mode} (test double, not a GPU)"

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def to_device(self, cpu: torch.Tensor) -> torch.Tensor:
        return cpu.clone()

    @contextmanager
    def side_stream(self) -> Iterator[None]:
        self.current = self.stream
        try:
            yield
        finally:
            self.current = None

    def enqueue(self, fn: Callable[[], None]) -> None:
        if self.current is None:
            fn()
        else:
            self.current.submit(fn)
            if self.launch_blocking:
                self.current.wait()

    def delay(self, cycles: int) -> None:
        seconds = cycles / self.clock_hz
        self.enqueue(lambda: time.sleep(seconds))

    def add(self, out: torch.Tensor, base: torch.Tensor, value: int) -> None:
        def kernel() -> None:
            torch.add(base, value, out=out)

        self.enqueue(kernel)

    def consume(self, out: torch.Tensor, src: torch.Tensor) -> None:
        self.enqueue(_copier(out, src))

    def synchronize(self) -> None:
        self.stream.wait()

    def wait_current(self) -> None:
        if self.current is not None:
            self.current.wait()

    def delay_seconds(self, cycles: int) -> float:
        return cycles / self.clock_hz

    def close(self) -> None:
        self.stream.close()


class _SimCopy(SymmetricCopy):
    def __init__(self, backend: StreamBackend, sizes: tuple[int, ...]) -> None:
        if not isinstance(backend, SimulatedBackend):
            raise TypeError(f"{type(self).__name__} runs only on the simulated backend")
        self.backend = backend


class SimRawCopy(_SimCopy):
    description = "simulated: copies at once, ignoring the current stream"

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        if self.backend.blocking_default_stream:
            self.backend.synchronize()
        dst.copy_(src)


class SimOrderedCopy(_SimCopy):
    description = "simulated: queued on the current stream"

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self.backend.enqueue(_copier(dst, src))


class SimSyncThenRawCopy(_SimCopy):
    description = "simulated: waits for the current stream, then copies at once"

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self.backend.wait_current()
        dst.copy_(src)
