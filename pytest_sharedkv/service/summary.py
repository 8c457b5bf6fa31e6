"""The service tier's summary: per pair, a table of size x step (exact answers, cached
tokens, the engines' own and pool hit counters, wall time), one VERDICT line, and a line
each for the cells of their own (the identical requests, the block boundaries, the L2
cells).

A pair whose sensitivity gate is VOID or CONFOUNDED gets VOID unless answers diverged (then
the divergences stand and the exact answers are said to prove nothing); external endpoints
get "sensitivity unproven"; otherwise the verdict counts the requests that diverged after
cross-replica hits. A remedy is said as proven only where a run proved it: a triage cell of
this run (``--sharedkv-triage``), the other allocator's exact pair in this run, or the
report given with ``--sharedkv-baseline``; otherwise it is a suggestion, said as one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence, Set
from typing import Any

from pytest_sharedkv.report.markdown import markdown_table
from pytest_sharedkv.report.records import Check, Kind, Status
from pytest_sharedkv.report.run_log import RunLog
from pytest_sharedkv.service.answers import ServiceRun
from pytest_sharedkv.service.baseline import NOT_STEPS, Baseline, exact_pair, remedies
from pytest_sharedkv.service.execute import BOUNDARY_GROUP as BOUNDARY_STEP
from pytest_sharedkv.service.execute import GAP_GROUP as GAP_STEP
from pytest_sharedkv.service.execute import IDENTICAL_GROUP as IDENTICAL_STEP
from pytest_sharedkv.service.execute import WRITE_GROUP as WRITE_STEP
from pytest_sharedkv.service.triage import (
    ALLOCATOR_REMEDY,
    OTHER_ALLOCATOR,
    controls_for,
    proven_line,
    suggestion_line,
)
from pytest_sharedkv.stack.launch.native_offload import STATE_ALIGNED, WHOLE_PROMPT

TIER = "service_regression"
PAIR_KEYS = ("provider", "allocator", "delay")
SUGGESTION = ("suggestion (not proven by this run; --sharedkv-triage or --sharedkv-baseline "
              "REPORT would test it): start the LMCache server with --no-l1-use-lazy, or run "
              "LMCache's compiled kernels (a build that loads against this torch)")


def _pair(check: Check) -> tuple[str, ...]:
    return tuple(check.key.get(k, "") for k in PAIR_KEYS)


def pair_name(provider: str, allocator: str) -> str:
    """How the summary names a pair: its allocator, else its provider."""
    return allocator if allocator not in ("", "n/a", "unknown") else provider


def wall_line(run: ServiceRun, labels: Mapping[str, str]) -> str:
    """The pass's wall time and what it went to, from its answers: the requests sent and
    how many were answered; latencies only of answers received."""
    sent = [*run.answers.values(), *run.controls.values(),
            *(a for turns in run.sessions.values() for a in turns)]
    answered = run.requests
    name = pair_name(labels.get("provider", ""), labels.get("allocator", ""))
    line = f"wall time {name}: {run.wall_s:.1f} s for {len(sent)} requests sent"
    if not answered:
        return line + (", none answered" if sent else "") + ", settles included"
    per = run.request_seconds / answered
    if answered < len(sent):
        return (line + f", {answered} answered ({len(sent) - answered} failed; {per:.3f} s "
                "mean latency of the answered), settles included")
    return (line + f", all answered ({run.wall_s / answered:.3f} s each, {per:.3f} s mean "
            "latency), settles included")


def evictions_line(evictions: Mapping[str, Mapping[str, int | None]],
                   labels: Mapping[str, str], topology: Mapping[str, object]) -> str:
    """The L1 evictions each server counted by the end of the pass (the last group's
    count), with each server's L1; unknown where a count could not be read."""
    last = list(evictions.values())[-1]
    name = pair_name(labels.get("provider", ""), labels.get("allocator", ""))
    servers = topology.get("servers") or []
    sizes = sorted({s["l1_size_gb"] for s in servers if isinstance(s, dict)}) \
        if isinstance(servers, list) else []
    l1 = f" (L1 {', '.join(f'{g:g}' for g in sizes)} GB each)" if sizes else ""
    why = sorted({s["uncounted"] for s in servers if isinstance(s, dict) and s.get("uncounted")}
                 ) if isinstance(servers, list) else []
    return (f"EVICTIONS {name} ({topology.get('topology')}): "
            + ", ".join(f"{server} {'unknown' if n is None else n}"
                        for server, n in last.items()) + f" L1 chunks evicted{l1}"
            + (f"; not counted: {'; '.join(why)}" if why else ""))


