"""The state oracle: every recurrent-state load a replica makes, judged against the state
it should have resumed from, computed independently of replica A.

The KV audit (``kv_audit.py``) compares B's loaded digests with A's stored ones; where A
stored a chunk without a state (vLLM's align mode keeps a Gated DeltaNet state only where
a scheduler step ends), there is nothing to compare and B resumed from a state no engine
kept. The oracle judges each such load (and every other recurrent-state load whose
record carries a state summary) against a reference: the served model's own computation
of the same tokens up to the chunk's end (``models/state_reference.py`` for the copy
models on CPU; the stub double's function of the tokens for the stub). A load is exact
when every summary field of every layer lies within ``RTOL`` of the reference (relative,
with ``ATOL`` below which values count as zero); otherwise it is wrong, named by request,
chunk and layer. The positive control: a zeroed state (and, in the self-tests, a stale
and a foreign one) must lie beyond the tolerance at every referenced load, or the oracle
is VOID. A load with no reference (no summary recorded, a model the oracle cannot
compute, a request it cannot place) is counted, and fails the audit unless the user
opts out (``--sharedkv-state-oracle off``): "not judged" is no longer silent.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pytest_sharedkv.engine_hooks.state_summary import summary_of

RTOL = 0.05  # bf16 states from two implementations (vLLM's kernels, transformers' torch)
ATOL = 1e-3  # |values| below this count as zero


class OracleMode(str, Enum):
    """``--sharedkv-state-oracle``: ON judges every recurrent-state load and fails those
    with no reference; OFF leaves them counted, not failed."""

    ON = "on"
    OFF = "off"


Summary = Mapping[str, Any]  # engine_hooks.state_summary: {"norm", "top", "count"}


@dataclass(frozen=True)
class StateLoad:
    """One recurrent-state load: B resumed REQUEST's layer LAYER at POSITION tokens."""

    request: str
    step: str
    chunk: int
    position: int
    layer: int
    summary: Summary | None  # None: the record carries no state summary
    key: str = ""  # the audit's chunk key (cache salt and tokens up to the chunk's end)


@dataclass(frozen=True)
class WrongState:
    load: StateLoad
    distance: float

    def line(self) -> str:
        return (f"request {self.load.request} ({self.load.step} on B): chunk "
                f"{self.load.chunk}, layer {self.load.layer}: B resumed from a recurrent "
                f"state {self.distance:.3g} away from the reference at token "
                f"{self.load.position} (tolerance {RTOL})")


@dataclass
class OracleReport:
    mode: OracleMode = OracleMode.ON
    exact: int = 0
    wrong: list[WrongState] = field(default_factory=list)
    unreferenced: list[StateLoad] = field(default_factory=list)
    control_distance: float | None = None  # the smallest zeroed-state distance
    void_reason: str | None = None

    @property
    def judged(self) -> int:
        return self.exact + len(self.wrong)

    @property
    def status(self) -> str:
        """pass | fail | void (report.records' words)."""
        if self.void_reason:
            return "void"
        if self.wrong or (self.unreferenced and self.mode is OracleMode.ON):
            return "fail"
        if self.judged == 0 and not self.unreferenced:
            return "void"
        return "pass"

    def summary(self, label: str = "") -> str:
        head = f"STATE ORACLE{' ' + label if label else ''}: "
        if self.void_reason:
            return head + "VOID: " + self.void_reason
        if self.judged == 0 and not self.unreferenced:
            return head + "VOID: no recurrent-state load to judge"
        control = ("" if self.control_distance is None else
                   f"; positive control: a zeroed state lies >= {self.control_distance:.3g} "
                   f"from every reference (tolerance {RTOL})")
        unref = ""
        if self.unreferenced:
            requests = sorted({u.request for u in self.unreferenced})
            unref = (f"; {len(self.unreferenced)} loads in {len(requests)} requests had no "
                     f"reference ({', '.join(requests[:8])}{', ...' if len(requests) > 8 else ''})"
                     + (": FAIL (--sharedkv-state-oracle off to count them only)"
                        if self.mode is OracleMode.ON else ": counted, not failed "
                        "(--sharedkv-state-oracle off)"))
        verdict = (f"{len(self.wrong)} wrong in "
                   f"{len({w.load.request for w in self.wrong})} requests"
                   if self.wrong else "every judged state equals the reference")
        return (f"{head}{self.judged} recurrent-state loads judged against the model's own "
                f"reference: {verdict}{control}{unref}")


def distance(loaded: Summary, reference: Summary) -> float:
    """Where both keep the values: the largest difference of one value over the
    reference's largest magnitude; else the largest relative difference over the
    summaries' fields (norm, each top value)."""
    mine, theirs = loaded.get("values"), reference.get("values")
    if isinstance(mine, list) and isinstance(theirs, list):
        if len(mine) != len(theirs):
            return float("inf")
        scale = max((abs(float(v)) for v in theirs), default=0.0) + ATOL
        return max((abs(float(a) - float(b)) for a, b in zip(mine, theirs, strict=True)),
                   default=0.0) / scale
    pairs = [(float(loaded["norm"]), float(reference["norm"]))]
    top_l, top_r = list(loaded.get("top", ())), list(reference.get("top", ()))
    width = max(len(top_l), len(top_r))
    top_l += [0.0] * (width - len(top_l))
    top_r += [0.0] * (width - len(top_r))
    pairs += list(zip(top_l, top_r, strict=True))
    return max(abs(a - b) / (abs(b) + ATOL) for a, b in pairs)


