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

COLOURS = {"OFF": "#7f7f7f", "ON": "#1f77b4", "HOSTS": "#2ca02c", "NATIVE": "#ff7f0e"}
MISSING = "no plots: matplotlib is not installed (pip install 'pytest-sharedkv[plots]')"
SEED = 0


def plot_paths(report: Path) -> tuple[Path, Path]:
    """``<report stem>-perf-ttft.png`` and ``<report stem>-perf-sessions.png`` beside it."""
    return (report.with_name(f"{report.stem}-perf-ttft.png"),
            report.with_name(f"{report.stem}-perf-sessions.png"))


def _figure(columns: int) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(4.2 * columns, 4.6), layout="constrained")


def _arms(analysis: Analysis) -> list[str]:
    present = {c.arm for c in analysis.cells} | {c.arm for c in analysis.session_cells}
    return [a for a in ARMS if a in present] + sorted(present - set(ARMS))


def _pairs(analysis: Analysis, arm: str) -> str:
    """"; N block pairs" of ARM for its legend entry: arms of a merge may hold different
    numbers of pairs (OFF-ON runs beside an OFF-NATIVE one), and the points show so."""
    n = analysis.arm_pairs.get(arm)
    return "" if n is None else f"; {n} block pair{'s' if n != 1 else ''}"


def _x(size: str) -> float:
    tokens = size_tokens(size)
    return float(tokens) if tokens else 1.0


def title(analysis: Analysis, what: str) -> str:
    """WHAT, then the model, provider and engine the numbers came from: a test double's
    times say nothing of a GPU, and the title says so."""
    run = analysis.run
    engine = run.engine
    provider = engine.get("provider", "not recorded")
    double = "stub" in provider or "test double" in provider
    versions = ", ".join(f"{name} {engine[name]}" for name in ("vllm", "lmcache")
                         if name in engine and not double)
    where = engine.get("gpu", "")
    kind = run.model.get("kind") if run.model else None
    weights = run.model.get("weights", "") if run.model else ""
    model = (f"model {kind}" + (" (random weights, real compute)" if "random" in weights
                                and kind == "27b-compute" else "")
             + (f", digest {run.model_digest}" if run.model_digest != kind else "")
             ) if kind else f"model {run.model_digest}"
    parts = [model, f"provider {provider}",
             "TEST DOUBLE: no engine, no GPU; times are not a GPU's" if double else
             f"engine {versions or 'versions not recorded'}" + (f" on {where}" if where
                                                                 else "")]
    if run.runs:
        parts.append(f"merged from {len(run.runs)} runs")
    return f"{what}\n" + "; ".join(parts)


def _log_ticks(ax: Any) -> None:
    """Labels enough to read a value off the log axis: 1-2-5 in each decade, every integer
    multiple where the axis spans less than a decade, minor ticks unlabelled."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    low, high = ax.get_ylim()
    subs = (1.0, 2.0, 5.0) if high / low >= 10 else tuple(float(i) for i in range(1, 10))
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_locator(LogLocator(base=10, subs=tuple(float(i) for i in range(1, 10))))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(low, high)


ARM_SPACING = 0.45  # arms of one size side by side, this far apart in log2 (prompt size)
JITTER_LOG2 = 0.08


def _floor_points(analysis: Analysis) -> dict[str, tuple[float, int]]:
    """Per size: (the transfer floor in seconds, the tokens it is for) at the median prompt
    of that size's cross-replica requests (any step where none crossed)."""
    floor = analysis.run.floor
    if floor is None:
        return {}
    out: dict[str, tuple[float, int]] = {}
    for size in sorted({c.size for c in analysis.cells}, key=size_order):
        mine = [c for c in analysis.cells if c.size == size and c.step == "cross"] or \
            [c for c in analysis.cells if c.size == size]
        tokens = int(statistics.median(c.median_prompt_tokens for c in mine))
        out[size] = (floor.seconds(tokens), tokens)
    return out