def _n(value: object) -> str:
    return "-" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def _split(detail: Mapping[str, object]) -> str:
    """A hosts-topology cross step's split in the server's own account: '0 L1 / 752 L2'."""
    hosts = detail.get("hosts")
    if not isinstance(hosts, dict):
        return "-"
    said = f"{_n(hosts.get('l1'))} L1 / {_n(hosts.get('l2'))} L2"
    unlogged = hosts.get("unlogged")
    return said + (f" ({unlogged} unlogged)" if unlogged else "")


def table(checks: list[Check]) -> list[str]:
    rows = []
    steps = _steps(checks, warmups=True)
    hosts = any("hosts" in c.detail for c in steps)  # server 2's keys: L1 vs L2
    for c in steps:
        d = c.detail
        rows.append([*_pair(c), c.key.get("size", ""), c.key.get("step", ""),
                     str(d.get("replica", "")), f"{c.passed}/{c.trials}", _n(d.get("cached")),
                     _n(d.get("local")), _n(d.get("external")),
                     *([_split(d)] if hosts else []), _n(d.get("wall_s"))])
    if not rows:
        return []
    return markdown_table([*PAIR_KEYS, "size", "step", "replica", "exact", "cached tokens",
                           "own-cache hits", "pool hits",
                           *(["server 2 keys"] if hosts else []), "wall s"], rows)


def _steps(checks: list[Check], warmups: bool = False) -> list[Check]:
    """The step-total records (a failed request's own record has step "chain")."""
    return [c for c in checks if c.key.get("size") not in NOT_STEPS
            and c.key.get("step") != "chain" and (warmups or c.key.get("size") != "warm-up")]


def _tally(checks: list[Check], size: str) -> str:
    group = [c for c in checks if c.key.get("size") == size]
    if not group:
        return ""
    return f"{sum(c.passed for c in group)}/{sum(c.trials for c in group)}"


def remedy_line(checks: list[Check], allocator: str, baseline: Baseline | None = None,
                kernel_path: str | None = None) -> str:
    """The remedy for a diverging ALLOCATOR pair: every one a run proved, else the
    suggestion (said as one)."""
    removing = [c for c in checks if c.key.get("size") == "triage"  # cells that removed it
                and c.key.get("allocator") == allocator and c.status == "pass"]
    proven = [proven_line(str(c.detail["remedy"]), str(c.key.get("step")), c.passed,
                          c.trials, c.detail.get("mismatches"))
              for c in removing if c.detail.get("remedy")]
    other = OTHER_ALLOCATOR.get(allocator)
    exact = exact_pair(checks, other) if other else None
    if other and exact is not None and exact[0] == exact[1]:
        proven.append(f"{ALLOCATOR_REMEDY[other]} (proven in this run: the {other} pair "
                      f"answered {exact[0]}/{exact[1]} cross-replica requests exact)")
    proven += remedies(baseline, allocator, kernel_path)
    suggested = [suggestion_line(str(c.detail["suggestion"]), str(c.key.get("step")))
                 for c in removing if c.detail.get("suggestion")]
    also = ("; suggestion (not a proven remedy): " + "; or ".join(suggested)
            if suggested else "")
    if proven:
        return "remedy: " + "; or ".join(dict.fromkeys(proven)) + also
    if suggested:
        return also.removeprefix("; ")
    return SUGGESTION if allocator == "lazy" else ("suggestion: --sharedkv-triage re-runs "
                                                   "this pair under controls")


def triage_table(checks: list[Check]) -> list[str]:
    rows = [[str(c.key.get("allocator", "")), str(c.key.get("step", "")),
             str(c.detail.get("control", "")), str(c.detail.get("group", "")),
             f"{c.passed}/{c.trials}", _n(c.detail.get("mismatches")),
             {"pass": "removed", "fail": "persists", "info": "n/a"}.get(c.status, "unknown"),
             _n(c.detail.get("wall_s"))]
            for c in checks if c.key.get("size") == "triage"]
    if not rows:
        return []
    return ["triage: the diverging size group again under each control (its own cell, "
            "KV audit on):",
            *markdown_table(["allocator", "cell", "control", "group", "exact",
                             "mismatching digests", "fault", "wall s"], rows)]


