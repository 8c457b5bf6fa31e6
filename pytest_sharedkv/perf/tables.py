"""Markdown tables of a screening, each with its verdict line: the medians (every number
with the observations and block pairs behind it), the paired ON/OFF ratios, the floor
ratios with the pool hits behind them, and the sessions."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_sharedkv.perf.floor import floor_ratio, invalid
from pytest_sharedkv.perf.hits import (
    cached_share,
    counted,
    l2_origin,
    l2_reloads,
    partial_hits,
    pooled_cross,
)
from pytest_sharedkv.perf.observations import STEPS, Observation, arm_order, size_order
from pytest_sharedkv.perf.statistics import (
    MIN_PAIRS,
    Analysis,
    Cell,
    PairedRatio,
    SessionRatio,
)
from pytest_sharedkv.report.markdown import markdown_table

SHOWN_REFUSALS = 3


def seconds(value: float) -> str:
    return f"{value:.3f}"


def behind(n: int, pairs: int) -> str:
    return f"n={n}, {pairs} pair{'s' if pairs != 1 else ''}"


def cell_text(cell: Cell | None) -> str:
    if cell is None:
        return "-"
    return f"{seconds(cell.median_ttft_s)} ({behind(cell.n, cell.block_pairs)})"


def median_table(analysis: Analysis) -> list[str]:
    keys = list(dict.fromkeys((c.size, c.arm) for c in analysis.cells))
    if not keys:
        return []
    rows = [[size, arm, *(cell_text(analysis.cell(size, arm, step)) for step in STEPS)]
            for size, arm in keys]
    return ["TTFT median s per size x arm x step (every measured observation; n "
            "observations, block pairs):",
            *markdown_table(["size", "arm", *STEPS], rows)]


def decode_table(analysis: Analysis) -> list[str]:
    keys = list(dict.fromkeys((c.size, c.arm) for c in analysis.cells
                              if c.median_decode_tok_s is not None))
    if not keys:
        return []

    def rate(cell: Cell | None) -> str:
        if cell is None or cell.median_decode_tok_s is None:
            return "-"
        return f"{cell.median_decode_tok_s:.1f} (n={cell.n})"

    rows = [[size, arm, *(rate(analysis.cell(size, arm, step)) for step in STEPS)]
            for size, arm in keys]
    return ["decode rate median tokens/s (N_out - 1 over first to last token):",
            *markdown_table(["size", "arm", *STEPS], rows)]


def _judged(ratio: PairedRatio | SessionRatio) -> str:
    if ratio.interval is None:
        return "not judged"
    if ratio.interval.high < 1:
        return "faster"
    if ratio.interval.low > 1:
        return "slower"
    return "no difference shown"


NO_INTERVAL = "-"


def _interval(ratio: PairedRatio | SessionRatio) -> str:
    return str(ratio.interval) if ratio.interval else NO_INTERVAL


def _no_interval_note(ratios: Sequence[PairedRatio | SessionRatio]) -> list[str]:
    """Why the rows marked "-" have no interval, said once under the table, not per row."""
    pairs = sorted({r.block_pairs for r in ratios if r.interval is None})
    if not pairs:
        return []
    return [f'no interval ("{NO_INTERVAL}" above): {" or ".join(map(str, pairs))} block pairs '
            f"(an interval needs >= {MIN_PAIRS})"]


def treatment_pairs_line(analysis: Analysis) -> list[str]:
    """How many block pairs hold each treatment, and so which of its ratios can have an
    interval: a merge of OFF-ON and OFF-NATIVE runs gives each its own count."""
    pairs = analysis.treatment_pairs
    if not pairs:
        return []
    parts = [f"{arm}: {n} block pair{'s' if n != 1 else ''}"
             + (": no interval" if n < MIN_PAIRS else "") for arm, n in pairs.items()]
    needs = f" (an interval needs >= {MIN_PAIRS})" if min(pairs.values()) < MIN_PAIRS else ""
    return ["block pairs per treatment (its ratios use the pairs that hold it): "
            + ", ".join(parts) + needs]


def ratio_table(analysis: Analysis) -> list[str]:
    rows = [[r.size, r.step, r.arms, f"{r.median:.3f}x", str(r.block_pairs), str(r.requests),
             _interval(r), _judged(r)] for r in analysis.ratios]
    if not rows:
        return []
    return ["paired TTFT ratio: one per block pair (the median over its requests), their "
            "median, and a percentile bootstrap interval over block pairs (with few pairs it "
            "cannot be wider than their range):",
            *markdown_table(["size", "step", "ratio", "median", "block pairs", "requests",
                             "interval", "judged"], rows),
            *_no_interval_note(analysis.ratios), *treatment_pairs_line(analysis)]


def refusal_line(analysis: Analysis) -> str:
    refusals = analysis.pairing.refusals
    shown = "; ".join(str(r) for r in refusals[:SHOWN_REFUSALS])
    more = f"; and {len(refusals) - SHOWN_REFUSALS} more" if len(refusals) > SHOWN_REFUSALS \
        else ""
    return f"{len(refusals)} observations refused pairing: {shown}{more}"


def _partial(analysis: Analysis) -> list[Observation]:
    return partial_hits(_observed(analysis), analysis.run.chunk_tokens)


def ttft_verdict(analysis: Analysis) -> str:
    if analysis.pairing.refusals:
        return f"VERDICT perf: NOT JUDGED: {refusal_line(analysis)}"
    cross = [r for r in analysis.ratios if r.step == "cross"]
    if not cross:
        return "VERDICT perf: NOT JUDGED: no paired cross-replica requests"
    partial = _partial(analysis)

    def part(r: PairedRatio) -> str:
        missed = [o for o in partial if (o.size, o.arm) == (r.size, r.treatment)]
        if missed:  # a recompute inside the ON side: not the transfer the ratio means
            return (f"{r.size} {r.arms} {r.median:.2f}x: NOT JUDGED ({len(missed)} ON "
                    "requests were partial pool hits)")
        return f"{r.size} {r.arms} {r.median:.2f}x, {r.spread}: {_judged(r)}"

    return "VERDICT perf: cross-replica TTFT " + "; ".join(part(r) for r in cross)


def floor_table(analysis: Analysis) -> list[str]:
    floor = analysis.run.floor
    if floor is None:
        return []
    rows = []
    for c in analysis.cells:
        if c.step != "cross":
            continue
        tokens = int(c.median_prompt_tokens)
        below = len(invalid(c.observations, floor))
        partial = len(partial_hits(c.observations, analysis.run.chunk_tokens))
        marks = ([f"INVALID ({below} of {c.n} below the floor)"] if below else []) + \
            ([f"PARTIAL ({partial} of {c.n} not full pool hits)"] if partial else [])
        share = cached_share(c.observations)
        layout = floor.layout_seconds(tokens)
        l2 = floor.l2_seconds(tokens)
        rows.append([c.size, c.arm, f"{tokens:,}", seconds(floor.seconds(tokens)),
                     seconds(c.median_ttft_s),
                     f"{floor_ratio(c.median_ttft_s, tokens, floor):.1f}x",
                     *([] if layout is None else [seconds(layout),
                                                  f"{c.median_ttft_s / layout:.2f}x"]),
                     *([] if l2 is None else [seconds(l2), f"{c.median_ttft_s / l2:.2f}x"]),
                     "-" if share is None else f"{share:.0%}", "; ".join(marks) or "ok"])
    if not rows:
        return []
    stored = floor.stored_bytes_per_token
    layout_head = [] if stored is None else ["layout floor s", "x layout floor"]
    layout_text = ("" if stored is None else
                   f"; layout floor: the {stored:,} bytes a token the pool stores as the "
                   "engine lays the KV out, at the same rate (what a full hit moves)")
    if floor.l2_gb_s:
        layout_head += ["L2 floor s", "x L2 floor"]
        layout_text += (f"; L2 floor (the HOSTS arm's extra hop): the "
                        f"{floor.stored_or_kv_bytes_per_token:,} bytes a token the pool "
                        f"stores at the L2's measured read rate, {floor.l2_gb_s:.2f} GB/s")
    return [f"cross-replica TTFT / physical floor ({floor.kv_bytes_per_token:,} KV bytes a "
            f"token + {floor.recurrent_bytes_per_sequence:,} recurrent bytes a sequence at "
            f"{floor.h2d_gb_s:.1f} GB/s host-to-device; {floor.source}{layout_text}):",
            *markdown_table(["size", "arm", "prompt tokens", "floor s", "cross median s",
                             "x floor", *layout_head, "cached (median)", "mark"], rows)]


def floor_verdict(analysis: Analysis) -> str:
    floor = analysis.run.floor
    if floor is None:
        return ("NOTE floor: not measured in this run, so no cross-replica TTFT was checked "
                "against the physical floor")
    cross = [o for c in analysis.cells if c.step == "cross" for o in c.observations]
    if not cross:
        return "NOTE floor: no cross-replica observations to check"
    bad = invalid(cross, floor)
    if bad:
        first = bad[0]
        return (f"VERDICT floor: INVALID: {len(bad)} of {len(cross)} cross-replica TTFTs are "
                f"below the physical floor, so the receiver's own prefix cache answered, not "
                f"the pool (first: request {first.request}, block {first.block}, arm "
                f"{first.arm}: {seconds(first.ttft_s)} s < floor "
                f"{seconds(floor.seconds(first.prompt_tokens))} s)")
    low = min(cross, key=lambda o: floor_ratio(o.ttft_s, o.prompt_tokens, floor))
    return (f"VERDICT floor: all {len(cross)} cross-replica TTFTs lie above the physical "
            f"floor (lowest {floor_ratio(low.ttft_s, low.prompt_tokens, floor):.1f}x, "
            f"{low.size} {low.arm})")


def _observed(analysis: Analysis) -> list[Observation]:
    """Every observation the analysis's cells hold."""
    return [o for c in analysis.cells for o in c.observations]


