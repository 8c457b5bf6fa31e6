"""Whether two runs' values for one cell differ by more than their own noise.

``compare`` calls a cell slower or faster only when the change passes its threshold AND
this test: pyperf's ``compare_to`` does the same (a two-sample t-test; "Not significant"
otherwise), because two runs of the same software differ by more than 10% in small cells
(on the H200, 4 of 16 TTFT cells of an A/A pair). The samples are one value per block pair
(the block pair is the independent unit, as in ``statistics``), compared as logarithms, so
the test is on the ratio; Welch's t allows the runs different spreads. Plain ``math`` and a
table of Student's t: nothing heavy is imported.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

MIN_PAIRS = 2  # a side with one block pair has no spread to test against
# one-sided 95% critical values of Student's t, df 1..30 (beyond: the normal's 1.645)
T_95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812,
        1.796, 1.782, 1.771, 1.761, 1.753, 1.746, 1.740, 1.734, 1.729, 1.725,
        1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697)
NORMAL_95 = 1.645


def t_critical(df: float) -> float:
    """The one-sided 95% critical value at DF degrees of freedom, rounded down (a
    fractional Welch df gets the larger, more cautious value)."""
    whole = max(math.floor(df + 1e-6), 1)  # 1.9999999 is 2
    return T_95[whole - 1] if whole <= len(T_95) else NORMAL_95


@dataclass(frozen=True)
class Welch:
    t: float  # positive: AFTER larger
    df: float
    critical: float

    def shows(self, slower: bool) -> bool:
        """One-sided, in the direction asked: AFTER significantly slower (larger), or
        significantly faster."""
        return self.t > self.critical if slower else -self.t > self.critical

    def describe(self, slower: bool) -> str:
        t = "inf" if math.isinf(self.t) else f"{self.t:.2f}"
        need = f"t > {self.critical:.2f}" if slower else f"t < {-self.critical:.2f}"
        return f"t={t}, df={self.df:.1f}, needs {need}"


def welch(before: Sequence[float], after: Sequence[float]) -> Welch | None:
    """Welch's t on the logs of BEFORE and AFTER (positive values, one per block pair), or
    None when a side has fewer than ``MIN_PAIRS`` values."""
    if len(before) < MIN_PAIRS or len(after) < MIN_PAIRS:
        return None
    a, b = [math.log(v) for v in before], [math.log(v) for v in after]
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff = statistics.fmean(b) - statistics.fmean(a)
    if va + vb == 0:  # no spread on either side: any difference is beyond the noise
        t = 0.0 if diff == 0 else math.copysign(math.inf, diff)
        return Welch(t, float(len(a) + len(b) - 2), t_critical(len(a) + len(b) - 2))
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return Welch(diff / math.sqrt(va + vb), df, t_critical(df))