def triage_unfinished(checks: list[Check], decided: Set[str]) -> list[str]:
    """A TRIAGE line for each allocator whose triage recorded cells but no verdict (a run
    cut short): which cells removed the fault and which left it, with their counts, and the
    cells not judged; no class of fault is named until every cell is. DECIDED: the nodeids
    of the triage tests that recorded their verdict note (its cells carry the same)."""
    lines = []
    cells = [c for c in checks if c.key.get("size") == "triage"]
    for allocator in dict.fromkeys(str(c.key.get("allocator", "")) for c in cells):
        mine = {str(c.key.get("step")): c for c in cells
                if str(c.key.get("allocator", "")) == allocator}
        if any(c.nodeid in decided for c in mine.values()):
            continue
        missing = [c.name for c in controls_for(allocator) if c.name not in mine]

        said = {status: "; ".join(f"{c.detail.get('control')} ({c.detail.get('counts')})"
                                  for c in mine.values() if c.status == status)
                for status in ("pass", "fail", "unknown")}
        parts = [f"{verb} {said[status]}" for verb, status in (
            ("removed by", "pass"), ("persists under", "fail"), ("undecided under", "unknown"))
            if said[status]]
        lines.append(f"TRIAGE {allocator}: INCOMPLETE ({len(mine)} of "
                     f"{len(mine) + len(missing)} cells judged"
                     + (f"; not judged: {', '.join(missing)}" if missing else "") + ")"
                     + (": " + "; ".join(parts) if parts else "")
                     + "; no class of fault is named until every cell is judged")
    return lines


def verdicts(checks: list[Check], baseline: Baseline | None = None,
             kernel_path: str | None = None, catalogue: Sequence[str] | None = None,
             finished: Set[str] = frozenset()) -> list[str]:
    """Per pair: its gate, its VERDICT, its remedy and its CATALOGUE line (CATALOGUE: the
    classes the run chose, None where it was not asked for; FINISHED: the tests that have
    an outcome)."""
    from pytest_sharedkv.service.catalogue import offer

    lines = []
    isolated: dict[str, str] = {}  # pair -> its isolation failures, said first
    for pair in dict.fromkeys(_pair(c) for c in checks if c.key.get("size") != "model"):
        mine = [c for c in checks if _pair(c) == pair]
        name = pair_name(pair[0], pair[1])
        said = isolation_text(mine)
        if said is not None:
            isolated[name] = said
        gate = next((c for c in mine if c.key.get("size") == "gate"), None)
        steps = _steps(mine)
        gaps = [c for c in steps if str(c.key.get("step", "")).startswith(GAP_STEP)]
        writes = [c for c in steps if c.key.get("step") == WRITE_STEP]
        twins = [c for c in steps if str(c.key.get("step", "")).startswith(IDENTICAL_STEP)]
        edges = [c for c in steps if str(c.key.get("step", "")).startswith(BOUNDARY_STEP)]
        # the L2 fault and write-failure cells, the identical requests, the block
        # boundaries: a line of their own
        steps = [c for c in steps if c not in gaps and c not in writes and c not in twins
                 and c not in edges]
        tail = (identical_verdicts(name, twins) + boundary_verdicts(name, edges)
                + gap_verdicts(name, gaps) + write_verdicts(name, writes))
        cross = [c for c in steps if c.key.get("step") == "cross"]
        total = sum(c.trials for c in cross)
        failed = sum(int(c.detail.get("errors") or 0) for c in cross)  # got no answer
        wrong = sum(c.trials - c.passed for c in cross) - failed
        # wrong answers where no cross-replica hit served them (the replica's own caches)
        elsewhere = [(f"{c.key.get('size')} {c.key.get('step')}", n, c.trials)
                     for c in steps if c.key.get("step") != "cross"
                     and (n := c.trials - c.passed - int(c.detail.get("errors") or 0)) > 0]
        where_wrong = ", ".join(f"{where} {n} of {trials}" for where, n, trials in elsewhere)
        own = f"; wrong where the replica's own caches served them: {where_wrong}" \
            if elsewhere else ""
        chains = [c for c in mine if c.key.get("step") == "chain"]
        all_ok = all(c.ok for c in steps) and not chains
        sessions, protocol = _tally(mine, "session"), _tally(mine, "protocol")
        extra = ", ".join(x for x in (f"sessions {sessions} turns" if sessions else "",
                                      f"protocol {protocol}" if protocol else "") if x)
        status = gate.status if gate is not None else None
        offered = False  # the catalogue's place: a pair that passed, or one it recorded
        void = gate if gate is not None and status in ("void", "confounded") else None
        if void is not None and not wrong and not elsewhere:
            lines.append(f"VERDICT {name}: VOID: {void.message.removeprefix('VOID: ')}")
            lines += _catalogue_lines(mine, name, catalogue, finished, False) + tail
            continue
        if gate is not None and status == "unproven":
            lines.append(f"NOTE {name}: {gate.message}")
        elif gate is not None and void is None:
            lines.append(f"GATE {name}: {gate.message}")
        elif void is not None:  # beside wrong answers: why the exact ones prove nothing
            lines.append(f"GATE {name}: {void.message} (see VERDICT)")
        if not steps:
            lines += _catalogue_lines(mine, name, catalogue, finished, False) + tail
            continue
        if all_ok:
            lines.append(f"VERDICT {name}: {total}/{total} requests exact in every step (cold, "
                         f"local, cross-replica, receiver-local), hits as expected"
                         + (f"; {extra}" if extra else "")
                         + ("; sensitivity unproven, so no proof of integrity"
                            if status == "unproven" else ""))
            if void is None and (gate is None or status == "pass"):  # a pass: offer it
                lines += offer(mine, pair[0], name, catalogue)
                offered = True
        elif wrong:  # under a VOID or CONFOUNDED gate the divergences stand all the same
            remedy = f"; {remedy_line(checks, pair[1], baseline, kernel_path)}" \
                if pair[0] == "vllm" else ""
            exact = total - wrong - failed
            voids = (f"; the {exact} exact answers prove nothing (GATE {name}: "
                     f"{str(status).upper()})" if void is not None and exact else "")
            lines.append(f"VERDICT {name}: {wrong} of {total} requests answered wrong after "
                         "cross-replica pool hits (HTTP 200, the prompt served from the pool)"
                         + (f"; {failed} got no answer" if failed else "") + own + remedy
                         + voids)
        elif elsewhere:
            lines.append(f"VERDICT {name}: {sum(n for _, n, _ in elsewhere)} answers wrong "
                         f"where the replica's own caches served them ({where_wrong}); "
                         f"cross-replica {total - failed}/{total} exact"
                         + (f"; {extra}" if extra else ""))
        elif failed:
            lines.append(f"VERDICT {name}: {failed} of {total} cross-replica requests got no "
                         f"answer (errors); the {total - failed} answered were exact"
                         if failed < total else f"VERDICT {name}: none of {total} "
                         "cross-replica requests got an answer (errors): nothing was judged")
        else:
            bad = [f"{c.key.get('size')} {c.key.get('step')}" for c in steps
                   if c.status == "fail"]
            lines.append(f"VERDICT {name}: {total}/{total} answers exact after cross-replica "
                         f"hits, but {len(chains)} request chains failed their hit accounting"
                         + (f" ({', '.join(bad)})" if bad else "")
                         + (f"; {extra}" if extra else ""))
        lines += _catalogue_lines(mine, name, catalogue, finished, offered) + tail
    return _isolation_first(lines, isolated)


