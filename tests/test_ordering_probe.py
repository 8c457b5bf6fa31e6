"""The probe engine's verdict logic, proven on the simulated-stream test double (no GPU)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from pytest_sharedkv.config.options import Settings
from pytest_sharedkv.ordering.cells import Cell, format_cycles
from pytest_sharedkv.ordering.probe import Prober, compare
from pytest_sharedkv.ordering.session import OrderingSession
from pytest_sharedkv.ordering.simulated import SimOrderedCopy, SimRawCopy, SimulatedBackend
from pytest_sharedkv.ordering.targets import builtin_registry
from pytest_sharedkv.report.records import Bundle, ResultSink

DELAY = 5_000_000  # 5 ms on the simulated 1 GHz clock
SIZES = (4096, 65536)


@pytest.fixture
def backend() -> Iterator[SimulatedBackend]:
    sim = SimulatedBackend()
    yield sim
    sim.close()


def test_negative_control_fails_under_delay_ordered_copy_passes(backend: SimulatedBackend
                                                               ) -> None:
    prober = Prober(backend)
    raw, ordered = SimRawCopy(backend, SIZES), SimOrderedCopy(backend, SIZES)
    for direction in ("D2H", "H2D"):
        stale = prober.run_cell("raw", raw, direction, 4096, DELAY, trials=4)
        assert (stale.passed, stale.failed_trials) == (0, 4)
        assert stale.mismatches[0].count == 4096, "every byte of a stale copy differs"
        good = prober.run_cell("ordered", ordered, direction, 4096, DELAY, trials=4)
        assert (good.passed, good.failed_trials) == (4, 0)
        assert good.delay_s == pytest.approx(4 * DELAY / 1e9)


class _CorruptOneByte(SimOrderedCopy):
    """An ordered copy that flips one byte: the checker must name it exactly."""

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        super().copy(dst, src)

        def flip() -> None:
            dst[1234] ^= 0xFF

        self.backend.enqueue(flip)


def test_mismatch_names_count_offset_and_values(backend: SimulatedBackend) -> None:
    prober = Prober(backend)
    result = prober.run_cell("corrupt", _CorruptOneByte(backend, SIZES), "D2H", 4096, 0, 2)
    assert result.failed_trials == 2
    first = result.mismatches[0]
    assert (first.count, first.first_offset, first.nbytes) == (1, 1234, 4096)
    assert first.observed == first.expected ^ 0xFF
    assert first.describe().startswith("1 of 4096 bytes differ, first at offset 1234: expected 0x")


def test_compare_every_byte() -> None:
    expected = torch.arange(256, dtype=torch.uint8).repeat(16)
    observed = expected.clone()
    assert compare(observed, expected, 0) is None
    observed[-1] = 7
    mismatch = compare(observed, expected, 3)
    assert mismatch is not None
    assert (mismatch.count, mismatch.first_offset, mismatch.observed, mismatch.trial) == (
        1, 4095, 7, 3)


def _session(backend: SimulatedBackend, trials: int = 3) -> OrderingSession:
    settings = Settings(trials=trials, delay_cycles=DELAY, sizes=SIZES)
    return OrderingSession(backend, builtin_registry(), settings)


def test_matrix_accounting_and_verdicts(backend: SimulatedBackend) -> None:
    session = _session(backend)
    bundle = Bundle()
    sink = ResultSink("node", bundle)
    verdicts = {name: session.judge(Cell(name, "H2D", 4096), sink)
                for name in ("sim-raw", "sim-ordered", "sim-unordered")}
    assert verdicts["sim-raw"].ok, verdicts["sim-raw"].message
    assert "probe is sensitive" in verdicts["sim-raw"].message
    assert verdicts["sim-ordered"].ok
    bad = verdicts["sim-unordered"]
    assert not bad.ok
    assert "NOT stream-ordered for H2D 4KiB, delay 5e6 cycles: 3/3 delayed checks saw stale" \
        in bad.message
    assert "remedy:" in bad.message
    # one check per (target, delay); the gate (raw, delayed) is recorded once, not per target
    keys = [(c.key["target"], c.key["delay"]) for c in bundle.checks]
    assert sorted(keys) == sorted([("sim-raw", "5e6"), ("sim-raw", "0"),
                                   ("sim-ordered", "5e6"), ("sim-ordered", "0"),
                                   ("sim-unordered", "5e6"), ("sim-unordered", "0")])
    assert all(c.trials == 3 for c in bundle.checks)
    assert all(c.detail["simulated"] is True for c in bundle.checks)
    session.close()


def test_blind_probe_voids_every_cell() -> None:
    blind = SimulatedBackend(blocking_default_stream=True)
    session = _session(blind)
    sink = ResultSink("node", Bundle())
    negative = session.judge(Cell("sim-raw", "D2H", 4096), sink)
    assert not negative.ok
    assert "probe NOT sensitive for D2H 4KiB" in negative.message
    for name in ("sim-ordered", "sim-unordered"):
        verdict = session.judge(Cell(name, "D2H", 4096), sink)
        assert not verdict.ok
        assert verdict.message.startswith("VOID: probe NOT sensitive")
    session.close()


@pytest.mark.parametrize(("cycles", "text"), [(100_000_000, "1e8"), (0, "0"),
                                              (25_000_000, "25000000"), (5000, "5e3")])
def test_format_cycles(cycles: int, text: str) -> None:
    assert format_cycles(cycles) == text
