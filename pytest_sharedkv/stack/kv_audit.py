"""Reading the in-engine KV audit: B's loaded bytes against A's stored bytes, per chunk.

Every chunk, KV group and layer replica B loaded from the pool for a cross-replica
request is compared with the digest replica A recorded when it stored the same chunk
(same cache salt and token ids up to the chunk's end). A mismatch names the request, the
chunk, the group and the layer, and, when B's bytes equal some other stored chunk, whose
(the previous chunk, another request: the stale-staging-buffer signature). An audit
that compared nothing is VOID, never a pass.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_sharedkv.engine_hooks.kv_audit_hook import REGISTRATION
from pytest_sharedkv.stack.request_tags import parse_request_tag

VOID = "VOID"


@dataclass(frozen=True)
class Mismatch:
    request: str  # the corpus request (or the engine's id when untagged)
    step: str
    chunk: int
    group: int
    layer: str
    recurrent: bool
    equals: str | None  # whose stored bytes B's equal, if anyone's

    def line(self) -> str:
        kind = "recurrent state" if self.recurrent else "KV"
        whose = (f"; B's bytes equal {self.equals}" if self.equals
                 else "; B's bytes equal no chunk any replica stored")
        return (f"request {self.request} ({self.step} on B): chunk {self.chunk}, group "
                f"{self.group} ({kind}), layer {self.layer}: B loaded bytes that differ "
                f"from what A stored{whose}")


@dataclass
class AuditReport:
    compared: int = 0  # (chunk, group, layer) digests compared
    compared_state: int = 0  # ... of them Gated DeltaNet (recurrent) state
    unmatched: int = 0  # B loads with no A store of the same key (not judged)
    unmatched_state: int = 0
    # request -> its recurrent-state loads of chunks A stored with no state (their state
    # blocks were the null block: vLLM keeps a state only where a scheduler step ends), so
    # B resumed its recurrent layers from a state no engine kept
    unkept_state: dict[str, int] = field(default_factory=dict)
    mismatches: list[Mismatch] = field(default_factory=list)
    # request -> B's loads of chunks no replica ever stored under that request's salt:
    # the pool served KV across cache_salt namespaces (an isolation failure)
    foreign: dict[str, int] = field(default_factory=dict)
    chunks_per_request: dict[str, int] = field(default_factory=dict)  # audited chunks
    registered: dict[str, int] = field(default_factory=dict)  # role -> processes
    unsupported: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    audited_tokens: int = 0
    audit_seconds: float = 0.0

    @property
    def void(self) -> str | None:
        """Why this audit proves nothing, or None."""
        if self.unsupported:
            return (f"{VOID}: the audit's entry points are missing in this LMCache/vLLM "
                    f"({', '.join(sorted(set(self.unsupported)))}); see kv_audit_hook."
                    "ENTRY_POINTS")
        missing = [r for r in ("A", "B") if not self.registered.get(r)]
        if missing:
            return (f"{VOID}: the audit hook never saw replica {' or '.join(missing)} "
                    f"register its KV caches through {REGISTRATION}, the method it wraps "
                    "(the hook did not load, or the replicas' connector is not LMCache's MP "
                    "connector or no longer registers there)")
        if self.compared == 0:
            why = f"; hook errors: {self.errors[0]}" if self.errors else ""
            return (f"{VOID}: no chunk B loaded could be compared with one A stored "
                    f"({self.unmatched} loads without a matching store){why}")
        return None

    def isolation(self) -> str | None:
        """B's loads of chunks no replica stored under their request's salt (the key is a
        hash of the salt and the tokens), said as the isolation failure they are; None
        where there are none."""
        if not self.foreign:
            return None
        names = sorted(self.foreign)
        return (f"isolation: B loaded {sum(self.foreign.values())} chunk(s) that no replica "
                f"ever stored under the request's cache_salt, in {len(names)} request(s) "
                f"({', '.join(names[:8])}{', ...' if len(names) > 8 else ''}): the pool "
                "served KV across cache_salt namespaces")

    @property
    def mismatched_requests(self) -> set[str]:
        return {m.request for m in self.mismatches}

    def counts(self) -> dict[str, int]:
        """What the record keeps of the audit's size: digests compared and loads left
        unjudged, each with its recurrent-state share (a release that does not flag state
        groups shows here as 0 recurrent)."""
        return {"compared": self.compared, "compared_state": self.compared_state,
                "unmatched": self.unmatched, "unmatched_state": self.unmatched_state}

    def cost_us_per_token(self) -> float | None:
        return 1e6 * self.audit_seconds / self.audited_tokens if self.audited_tokens else None

    def summary(self, label: str) -> str:
        if self.void:
            return f"KV AUDIT {label}: {self.void}"
        counts = sorted(self.chunks_per_request.values())
        spread = (f"{counts[0]}-{counts[-1]} chunks per request" if counts else "no requests")
        cost = self.cost_us_per_token()
        cost_text = f"; audit cost {cost:.2f} µs per audited token" if cost is not None else ""
        verdict = (f"{len(self.mismatches)} mismatching digests in "
                   f"{len(self.mismatched_requests)} requests"
                   if self.mismatches else "every loaded chunk equals the stored one")
        foreign = sum(self.foreign.values())
        unjudged = (f"; {self.unmatched - foreign} loads ({self.unmatched_state} of them "
                    "recurrent state) had no store of the same chunk by A and were not judged"
                    if self.unmatched - foreign else "")
        if foreign:
            unjudged += f"; {self.isolation()}"
        if self.unkept_state:
            names = sorted(self.unkept_state)
            unjudged += (f" (B resumed {len(names)} requests from recurrent state of "
                         f"chunks A stored without one: {', '.join(names[:8])}"
                         f"{', ...' if len(names) > 8 else ''})")
        return (f"KV AUDIT {label}: {self.compared} chunk-group-layer digests compared "
                f"({self.compared - self.compared_state} attention KV, "
                f"{self.compared_state} recurrent state) over "
                f"{len(self.chunks_per_request)} cross-replica requests ({spread}): "
                f"{verdict}{cost_text}{unjudged}")


def read_records(directory: Path) -> list[dict[str, Any]]:
    """Every record of every process's log (a torn last line is skipped)."""
    records = []
    for path in sorted(directory.glob("kv-audit-*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def _name(engine_request: str) -> tuple[str, str]:
    tag = parse_request_tag(engine_request)
    return (tag[0], tag[1]) if tag else (engine_request, "?")


def name_of(engine_request: str) -> tuple[str, str]:
    """(corpus request, step) of an engine's request id (the engine's id when untagged)."""
    return _name(engine_request)


def compare(records: Iterable[Mapping[str, Any]]) -> AuditReport:
    report = AuditReport()
    stored: dict[tuple[str, int, str], str] = {}  # A's (key, group, layer) -> digest
    stored_keys: set[str] = set()  # chunks A stored any layer of
    any_stored: set[str] = set()  # chunks any replica stored (a key holds its salt)
    owners: dict[str, str] = {}  # any stored digest -> "replica R's chunk C of request Q"
    loads = []
    for r in records:
        kind = r.get("kind")
        if kind == "registered":
            report.registered[r["role"]] = report.registered.get(r["role"], 0) + 1
        elif kind == "unsupported":
            report.unsupported.extend(str(m) for m in r.get("missing", []))
        elif kind == "error":
            report.errors.append(f"{r.get('where')}: {r.get('error')}")
        elif kind == "cost":
            report.audited_tokens += int(r.get("tokens", 0))
            report.audit_seconds += float(r.get("seconds", 0.0))
        elif kind == "store":
            request, _ = _name(r["request"])
            owners.setdefault(r["digest"], f"replica {r['role']}'s chunk {r['chunk']} of "
                                           f"request {request} (group {r['group']})")
            any_stored.add(r["key"])
            if r["role"] == "A":
                stored[(r["key"], r["group"], r["layer"])] = r["digest"]
                stored_keys.add(r["key"])
        elif kind == "load" and r["role"] == "B":
            loads.append(r)
    chunks: dict[str, set[int]] = defaultdict(set)
    for r in loads:
        expected = stored.get((r["key"], r["group"], r["layer"]))
        state = bool(r.get("recurrent"))
        if expected is None:
            report.unmatched += 1
            report.unmatched_state += state
            if r["key"] not in any_stored:  # never stored under this salt: another's KV
                request, _ = _name(r["request"])
                report.foreign[request] = report.foreign.get(request, 0) + 1
            if state and r["key"] in stored_keys:  # A stored the chunk, its state null
                request, _ = _name(r["request"])
                report.unkept_state[request] = report.unkept_state.get(request, 0) + 1
            continue
        request, step = _name(r["request"])
        report.compared += 1
        report.compared_state += state
        chunks[request].add(int(r["chunk"]))
        if r["digest"] != expected:
            report.mismatches.append(Mismatch(
                request, step, int(r["chunk"]), int(r["group"]), str(r["layer"]),
                bool(r.get("recurrent")), owners.get(r["digest"])))
    report.chunks_per_request = {k: len(v) for k, v in chunks.items()}
    return report


def audit(directory: Path | None) -> AuditReport | None:
    """The audit of one launched pair, or None when it ran without the audit."""
    if directory is None:
        return None
    return compare(read_records(directory)) if directory.exists() else AuditReport()


def split_gate(report: AuditReport, cases: Mapping[str, Any], zeroed: int | None
               ) -> tuple[list[Mismatch], list[Mismatch]]:
    """(the gate's expected mismatches: control requests at the zeroed chunk, the rest)."""
    expected, faults = [], []
    for m in report.mismatches:
        case = cases.get(m.request)
        if case is not None and case.role == "control" and m.chunk == zeroed:
            expected.append(m)
        else:
            faults.append(m)
    return expected, faults


def correlation(faults: list[Mismatch], diverged: list[str], cases: Mapping[str, Any]
                ) -> list[str]:
    """How the requests whose answers diverged relate to what the audit caught."""
    if not diverged and not faults:
        return []
    by_request: dict[str, set[int]] = defaultdict(set)
    for m in faults:
        by_request[m.request].add(m.chunk)
    at_source = [r for r in diverged
                 if getattr(cases.get(r), "source_chunk", None) in by_request.get(r, set())]
    elsewhere = [r for r in diverged if by_request.get(r) and r not in at_source]
    unseen = [r for r in diverged if not by_request.get(r)]
    silent = sorted(set(by_request) - set(diverged))
    lines = [f"KV AUDIT vs answers: {len(diverged)} requests diverged after cross-replica "
             f"hits; {len(at_source)} have a mismatch in the chunk they copy from, "
             f"{len(elsewhere)} only in other chunks, {len(unseen)} none"]
    if unseen:
        lines.append("  diverged without an audited mismatch: " + ", ".join(unseen[:20]))
    if silent:
        lines.append(f"  {len(silent)} requests with mismatching chunks answered right "
                     "(a chunk they do not copy from, or state the answer did not need): "
                     + ", ".join(silent[:20]))
    return lines


def unkept_by_size(report: AuditReport | None, size_of: Mapping[str, str],
                   sizes: Iterable[str]) -> dict[str, int | None]:
    """Per size group, how many cross-replica requests resumed a recurrent layer from a
    state no engine kept (a chunk A stored with its state region null): the 27b-compute
    model's count (issue 48 item 6), where answers cannot be judged. None (unknown, never
    0) where the audit did not run or proves nothing."""
    if report is None or report.void is not None:
        return {size: None for size in sizes}
    counts = {size: 0 for size in sizes}
    for request in report.unkept_state:
        size = size_of.get(request)
        if size in counts:
            counts[size] += 1
    return dict(counts)