def isolation_text(checks: Sequence[Check]) -> str | None:
    """What a pair's isolation failures (records of kind isolation that failed: a cache hit
    across cache_salt namespaces) say, or None."""
    found = [c for c in checks if c.kind == Kind.ISOLATION and c.status == Status.FAIL]
    if not found:
        return None
    where = sorted({f"{c.key.get('size')} {c.key.get('step')}" for c in found})
    return (f"ISOLATION FAILED: KV served across cache_salt namespaces in {len(found)} "
            f"record(s) ({', '.join(where[:6])}{', ...' if len(where) > 6 else ''}): one "
            f"tenant's cache answered another's, a security failure whatever the answers; "
            f"first: {found[0].message[:200]}")


def _isolation_first(lines: list[str], isolated: Mapping[str, str]) -> list[str]:
    """Each isolated pair's VERDICT line opens with its isolation failure (a line of its
    own where the pair has no VERDICT line)."""
    out = list(lines)
    for name, text in isolated.items():
        head = f"VERDICT {name}: "
        at = next((i for i, line in enumerate(out) if line.startswith(head)), None)
        if at is None:
            out.insert(0, head + text)
        else:
            out[at] = f"{head}{text}. Besides: {out[at][len(head):]}"
    return out


def _catalogue_lines(mine: list[Check], name: str, catalogue: Sequence[str] | None,
                     finished: Set[str], offered: bool) -> list[str]:
    """The pair's CATALOGUE line: where it has catalogue records, or where the catalogue
    was offered (a pair that passed) and asked for."""
    from pytest_sharedkv.service.catalogue import line

    if not offered and not any(c.kind == Kind.FAULT_CATALOGUE for c in mine):
        return []
    said = line(mine, name, catalogue, finished)
    return [said] if said is not None else []


