"""The real backend: torch CUDA streams, ``torch.cuda._sleep`` delays, and libcudart via ctypes.

The raw CUDA runtime calls come from ``host.cudart``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

CALIBRATION_REPS = 3


class CudaBackend:
    name = "cuda"
    simulated = False

    def __init__(self, device: int = 0) -> None:
        self.device = torch.device("cuda", device)
        torch.cuda.set_device(self.device)
        # PyTorch creates side streams non-blocking with respect to the legacy default stream,
        # which is exactly the condition under which a stream-less cudaMemcpy races.
        self.stream = torch.cuda.Stream(device=self.device)
        self._delay_s: dict[int, float] = {}
        self._warm_up()

    def _warm_up(self) -> None:
        """Load the probe's own kernels now: a first launch may synchronize the device."""
        scratch = torch.zeros(4096, dtype=torch.uint8, device=self.device)
        with self.side_stream():
            self.delay(1000)
            self.add(scratch, scratch, 1)
            self.consume(scratch, scratch.clone())
        self.synchronize()

    def describe(self) -> str:
        props = torch.cuda.get_device_properties(self.device)
        return (f"{props.name} (cuda:{self.device.index}), torch {torch.__version__}, "
                f"CUDA {torch.version.cuda}")

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def to_device(self, cpu: torch.Tensor) -> torch.Tensor:
        out = cpu.to(self.device)
        torch.cuda.synchronize(self.device)
        return out

    @contextmanager
    def side_stream(self) -> Iterator[torch.cuda.Stream]:
        with torch.cuda.stream(self.stream):
            yield self.stream

    def delay(self, cycles: int) -> None:
        torch.cuda._sleep(cycles)

    def add(self, out: torch.Tensor, base: torch.Tensor, value: int) -> None:
        torch.add(base, value, out=out)

    def consume(self, out: torch.Tensor, src: torch.Tensor) -> None:
        out.copy_(src)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def delay_seconds(self, cycles: int) -> float:
        """How long ``_sleep(cycles)`` takes on this device (median of a few CUDA-event timings)."""
        if cycles not in self._delay_s:
            times = []
            with self.side_stream():
                for _ in range(CALIBRATION_REPS):
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    start.record()
                    torch.cuda._sleep(cycles)
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end) / 1000.0)
            self._delay_s[cycles] = sorted(times)[len(times) // 2]
        return self._delay_s[cycles]
