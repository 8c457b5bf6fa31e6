"""PNG plots of a screening, written next to its JSON report: TTFT by step and size on log
axes with every observation shown (jittered points, median markers), each arm in its own
colour; and session wall time with one line per block pair joining its arms.

matplotlib is optional (``pip install 'pytest-sharedkv[plots]'``) and imported only here,
with the Agg canvas (no display, no pyplot state); without it no plot is written and the
reason is returned instead.
"""

from __future__ import annotations

import random
import statistics
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_sharedkv.perf.observations import ARMS, PLACEMENTS, STEPS, size_order, size_tokens
from pytest_sharedkv.perf.statistics import Analysis

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLOURS = {"OFF": "#7f7f7f", "ON": "#1f77b4", "NATIVE": "#ff7f0e"}
MISSING = "no plots: matplotlib is not installed (pip install 'pytest-sharedkv[plots]')"
JITTER = 0.06  # points spread over +-6% of their size on the log axis
SEED = 0


def plot_paths(report: Path) -> tuple[Path, Path]:
    """``<report stem>-perf-ttft.png`` and ``<report stem>-perf-sessions.png`` beside it."""
    return (report.with_name(f"{report.stem}-perf-ttft.png"),
            report.with_name(f"{report.stem}-perf-sessions.png"))


def _figure(columns: int) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(4.2 * columns, 4.2), layout="constrained")


def _arms(analysis: Analysis) -> list[str]:
    present = {c.arm for c in analysis.cells} | {c.arm for c in analysis.session_cells}
    return [a for a in ARMS if a in present] + sorted(present - set(ARMS))


def _x(size: str) -> float:
    tokens = size_tokens(size)
    return float(tokens) if tokens else 1.0


def ttft_figure(analysis: Analysis) -> Figure:
    rng = random.Random(SEED)
    arms = _arms(analysis)
    steps = [s for s in STEPS if any(c.step == s for c in analysis.cells)] or list(STEPS)
    figure = _figure(len(steps))
    axes = figure.subplots(1, len(steps), sharey=True, squeeze=False)[0]
    offsets = {arm: (i - (len(arms) - 1) / 2) * 2.2 * JITTER for i, arm in enumerate(arms)}
    for ax, step in zip(axes, steps, strict=True):
        for arm in arms:
            mine = [c for c in analysis.cells if c.step == step and c.arm == arm]
            if not mine:
                continue
            centre = {c.size: _x(c.size) * (1 + offsets[arm]) for c in mine}
            xs = [centre[c.size] * (1 + rng.uniform(-JITTER, JITTER) / 2)
                  for c in mine for _ in c.observations]
            ys = [o.ttft_s for c in mine for o in c.observations]
            ax.scatter(xs, ys, s=10, alpha=0.45, color=COLOURS.get(arm, "black"),
                       linewidths=0)
            ax.scatter([centre[c.size] for c in mine], [c.median_ttft_s for c in mine],
                       s=90, marker="_", linewidths=2.5, color=COLOURS.get(arm, "black"),
                       label=f"{arm} (median)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        sizes = sorted({c.size for c in analysis.cells}, key=size_order)
        ax.set_xticks([_x(s) for s in sizes], labels=sizes)
        ax.minorticks_off()
        ax.set_title(step)
        ax.set_xlabel("prompt size")
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_ylabel("TTFT s (every observation)")
    axes[0].legend(loc="best", fontsize="small")
    figure.suptitle("TTFT by step and size, every measured observation")
    return figure


def sessions_figure(analysis: Analysis) -> Figure:
    rng = random.Random(SEED)
    arms = [a for a in _arms(analysis) if any(c.arm == a for c in analysis.session_cells)]
    placements = [p for p in PLACEMENTS if any(c.placement == p
                                               for c in analysis.session_cells)]
    figure = _figure(max(len(placements), 1))
    axes = figure.subplots(1, max(len(placements), 1), sharey=True, squeeze=False)[0]
    for ax, placement in zip(axes, placements, strict=False):
        per_pair: dict[int, dict[str, float]] = defaultdict(dict)
        for i, arm in enumerate(arms):
            cell = next((c for c in analysis.session_cells
                         if c.arm == arm and c.placement == placement), None)
            if cell is None:
                continue
            ax.scatter([i + rng.uniform(-0.08, 0.08) for _ in cell.sessions],
                       [s.wall_s for s in cell.sessions], s=12, alpha=0.45,
                       color=COLOURS.get(arm, "black"), linewidths=0)
            walls: dict[int, list[float]] = defaultdict(list)
            for s in cell.sessions:
                walls[s.pair].append(s.wall_s)
            for pair, values in walls.items():
                per_pair[pair][arm] = statistics.median(values)
        for pair, medians in sorted(per_pair.items()):
            xs = [i for i, arm in enumerate(arms) if arm in medians]
            ax.plot(xs, [medians[arms[i]] for i in xs], marker="o", color="black",
                    alpha=0.6, linewidth=1, label=f"block pair {pair}")
        ax.set_xticks(range(len(arms)), labels=arms)
        ax.set_xlim(-0.5, len(arms) - 0.5)
        ax.set_title(f"{placement} placement")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("session wall s (six turns)")
    figure.suptitle("session wall time; lines join one block pair's medians")
    return figure


def write_plots(analysis: Analysis, report: Path) -> tuple[list[Path], str | None]:
    """The plots written next to REPORT (none without data), or none and the reason."""
    try:
        import matplotlib  # noqa: F401  (only to say why there are no plots)
    except ImportError:
        return [], MISSING
    ttft, sessions = plot_paths(report)
    written: list[Path] = []
    figures: list[tuple[Path, Any]] = []
    if analysis.cells:
        figures.append((ttft, ttft_figure(analysis)))
    if analysis.session_cells:
        figures.append((sessions, sessions_figure(analysis)))
    for path, figure in figures:
        try:
            figure.savefig(path, dpi=110)
        except OSError as exc:
            return written, f"no plot {path}: {exc}"
        written.append(path)
    return written, None if written else "no plots: the run recorded no observations"