def identical_verdicts(name: str, cells: list[Check]) -> list[str]:
    """The identical-requests cells' verdicts (LMCache #4463's later report): K requests of
    one prompt in flight together on one replica, or one after another, every answer exact
    and all equal."""
    def head(detail: Mapping[str, Any]) -> str:
        prompts = detail.get("prompts")
        how = "one after another" if detail.get("sequential") else "at once"
        return (f"IDENTICAL {name}: {detail.get('k')} identical requests {how} on replica "
                f"{detail.get('replica')} after the prompt's KV was stored, for each of "
                f"{len(prompts) if isinstance(prompts, list) else '?'} prompts")

    def passing(detail: Mapping[str, Any]) -> str:
        return ("answers exact, each prompt's all equal, the first one's hit as expected"
                if detail.get("sequential") else
                "answers exact, each prompt's all equal, hits as expected")

    return _cell_lines(cells, head, passing)


def boundary_verdicts(name: str, cells: list[Check]) -> list[str]:
    """The block-boundary stage's verdict (vLLM #51094's condition, native offload):
    prompts at and beside whole offload blocks reloaded from the replica's CPU tier."""
    def head(detail: Mapping[str, Any]) -> str:
        lengths = detail.get("lengths")
        said = ("/".join(str(n) for n in lengths.values()) if isinstance(lengths, dict)
                else "?")
        return (f"BOUNDARY {name}: {said}-token prompts at whole offload blocks of "
                f"{detail.get('block')} tokens ({detail.get('block_from')}), cold on replica "
                f"{detail.get('replica')}, pushed off its GPU cache, asked again")

    def passing(detail: Mapping[str, Any]) -> str:
        rule = detail.get("hit_rule")
        if rule == WHOLE_PROMPT:
            return "exact, each hit its whole blocks from its CPU tier"
        words = "exact, each hit whole blocks of all but its last token from its CPU tier"
        if rule == STATE_ALIGNED:
            words += (" (a prompt of whole blocks none: mamba_cache_mode align keeps its "
                      "recurrent state only at its end)")
        return words

    return _cell_lines(cells, head, passing)


def _cell_lines(cells: list[Check], head: Callable[[Mapping[str, Any]], str],
                passing: Callable[[Mapping[str, Any]], str], counted: str = "exact"
                ) -> list[str]:
    """A cell's verdict line each: HEAD (from its detail), then its count and PASSING's
    words where it passed, else its status, kind, count (of what is COUNTED) and message."""
    lines = []
    for cell in cells:
        start = f"{head(cell.detail)}: "
        if str(cell.status) == "pass":
            lines.append(f"{start}{cell.passed}/{cell.trials} {passing(cell.detail)}")
        else:
            lines.append(f"{start}{str(cell.status).upper()} ({cell.kind}): {cell.passed}/"
                         f"{cell.trials} {counted}; {cell.message}")
    return lines


def gap_verdicts(name: str, cells: list[Check]) -> list[str]:
    """The L2 fault cell's verdict: server 2's L2 fails one chunk's load of every prompt,
    so each answer must be exact with B's hit trimmed to the chunks before the gap."""
    lines = []
    for cell in cells:
        detail = cell.detail
        head = (f"L2 FAULT {name}: server 2's L2 failed to load chunk {detail.get('gap')} of "
                "every prompt (LMCache's fault_inject)")
        if cell.ok:
            line = (f"{head}: {cell.passed}/{cell.trials} answers exact, each hit the "
                    f"{detail.get('prefix_tokens')} tokens before the gap and the rest "
                    "recomputed")
        else:
            line = (f"{head}: FAIL ({cell.kind}): {cell.passed}/{cell.trials} held; "
                    f"{cell.message}")
        lines.append(line + _gap_audit(detail.get("audit") or {}))
        remedy = _gap_unkept_state(detail)
        if remedy:
            lines.append(remedy)
    return lines


UNKEPT_STATE_RUNS = "docs/findings/2026-12-02-fault-gap-catalogue-triage.md"


