"""The ordering matrix's cells and how delays are written (light: used at collection)."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_sharedkv.config.options import format_size


def format_cycles(cycles: int) -> str:
    """1e8 rather than 100000000: how people write delays."""
    if cycles >= 1000:
        exponent = len(str(cycles)) - 1
        mantissa, rest = divmod(cycles, 10**exponent)
        if rest == 0:
            return f"{mantissa}e{exponent}"
    return str(cycles)


@dataclass(frozen=True)
class Cell:
    target: str
    direction: str
    nbytes: int

    @property
    def id(self) -> str:
        return f"{self.target}-{self.direction}-{format_size(self.nbytes)}"
