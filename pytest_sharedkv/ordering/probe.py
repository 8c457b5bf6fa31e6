"""The probe engine: trials, buffers and byte comparison, independent of the stream backend.

One trial on the probe's non-default stream:

* D2H: poison the host buffer, [delay], producer writes ``base + v`` into the device
  buffer, then the copy under test (device -> host). The host must hold ``base + v``.
* H2D: the host buffer holds ``base + v``; [delay], an earlier writer puts ``base + w``
  into the device buffer, then the copy under test (host -> device), then a consumer on
  the same stream reads the device buffer. The consumer must read ``base + v``.

``v`` is unique per trial (``w = v + 128``), so stale bytes differ from the expected ones
in every position. Buffers are allocated once per size per session.

Each copy path runs one uncounted, undelayed trial per (direction, size) before its cell:
first calls load kernels and libraries, and such loads can synchronize the device, which
would let a stream-less copy pass the first delayed trial by accident (seen on an H200).
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from pytest_sharedkv.config.options import format_size

MAX_MISMATCHES_KEPT = 3


class StreamBackend(Protocol):
    """What the probe needs from a device: buffers, one side stream, delay, kernels, sync."""

    name: str
    simulated: bool

    def host_buffer(self, nbytes: int) -> torch.Tensor: ...
    def to_device(self, cpu: torch.Tensor) -> torch.Tensor: ...
    def side_stream(self) -> AbstractContextManager[Any]: ...
    def delay(self, cycles: int) -> None: ...
    def add(self, out: torch.Tensor, base: torch.Tensor, value: int) -> None: ...
    def consume(self, out: torch.Tensor, src: torch.Tensor) -> None: ...
    def synchronize(self) -> None: ...
    def delay_seconds(self, cycles: int) -> float: ...
    def describe(self) -> str: ...


class CopyImpl(Protocol):
    """A copy path under probe. ``host_buffer`` may return None to use the probe's own."""

    description: str

    def host_buffer(self, nbytes: int) -> torch.Tensor | None: ...
    def d2h(self, dev: torch.Tensor, host: torch.Tensor) -> None: ...
    def h2d(self, host: torch.Tensor, dev: torch.Tensor) -> None: ...
    def close(self) -> None: ...


class SymmetricCopy:
    """A copy path that is one ``copy(dst, src)`` in both directions, on the probe's buffers."""

    description = ""

    def host_buffer(self, nbytes: int) -> torch.Tensor | None:
        return None

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        raise NotImplementedError

    def d2h(self, dev: torch.Tensor, host: torch.Tensor) -> None:
        self.copy(host, dev)

    def h2d(self, host: torch.Tensor, dev: torch.Tensor) -> None:
        self.copy(dev, host)

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Mismatch:
    trial: int
    count: int
    nbytes: int
    first_offset: int
    expected: int
    observed: int

    def describe(self) -> str:
        return (f"{self.count} of {self.nbytes} bytes differ, first at offset "
                f"{self.first_offset}: expected 0x{self.expected:02x}, "
                f"observed 0x{self.observed:02x}")


@dataclass
class CellResult:
    """passed/trials for one (target, direction, size, delay) cell, with the evidence."""

    target: str
    direction: str
    nbytes: int
    delay_cycles: int
    trials: int
    passed: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    failed_trials: int = 0
    elapsed_s: float = 0.0
    delay_s: float = 0.0

    @property
    def size(self) -> str:
        return format_size(self.nbytes)

    def first_failure(self) -> str:
        return self.mismatches[0].describe() if self.mismatches else ""

    def detail(self) -> dict[str, Any]:
        return {
            "nbytes": self.nbytes,
            "delay_cycles": self.delay_cycles,
            "elapsed_s": round(self.elapsed_s, 6),
            "imposed_delay_s": round(self.delay_s, 6),
            "mismatches": [vars(m) for m in self.mismatches],
        }


def compare(observed: torch.Tensor, expected: torch.Tensor, trial: int) -> Mismatch | None:
    """Every byte; the count and the first differing offset with both values."""
    diff = observed.ne(expected)
    count = int(diff.count_nonzero())
    if count == 0:
        return None
    first = int(diff.nonzero()[0, 0])
    return Mismatch(trial=trial, count=count, nbytes=int(observed.numel()),
                    first_offset=first, expected=int(expected[first]),
                    observed=int(observed[first]))