def hit_verdict(analysis: Analysis) -> str | None:
    """Whether the ON arm's cross-replica requests came from the pool whole (None: no such
    requests, e.g. external endpoints or a run without an ON block)."""
    pooled = pooled_cross(_observed(analysis))
    if not pooled:
        return None
    chunk, known = analysis.run.chunk_tokens, counted(pooled)
    named = " and ".join(sorted({o.arm for o in pooled}, key=arm_order))  # ON, HOSTS
    if not chunk or not known:
        why = "no chunk size was recorded" if not chunk else \
            "the engine reported no cached-token counts"
        return (f"NOTE hits: {why}, so no {named} cross-replica request was checked for a "
                "full pool hit")
    bad = partial_hits(pooled, chunk)
    origin = l2_origin(pooled)
    if not bad:
        return (f"VERDICT hits: all {len(known)} {named} cross-replica requests were full pool "
                "hits (every whole chunk of the prompt from a cache)"
                + (f"; {origin}" if origin else ""))
    parts = []
    for size in sorted({o.size for o in bad}, key=size_order):
        mine = [o for o in known if o.size == size]
        share = cached_share(mine)
        parts.append(f"{size}: {sum(o.size == size for o in bad)} of {len(mine)}, median "
                     f"{0.0 if share is None else share:.0%} of the prompt from a cache")
    return (f"VERDICT hits: PARTIAL: {len(bad)} of {len(known)} {named} cross-replica requests "
            f"were not full pool hits ({'; '.join(parts)}), so their TTFT includes a "
            "recompute and their cross ratio is not judged. Either the pool evicted part of "
            "a size's prompts before B asked (give the ON arm a pool larger than what that "
            "size's requests store) or B's lookup missed (run the service tier)")