def zeroed(reference: Summary) -> Summary:
    return summary_of([0.0] * int(reference.get("count", 1)))


# a load -> layer -> the reference summary (None: no reference for it)
ReferenceFn = Callable[[StateLoad], Mapping[int, Summary] | None]


def judge(loads: Iterable[StateLoad], reference: ReferenceFn,
          mode: OracleMode = OracleMode.ON) -> OracleReport:
    report = OracleReport(mode)
    cache: dict[tuple[str, int, str], Mapping[int, Summary] | None] = {}
    controls: list[float] = []
    for load in loads:
        key = (load.request, load.position, load.key)
        if key not in cache:
            cache[key] = reference(load)
        layers = cache[key]
        expected = None if layers is None else layers.get(load.layer)
        if load.summary is None or expected is None:
            report.unreferenced.append(load)
            continue
        controls.append(distance(zeroed(expected), expected))
        d = distance(load.summary, expected)
        if d <= RTOL:
            report.exact += 1
        else:
            report.wrong.append(WrongState(load, d))
    if controls:
        report.control_distance = min(controls)
        if report.control_distance <= RTOL:
            report.void_reason = (f"a zeroed state lies within the tolerance ({RTOL}) of a "
                                  "reference: the oracle cannot tell a lost state there")
    return report


_LAYER = re.compile(r"layers\.(\d+)\.")


def layer_index(name: str) -> int | None:
    """The decoder layer index in an engine's layer name (model.layers.2.linear_attn)."""
    match = _LAYER.search(name + ".")
    return int(match.group(1)) if match else None


def loads_from_records(records: Iterable[Mapping[str, Any]], chunk_tokens: int,
                       name: Callable[[str], tuple[str, str]]) -> list[StateLoad]:
    """B's recurrent-state loads in the KV audit's records (kind load, recurrent), one per
    chunk and layer, at the token after the chunk's end; NAME: engine request id ->
    (corpus request, step)."""
    out = []
    for r in records:
        if r.get("kind") != "load" or r.get("role") != "B" or not r.get("recurrent"):
            continue
        request, step = name(str(r["request"]))
        index = layer_index(str(r["layer"]))
        layer = index if index is not None else -1
        chunk = int(r["chunk"])
        state = r.get("state")
        out.append(StateLoad(request, step, chunk, (chunk + 1) * chunk_tokens, layer,
                             state if isinstance(state, Mapping) else None,
                             str(r.get("key", ""))))
    return out


def reference_from_model(model_dir: Any, tokens: Callable[[str], Sequence[int] | None],
                         loaded: Any = None) -> ReferenceFn:
    """The copy models' reference: transformers on CPU over the request's tokens (with
    ``<s>``) up to the position; None where TOKENS does not know the request. LOADED: a
    ``models.state_reference.Reference`` of MODEL_DIR already loaded."""
    from pytest_sharedkv.engine_hooks.state_summary import summary_of_tensors
    from pytest_sharedkv.models.state_reference import Reference

    model = loaded if loaded is not None else Reference(model_dir)

    def reference(load: StateLoad) -> Mapping[int, Summary] | None:
        ids = tokens(load.request)
        if ids is None or load.position > len(ids):
            return None
        layers = model.state_at(load.request, ids, load.position)
        return {index: summary_of_tensors(pair) for index, pair in layers.items()}

    return reference


def reference_from_stub(load: StateLoad) -> Mapping[int, Summary] | None:
    """The stub double's reference: its state function of the chunk's key (the salt and
    tokens up to the chunk's end), computed here, not read from any replica."""
    from pytest_sharedkv.engine_hooks.state_summary import STUB_LAYER, stub_state

    index = layer_index(STUB_LAYER)
    if not load.key or index is None:
        return None
    return {index: summary_of(stub_state(load.key))}


def no_reference(load: StateLoad) -> Mapping[int, Summary] | None:
    return None


class ReferenceSource(str, Enum):
    """Where a pair's reference states come from, chosen once in ``reference_source``."""

    STUB = "the stub double's state function of the tokens"
    MODEL = "the served copy model's CPU reference (transformers)"
    NONE = "none: the served model's states cannot be computed here"


def reference_source(provider: str, model_kind: str | None) -> ReferenceSource:
    """The stub's own function for the stub pair; the model's CPU reference for a copy
    model the suite made (its weights known exactly); else none."""
    if provider.startswith("stub"):
        return ReferenceSource.STUB
    if model_kind in ("copy", "copy-memory"):
        return ReferenceSource.MODEL
    return ReferenceSource.NONE


def chunk_tokens(records: Iterable[Mapping[str, Any]]) -> int | None:
    """LMCache's chunk in tokens, from a replica's registration record."""
    for r in records:
        if r.get("kind") == "registered" and r.get("chunk"):
            return int(r["chunk"])
    return None


def oracle_of(records: Sequence[Mapping[str, Any]], source: ReferenceSource,
              reference: ReferenceFn | None, mode: OracleMode,
              name: Callable[[str], tuple[str, str]]) -> OracleReport | None:
    """The oracle over a pair's KV audit records, or None where B made no recurrent-state
    load (nothing to judge: an attention-only model, or a stub without state loads)."""
    chunk = chunk_tokens(records)
    loads = loads_from_records(records, chunk or 0, name)
    if not loads:
        return None
    if chunk is None:
        return OracleReport(mode, void_reason="no replica registered its chunk size")
    chosen = (reference_from_stub if source is ReferenceSource.STUB
              else reference if source is ReferenceSource.MODEL and reference is not None
              else no_reference)
    return judge(loads, chosen, mode)