@dataclass
class _SizeBuffers:
    dev: torch.Tensor
    consumer: torch.Tensor
    base_dev: torch.Tensor
    base_cpu: torch.Tensor
    host: torch.Tensor


class Prober:
    """Runs trials against copy paths; owns the per-size buffers of one session."""

    def __init__(self, backend: StreamBackend, seed: int = 0x5EED) -> None:
        self.backend = backend
        self.seed = seed
        self._buffers: dict[int, _SizeBuffers] = {}
        self._host: dict[tuple[int, int], torch.Tensor] = {}
        self._warmed: set[tuple[int, str, int]] = set()
        self._counter = 0

    def buffers(self, nbytes: int) -> _SizeBuffers:
        if nbytes not in self._buffers:
            gen = torch.Generator().manual_seed(self.seed + nbytes)
            base_cpu = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
            # Device buffers start as base + 0; trial values are never 0 mod 256, so a stale
            # byte differs from the expected one in every position, from the first trial on.
            self._buffers[nbytes] = _SizeBuffers(
                dev=self.backend.to_device(base_cpu),
                consumer=self.backend.to_device(base_cpu),
                base_dev=self.backend.to_device(base_cpu),
                base_cpu=base_cpu,
                host=self.backend.host_buffer(nbytes),
            )
        return self._buffers[nbytes]

    def host_for(self, impl: CopyImpl, nbytes: int) -> torch.Tensor:
        key = (id(impl), nbytes)
        if key not in self._host:
            own = impl.host_buffer(nbytes)
            self._host[key] = own if own is not None else self.buffers(nbytes).host
        return self._host[key]

    def _next_value(self) -> int:
        self._counter += 1
        return 1 + self._counter % 127  # 1..127; w = v + 128 never equals v

    def trial(self, impl: CopyImpl, direction: str, nbytes: int, delay_cycles: int,
              index: int) -> Mismatch | None:
        buf = self.buffers(nbytes)
        host = self.host_for(impl, nbytes)
        backend = self.backend
        v = self._next_value()
        w = v + 128
        expected = buf.base_cpu + v
        if direction == "D2H":
            host.copy_(buf.base_cpu + w)  # poison: a copy that never lands is caught too
            with backend.side_stream():
                if delay_cycles:
                    backend.delay(delay_cycles)
                backend.add(buf.dev, buf.base_dev, v)  # the producer
                impl.d2h(buf.dev, host)
            backend.synchronize()
            return compare(host.cpu(), expected, index)
        if direction == "H2D":
            host.copy_(expected)
            with backend.side_stream():
                if delay_cycles:
                    backend.delay(delay_cycles)
                backend.add(buf.dev, buf.base_dev, w)  # the earlier writer
                impl.h2d(host, buf.dev)
                backend.consume(buf.consumer, buf.dev)  # the consumer on the same stream
            backend.synchronize()
            return compare(buf.consumer.cpu(), expected, index)
        raise ValueError(f"direction must be D2H or H2D, not {direction!r}")

    def run_cell(self, target: str, impl: CopyImpl, direction: str, nbytes: int,
                 delay_cycles: int, trials: int) -> CellResult:
        result = CellResult(target=target, direction=direction, nbytes=nbytes,
                            delay_cycles=delay_cycles, trials=trials)
        self.buffers(nbytes)
        self.host_for(impl, nbytes)
        if (id(impl), direction, nbytes) not in self._warmed:
            self.trial(impl, direction, nbytes, 0, -1)  # warm-up, not counted
            self._warmed.add((id(impl), direction, nbytes))
        self.backend.synchronize()
        started = time.perf_counter()
        for index in range(trials):
            mismatch = self.trial(impl, direction, nbytes, delay_cycles, index)
            if mismatch is None:
                result.passed += 1
            else:
                result.failed_trials += 1
                if len(result.mismatches) < MAX_MISMATCHES_KEPT:
                    result.mismatches.append(mismatch)
        result.elapsed_s = time.perf_counter() - started
        result.delay_s = trials * self.backend.delay_seconds(delay_cycles) if delay_cycles else 0
        return result