def session_table(analysis: Analysis) -> list[str]:
    if not analysis.session_cells:
        return []
    rows = [[c.arm, c.placement, seconds(c.median_wall_s), str(c.n), str(c.block_pairs)]
            for c in analysis.session_cells]
    lines = ["session wall time (six turns), median s:",
             *markdown_table(["arm", "placement", "median wall s", "sessions", "block pairs"],
                             rows)]
    ratios = [[r.subject, r.ratio, f"{r.median:.3f}x", str(r.block_pairs), _interval(r),
               _judged(r)] for r in analysis.session_ratios]
    if ratios:
        lines += ["", "session wall time paired per block pair:",
                  *markdown_table(["within", "ratio", "median", "block pairs", "interval",
                                   "judged"], ratios),
                  *_no_interval_note(analysis.session_ratios)]
    return lines


def session_verdict(analysis: Analysis) -> str:
    if not analysis.session_ratios:
        return "NOTE sessions: no paired session wall times"
    parts = [f"{r.ratio} {r.subject} {r.median:.2f}x, {r.spread}: {_judged(r)}"
             for r in analysis.session_ratios]
    return "VERDICT sessions: " + "; ".join(parts)


def report_lines(analysis: Analysis) -> list[str]:
    """Every table with its verdict, separated by blank lines."""
    blocks = [
        [*median_table(analysis), *([""] if analysis.ratios else []), *ratio_table(analysis),
         ttft_verdict(analysis)],
        [*floor_table(analysis), floor_verdict(analysis),
         *[line for line in [hit_verdict(analysis), l2_reloads(_observed(analysis))]
           if line]],
        [*session_table(analysis), session_verdict(analysis)],
        decode_table(analysis),
    ]
    lines: list[str] = [model_note(analysis)] if analysis.run.model else []
    for block in blocks:
        if block:
            lines += ([""] if lines else []) + block
    return lines


def model_note(analysis: Analysis) -> str:
    """What the screening served: its weights and compute (random weights of real compute
    time the 27B's work, not its answers), and why that model."""
    model = analysis.run.model
    return (f"NOTE model: {model.get('kind', '?')}: weights {model.get('weights', '?')}, "
            f"compute {model.get('compute', '?')} ({model.get('why', '?')})")