def ttft_figure(analysis: Analysis) -> Figure:
    rng = random.Random(SEED)
    arms = _arms(analysis)
    steps = [s for s in STEPS if any(c.step == s for c in analysis.cells)] or list(STEPS)
    figure = _figure(len(steps))
    axes = figure.subplots(1, len(steps), sharey=True, squeeze=False)[0]
    offsets = {arm: (i - (len(arms) - 1) / 2) * ARM_SPACING for i, arm in enumerate(arms)}
    sizes = sorted({c.size for c in analysis.cells}, key=size_order)
    floors = _floor_points(analysis)
    half = ARM_SPACING * max(len(arms), 2) / 2
    for ax, step in zip(axes, steps, strict=True):
        for arm in arms:
            mine = [c for c in analysis.cells if c.step == step and c.arm == arm]
            if not mine:
                continue
            centre = {c.size: _x(c.size) * 2 ** offsets[arm] for c in mine}
            xs = [centre[c.size] * 2 ** rng.uniform(-JITTER_LOG2, JITTER_LOG2)
                  for c in mine for _ in c.observations]
            ys = [o.ttft_s for c in mine for o in c.observations]
            ax.scatter(xs, ys, s=10, alpha=0.45, color=COLOURS.get(arm, "black"),
                       linewidths=0)
            ax.scatter([centre[c.size] for c in mine], [c.median_ttft_s for c in mine],
                       s=140, marker="_", linewidths=2.5, color=COLOURS.get(arm, "black"),
                       label=f"{arm} (median{_pairs(analysis, arm)})")
        if step == "cross":
            for i, size in enumerate(s for s in sizes if s in floors):
                seconds, _ = floors[size]
                ax.plot([_x(size) * 2 ** -half, _x(size) * 2 ** half], [seconds, seconds],
                        color="#d62728", linestyle="--", linewidth=1.5,
                        label="transfer floor (KV at the measured H2D rate)" if i == 0
                        else None)
                ax.annotate(f"floor {seconds:.3g} s", (_x(size), seconds), xytext=(0, 3),
                            textcoords="offset points", ha="center", va="bottom",
                            fontsize="x-small", color="#d62728")
                layout = analysis.run.floor.layout_seconds(floors[size][1]) \
                    if analysis.run.floor is not None else None
                if layout is not None:
                    ax.plot([_x(size) * 2 ** -half, _x(size) * 2 ** half], [layout, layout],
                            color="#ff7f0e", linestyle=":", linewidth=1.5,
                            label="layout floor (the bytes the pool stores, same rate)"
                            if i == 0 else None)
                    ax.annotate(f"layout {layout:.3g} s", (_x(size), layout), xytext=(0, -3),
                                textcoords="offset points", ha="center", va="top",
                                fontsize="x-small", color="#ff7f0e")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks([_x(s) for s in sizes], labels=sizes)
        ax.xaxis.set_minor_locator(_no_ticks())
        if sizes:
            ax.set_xlim(_x(sizes[0]) * 2 ** -(half + 0.6), _x(sizes[-1]) * 2 ** (half + 0.6))
        ax.set_title(step)
        ax.set_xlabel("prompt size")
        ax.grid(True, which="major", alpha=0.3)
        ax.grid(True, which="minor", axis="y", alpha=0.1)
    _log_ticks(axes[0])  # the axes share y: one locator serves all
    axes[0].set_ylabel("TTFT s (every observation)")
    labelled: dict[str, Any] = {}
    for ax in axes:  # every arm and the floor once, below the panels
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            labelled.setdefault(label, handle)
    figure.legend(list(labelled.values()), list(labelled), loc="outside lower center",
                  ncols=max(len(labelled), 1), fontsize="small")
    figure.suptitle(title(analysis, "TTFT by step and size, every measured observation "
                                    "(arms side by side)"))
    return figure


def _no_ticks() -> Any:
    from matplotlib.ticker import NullLocator

    return NullLocator()


def sessions_figure(analysis: Analysis) -> Figure:
    from matplotlib.lines import Line2D

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
        for _, medians in sorted(per_pair.items()):
            xs = [i for i, arm in enumerate(arms) if arm in medians]
            ax.plot(xs, [medians[arms[i]] for i in xs], marker="o", color="black",
                    alpha=0.6, linewidth=1)
        ax.set_xticks(range(len(arms)), labels=arms)
        ax.set_xlim(-0.5, len(arms) - 0.5)
        ax.set_title(f"{placement} placement")
        ax.grid(True, axis="y", alpha=0.3)
    handles = [Line2D([], [], marker="o", linestyle="", color=COLOURS.get(arm, "black"),
                      alpha=0.6, label=f"{arm}: one session{_pairs(analysis, arm)}")
               for arm in arms]
    handles.append(Line2D([], [], marker="o", color="black", alpha=0.6, linewidth=1,
                          label="one block pair's medians, joined"))
    axes[0].legend(handles=handles, loc="best", fontsize="small")
    axes[0].set_ylabel("session wall s (six turns)")
    figure.suptitle(title(analysis, "session wall time; lines join one block pair's medians"))
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