def _gap_unkept_state(detail: Mapping[str, object]) -> str | None:
    """Where every wrong answer of the cell resumed recurrent state of a chunk A stored
    without one, the suggestion the H200 runs behind UNKEPT_STATE_RUNS support (not proven
    by this run: no cell of it changes the scheduler)."""
    wrong, audit = detail.get("wrong"), detail.get("audit")
    unkept = audit.get("unkept_state_requests") if isinstance(audit, Mapping) else None
    if not (isinstance(wrong, list) and wrong and isinstance(unkept, list)
            and set(wrong) <= set(unkept)):
        return None
    return (f"  the {len(wrong)} wrong answers all resumed B's recurrent layers from the state "
            "of a chunk A stored without one (vLLM keeps a hybrid model's state only where a "
            "scheduler step ends); suggestion (not proven by this run): scheduler steps that "
            "end on every LMCache chunk boundary (--max-num-batched-tokens a multiple of the "
            "chunk, --max-num-seqs 1) made the same cell exact on an H200 "
            f"({UNKEPT_STATE_RUNS})")


def _gap_audit(audit: Mapping[str, object]) -> str:
    """The cell's KV audit beside its verdict, with the recurrent-state loads it could not
    judge (a hit ending where A kept no state loads one); a record without that count
    says so rather than showing 0."""
    if not audit:
        return ""
    state = audit.get("unmatched_state")
    unjudged = ("recurrent-state loads with no store by A (not judged): "
                + ("not recorded" if state is None else str(state)))
    unkept = audit.get("unkept_state_requests")
    if isinstance(unkept, list) and unkept:  # recorded since 2026-12-02
        unjudged += (f"; B resumed {len(unkept)} requests from recurrent state of chunks A "
                     f"stored without one: {', '.join(map(str, unkept[:8]))}"
                     f"{', ...' if len(unkept) > 8 else ''}")
    return (f"; KV audit: {audit.get('compared')} digests compared, "
            f"{audit.get('mismatches')} differ from A's; {unjudged}")


def write_verdicts(name: str, cells: list[Check]) -> list[str]:
    """The L2 write-failure cell's verdict: writes refused by a full Redis while both
    replicas stored the same prompts, then every later answer exact, said with how many of
    them hit the L2 at all."""
    def head(detail: Mapping[str, Any]) -> str:
        return (f"L2 WRITE {name}: {detail.get('refused', 'unknown')} L2 write(s) refused "
                "while both replicas stored the same prompts (a Redis at its memory limit)")

    return _cell_lines(cells, head, lambda detail: (
        f"later answers exact{_l2_hits(detail)}, no hit past what it held, the audit "
        f"{'clean' if detail.get('audit') else 'off'}"), counted="held")


def _l2_hits(detail: Mapping[str, Any]) -> str:
    """How many of the cell's later answers hit anything in the L2: an answer of a prompt
    the L2 kept nothing of is exact from a recompute, not from the L2."""
    cached = detail.get("cached_by_request")
    if not isinstance(cached, Mapping):
        return " (which of them hit the L2: not recorded)"
    hit = sum(1 for tokens in cached.values() if tokens)
    return f" ({hit} with hits from that L2, {len(cached) - hit} hit nothing)"


def model_table(checks: list[Check]) -> list[str]:
    """The copy model's corruption matrix (CPU): answers changed, as they must or not."""
    rows = [[c.key.get("step", ""), f"{c.detail.get('changed')}/{c.trials}",
             str(c.detail.get("must", "")), "yes" if c.ok else "NO",
             str(c.detail.get("min_margin_nats", ""))]
            for c in checks if c.key.get("size") == "model"]
    if not rows:
        return []
    return ["the served model's corruption matrix (copy model, transformers on CPU):",
            *markdown_table(["corruption", "answers changed", "must", "as constructed",
                             "min margin (nats)"], rows)]


def summary_lines(log: RunLog, baseline: Baseline | None = None,
                  kernel_path: str | None = None, catalogue: Sequence[str] | None = None
                  ) -> list[str]:
    """The tier's summary; CATALOGUE: the fault classes the run chose (None: not asked)."""
    checks = [c for c in log.bundle.checks if c.tier == TIER]
    finished = {r.nodeid for r in log.tests.values() if r.outcome is not None}
    lines: list[str] = []  # the triage's verdict is a note: the summary shows notes first
    from pytest_sharedkv.service.catalogue import matrix

    decided = {n.nodeid for n in log.bundle.notes
               if n.tier == TIER and n.kind == Kind.TRIAGE_VERDICT}
    for block in (model_table(checks), table(checks),
                  triage_table(checks) + triage_unfinished(checks, decided),
                  verdicts(checks, baseline, kernel_path, catalogue, finished),
                  matrix(checks)):
        if block:
            lines += ([""] if lines else []) + block
    return lines
