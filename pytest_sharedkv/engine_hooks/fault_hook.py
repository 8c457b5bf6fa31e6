"""Fault classes injected into the launched LMCache server, placed by the layout its
registration gives, so the catalogue can show what each does to answers, audit and hits.

One class at a time, named by the control file the suite writes (``CONTROL_ENV``):
``{"class": NAME, "every": N, "seed": S, "requests": [...], "bit": B, "cell": C}``; the
catalogue runs its cells one after another on one server, each with a control of its own,
so a control naming another class replaces the last (a ``control`` line says so, and every
line carries the control's ``cell``, by which a cell counts its applications); a transfer is
selected when its request id (from LMCache's ``transfer_key``) hashes, with the seed, to 0
mod N, or contains one of ``requests`` where given. The hook wraps the function the server
calls per object group (``corrupt_hook.TARGETS``, as the gate does) and places each class
through ``layouts.object_layout``: where each layer's bytes lie in the chunk's memory object
and whether an engine reads them. Every application is one JSON line in ``LOG_ENV`` (class,
request, op, chunk, layer, region, byte range, read by an engine); a selected transfer where
the class cannot be placed is an ``unplaced`` line saying why, so a cell with no
application is VOID with a reason. Nothing here raises into LMCache.

Bytes changed in place in an L1 object (collision, bit flip, foreign state) are put back
once the transfer's stream has drained, so only the logged retrieve sees them; a lost write
hands the store ``None`` for one chunk (LMCache skips it, the key is still committed:
``store_with_chunk_mask``, modules/lmcache_driven_transfer.py, 0.5.6); unrestored state
sends the last chunk's recurrent blocks to the null block. Standard library at import.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_sharedkv.engine_hooks import post_import
from pytest_sharedkv.engine_hooks.corrupt_hook import TARGETS
from pytest_sharedkv.engine_hooks.fault_classes import HOOK_CLASSES, fault_class
from pytest_sharedkv.engine_hooks.hook_log import read_log as read_log  # the suite reads it here
from pytest_sharedkv.layouts.object_layout import (
    ATTENTION,
    NULL_BLOCK,
    RECURRENT,
    LayoutUnreadable,
    ObjectLayout,
    Span,
    read_layout,
)

CONTROL_ENV = "SHAREDKV_FAULT_CONTROL"  # the control file the suite writes
LOG_ENV = "SHAREDKV_FAULT_LOG"  # JSON lines: armed, wrapped, applied, unplaced, error
TAG = "fault"
VOID = "VOID"
DEFAULT_BIT = 6  # of an element's most significant byte: a bf16 exponent bit
MAX_DONORS = 4
# transfer_kv_per_object_group's positional parameters (0.5.6 and 0.5.3 alike)
PARAMETERS = ("cache_context", "block_ids_gpu", "memory_objs", "object_group_id",
              "batch_size", "skip_first_n_tokens", "direction")


class ControlError(ValueError):
    """A control file the hook cannot follow; the message says why."""


@dataclass(frozen=True)
class Control:
    fault: str
    every: int = 1
    seed: int = 0
    requests: tuple[str, ...] = ()
    bit: int = DEFAULT_BIT
    cell: str = ""  # the catalogue cell this control is for ("": none named)

    def selects(self, request: str) -> bool:
        if self.requests and not any(r in request for r in self.requests):
            return False
        if self.every <= 1:
            return True
        digest = hashlib.sha256(f"{self.seed}:{request}".encode()).hexdigest()
        return int(digest[:12], 16) % self.every == 0


def parse_control(data: Any) -> Control:
    """The control file's JSON as a Control (ControlError naming the field)."""
    if not isinstance(data, dict):
        raise ControlError("the control file holds no JSON object")
    name = data.get("class")
    if name not in HOOK_CLASSES:
        known = ", ".join(HOOK_CLASSES)
        if isinstance(name, str):
            try:
                injector = fault_class(name).injector.value
            except KeyError:
                raise ControlError(f"class {name!r} is no fault class ({known})") from None
            raise ControlError(f"class {name!r} is injected by {injector}, not this hook")
        raise ControlError(f"'class' must name one of {known}")
    every, seed, bit = data.get("every", 1), data.get("seed", 0), data.get("bit", DEFAULT_BIT)
    requests, cell = data.get("requests", []), data.get("cell", "")
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ControlError("'every' must be an integer >= 1")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ControlError("'seed' must be an integer")
    if not isinstance(bit, int) or isinstance(bit, bool) or not 0 <= bit < 8:
        raise ControlError("'bit' must be an integer 0..7")
    if not isinstance(requests, list) or not all(isinstance(r, str) and r for r in requests):
        raise ControlError("'requests' must be a list of non-empty strings")
    if not isinstance(cell, str):
        raise ControlError("'cell' must be a string")
    return Control(name, every, seed, tuple(requests), bit, cell)


def of_cell(records: Sequence[dict[str, Any]], cell: str) -> list[dict[str, Any]]:
    """The records that speak for CELL: the process's own (armed, wrapped: no cell) and the
    lines written under CELL's control."""
    return [r for r in records if "cell" not in r or r.get("cell") == cell]


def applications(records: Sequence[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The class's applications that count: placed where its table entry says (bytes an
    engine reads, or none for the control)."""
    reads = fault_class(name).engine_reads
    out = []
    for r in records:
        placed = r.get("placements") or []
        if r.get("kind") == "applied" and r.get("class") == name and placed:
            read = [bool(p.get("read")) for p in placed]
            if (any(read) if reads else not any(read)):
                out.append(r)
    return out


def void_problem(records: Sequence[dict[str, Any]], name: str) -> str | None:
    """Why a cell of class NAME proves nothing, or None: it must have been applied."""
    if applications(records, name):
        return None
    kinds = {r.get("kind") for r in records}
    if "armed" not in kinds:
        return f"{VOID}: the fault hook never loaded in the LMCache server"
    if "wrapped" not in kinds:
        looked = "; ".join(f"{m}:{f}" for m, fs in TARGETS.items() for f in fs)
        return f"{VOID}: the fault hook wrapped no transfer (looked in: {looked})"
    why = sorted({str(r.get("why")) for r in records
                  if r.get("kind") in ("unplaced", "error") and r.get("class") in (name, None)})
    if why:
        return f"{VOID}: {name} was never applied: {'; '.join(why)}"
    return f"{VOID}: {name} was never applied: no transfer it acts on was selected"


def _sync_current_stream() -> None:
    """Wait until the transfer just enqueued has read the bytes about to be put back."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.current_stream().synchronize()


@dataclass
class Call:
    """One call of the wrapped transfer, its arguments by name."""

    args: list[Any]
    kwargs: dict[str, Any]

    def get(self, name: str, default: Any = None) -> Any:
        if name in self.kwargs:
            return self.kwargs[name]
        index = PARAMETERS.index(name) if name in PARAMETERS else len(self.args)
        return self.args[index] if index < len(self.args) else default

    def replaced(self, name: str, value: Any) -> Call:
        args, kwargs = list(self.args), dict(self.kwargs)
        index = PARAMETERS.index(name) if name in PARAMETERS else len(args)
        if name not in kwargs and index < len(args):
            args[index] = value
        else:
            kwargs[name] = value
        return Call(args, kwargs)

    @property
    def direction(self) -> str:
        text = str(self.get("direction", ""))
        return "H2D" if "H2D" in text else "D2H" if "D2H" in text else text

    @property
    def op(self) -> str | None:
        key = self.get("transfer_key")
        return str(key) if key else None

    @property
    def request(self) -> str | None:
        op = self.op
        return op.rpartition("#")[0] or op if op else None

    def block_ids(self) -> list[list[int]] | None:
        """The host block ids per kernel group (0.5.6 passes them), else None."""
        ids = self.get("block_ids_host", ())
        try:
            return [[int(b) for b in group] for group in ids] or None
        except (TypeError, ValueError):
            return None


@dataclass
class Plan:
    """What one application changes: the call to make instead, and how to put back."""

    call: Call
    record: dict[str, Any]
    undo: list[Callable[[], None]] = field(default_factory=list)


@dataclass
class Donor:
    request: str
    size: int
    chunks: dict[str, tuple[int, Any]]  # "mid" / "last" -> (chunk index, bytes)


def _raw(obj: Any) -> Any:
    """A memory object's bytes (the raw buffer: LMCache 0.5.6's ``.tensor`` view raises for
    hybrid object groups), as corrupt_hook zeroes them."""
    return obj.raw_data[:int(obj.get_size())]


class FaultHook:
    """The hook's state in one server process: the control, donors, layouts, the log."""

    def __init__(self, control: Path, log: str | None,
                 sync: Callable[[], None] = _sync_current_stream) -> None:
        self.control_path = control
        self.log_path = log
        self.sync = sync
        self.lock = threading.Lock()
        self.control: Control | None = None
        self.last: Control | None = None  # the last control followed
        self.control_stamp: tuple[int, int] | None = None
        self.donors: OrderedDict[str, Donor] = OrderedDict()
        # (id of the cache context, object group) -> (a weak reference to it, its layout):
        # a context re-registered at a freed one's address is read again, none kept alive
        self.layouts: dict[tuple[int, int], tuple[Any, ObjectLayout]] = {}
        self.ordinal = 0

    # -- the log ---------------------------------------------------------------------------

    def write(self, record: dict[str, Any]) -> None:
        if self.log_path:
            line = json.dumps({"pid": os.getpid(), **record}, sort_keys=True) + "\n"
            with open(self.log_path, "a", encoding="utf-8") as out:
                out.write(line)

    # -- the control -----------------------------------------------------------------------

    def current(self) -> Control | None:
        """The control in force (re-read when the file changes; None while it is absent or
        unusable, which is logged once per version of the file)."""
        try:
            stat = self.control_path.stat()
        except OSError:
            self.control, self.control_stamp = None, None
            return None
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self.control_stamp:
            return self.control
        self.control_stamp, self.control = stamp, None
        try:
            control = parse_control(json.loads(self.control_path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            self.write({"kind": "error", "why": f"control file {self.control_path}: {exc}"})
            return None
        if self.last is not None and (control.fault, control.cell) != (self.last.fault,
                                                                       self.last.cell):
            # the next cell: its class from now on, no donor of the last kept
            self.write({"kind": "control", "class": control.fault, "cell": control.cell,
                        "replaces": self.last.fault})
            self.donors.clear()
        self.control = self.last = control
        return control

    # -- one call --------------------------------------------------------------------------

    def plan(self, call: Call) -> Plan | None:
        with self.lock:
            control = self.current()
            if control is None:
                return None
            cls = fault_class(control.fault)
            direction = "H2D" if cls.direction == "retrieve" else "D2H"
            if call.direction != direction:
                return None
            self.ordinal += 1
            request = call.request or f"op {self.ordinal}"
            chosen = control.selects(request)
            if control.fault in ("key-collision", "state-foreign"):
                # every retrieve's own bytes, before anything is placed in them: a chosen
                # request that comes first still serves those after it
                self.remember(call, request)
            if not chosen:
                return None
            base = {"class": control.fault, "cell": control.cell, "request": call.request,
                    "op": call.op,
                    "direction": direction, "object_group": call.get("object_group_id")}
            try:
                layout = self.layout(call)
                placer = PLACERS[control.fault]
                plan = placer(self, call, layout, control, request)
            except Unplaced as why:
                self.write({**base, "kind": "unplaced", "why": str(why)})
                return None
            plan.record = {**base, "kind": "applied", **plan.record}
            self.write(plan.record)
            return plan

    def layout(self, call: Call) -> ObjectLayout:
        context, group = call.get("cache_context"), int(call.get("object_group_id", 0))
        key = (id(context), group)
        cached = self.layouts.get(key)
        if cached is not None and cached[0]() is context:
            return cached[1]
        try:
            layout = read_layout(context, group)
        except LayoutUnreadable as exc:
            raise Unplaced(f"the object layout could not be read: {exc}") from exc
        with contextlib.suppress(TypeError):  # not weakly referable: read each time
            self.layouts[key] = (weakref.ref(context), layout)
        return layout

    def remember(self, call: Call, request: str) -> None:
        """Keep a copy of a middle and the last chunk of another request's retrieve (the
        bytes a collision or foreign state serves)."""
        if request in self.donors:
            return
        objs = list(call.get("memory_objs") or ())
        present = [i for i, o in enumerate(objs) if o is not None]
        if not present:
            return
        mids = [i for i in present if i < len(objs) - 1]
        chunks: dict[str, tuple[int, Any]] = {}
        for role, index in (("mid", mids[len(mids) // 2] if mids else None),
                            ("last", len(objs) - 1 if len(objs) - 1 in present else None)):
            if index is not None:
                chunks[role] = (index, _raw(objs[index]).clone())
        size = int(objs[present[0]].get_size())
        self.donors[request] = Donor(request, size, chunks)
        while len(self.donors) > MAX_DONORS:
            self.donors.popitem(last=False)

    def donor(self, request: str, role: str, size: int) -> tuple[Donor, int, Any]:
        for donor in reversed(self.donors.values()):
            if donor.request != request and donor.size == size and role in donor.chunks:
                index, data = donor.chunks[role]
                return donor, index, data
        raise Unplaced(f"no other request's {role} chunk of {size} bytes seen yet")


class Unplaced(Exception):
    """A selected transfer where the class cannot be placed; the message says why."""


# -- placing each class ----------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """What the placers read of one transfer."""

    layout: ObjectLayout
    objs: list[Any]
    block_ids: list[list[int]] | None
    skip: int

    @property
    def chunks(self) -> int:
        return len(self.objs)

    def written(self) -> list[int]:
        chunk = self.layout.chunk_tokens
        return [i for i, o in enumerate(self.objs)
                if o is not None and (i + 1) * chunk > self.skip]

    def middle(self) -> list[int]:
        """Written chunks before the last one (whose recurrent state is read)."""
        return [i for i in self.written() if i < self.chunks - 1]

    def read(self, span: Span, chunk: int) -> bool:
        return self.layout.read_by_engine(span, chunk, self.chunks, self.block_ids, self.skip)

    def placement(self, span: Span, chunk: int, **extra: Any) -> dict[str, Any]:
        return {"chunk": chunk, "layer": span.name, "layer_index": span.layer,
                "region": span.kind, "plane": span.plane, "block": span.block,
                "start": span.start, "stop": span.stop, "read": self.read(span, chunk),
                **extra}

    def checked(self, index: int) -> Any:
        obj = self.objs[index]
        size = int(obj.get_size())
        if size != self.layout.size:
            raise Unplaced(f"chunk {index}'s object holds {size} bytes, the layout "
                           f"{self.layout.size}")
        return obj


def _op(call: Call, layout: ObjectLayout) -> Op:
    return Op(layout, list(call.get("memory_objs") or ()), call.block_ids(),
              int(call.get("skip_first_n_tokens", 0) or 0))


def _pick(chunks: list[int], what: str) -> int:
    if not chunks:
        raise Unplaced(f"no {what}")
    return chunks[len(chunks) // 2]


def place_misrouted(hook: FaultHook, call: Call, layout: ObjectLayout, control: Control,
                    request: str) -> Plan:
    op = _op(call, layout)
    middle = op.middle()
    pairs = [a for a in middle if a + 1 in middle]
    a = _pick(pairs, f"two adjacent chunks before the last ({op.chunks} chunks)")
    b = a + 1
    for index in (a, b):
        op.checked(index)
    objs = list(op.objs)
    objs[a], objs[b] = objs[b], objs[a]
    placements = [op.placement(s, c, holds=other) for c, other in ((a, b), (b, a))
                  for s in layout.spans()]
    return Plan(call.replaced("memory_objs", objs), {"swapped": [a, b],
                                                     "placements": placements})


def _overwrite(hook: FaultHook, plan: Plan, obj: Any, ranges: list[tuple[int, int]],
               data: Any) -> None:
    """Write DATA's bytes over OBJ's RANGES now; put the old ones back after the transfer."""
    raw = _raw(obj)
    saved = [(start, stop, raw[start:stop].clone()) for start, stop in ranges]
    for start, stop in ranges:
        raw[start:stop].copy_(data[start:stop])

    def restore() -> None:
        for start, stop, old in saved:
            raw[start:stop].copy_(old)

    plan.undo.append(restore)


def place_key_collision(hook: FaultHook, call: Call, layout: ObjectLayout, control: Control,
                        request: str) -> Plan:
    op = _op(call, layout)
    target = _pick(op.middle(), f"chunk before the last ({op.chunks} chunks)")
    obj = op.checked(target)
    donor, index, data = hook.donor(request, "mid", layout.size)
    plan = Plan(call, {"chunk": target, "donor": {"request": donor.request, "chunk": index},
                       "placements": [op.placement(s, target) for s in layout.spans()]})
    _overwrite(hook, plan, obj, [(0, layout.size)], data)
    return plan


def place_lost_write(hook: FaultHook, call: Call, layout: ObjectLayout, control: Control,
                     request: str) -> Plan:
    op = _op(call, layout)
    target = _pick(op.middle(), f"stored chunk before the last ({op.chunks} chunks)")
    op.checked(target)
    objs = list(op.objs)
    objs[target] = None  # LMCache skips a None object of a store; its key is still committed
    return Plan(call.replaced("memory_objs", objs),
                {"chunk": target, "placements": [op.placement(s, target)
                                                 for s in layout.spans()]})


def _flip(hook: FaultHook, call: Call, layout: ObjectLayout, control: Control,
          read: bool) -> Plan:
    op = _op(call, layout)
    kind = ATTENTION if read else RECURRENT
    for chunk in sorted(op.middle() or op.written(),
                        key=lambda c: abs(c - (op.chunks - 1) / 2)):
        spans = [s for s in layout.spans() if s.kind == kind and op.read(s, chunk) == read]
        if spans:
            break
    else:
        where = "attention KV an engine reads" if read else "bytes no engine reads"
        raise Unplaced(f"no {where} in this op's {op.chunks} chunks")
    span = spans[0]
    obj = op.checked(chunk)
    itemsize = next(r.itemsize for r in layout.regions if r.kernel_group == span.kernel_group)
    middle = (span.start + span.stop) // 2
    byte = middle - middle % itemsize + itemsize - 1  # the element's most significant byte
    raw = _raw(obj)
    old = int(raw[byte])
    raw[byte] = old ^ (1 << control.bit)
    plan = Plan(call, {"chunk": chunk, "byte": byte, "bit": control.bit,
                       "placements": [op.placement(span, chunk, byte=byte)]})

    def restore() -> None:
        raw[byte] = old

    plan.undo.append(restore)
    return plan


def place_bit_flip(hook: FaultHook, call: Call, layout: ObjectLayout, control: Control,
                   request: str) -> Plan:
    return _flip(hook, call, layout, control, read=True)


def place_bit_flip_unread(hook: FaultHook, call: Call, layout: ObjectLayout, control: Control,
                          request: str) -> Plan:
    return _flip(hook, call, layout, control, read=False)


def _last_state(op: Op) -> tuple[int, list[Span]]:
    last = op.chunks - 1
    if last not in op.written():
        raise Unplaced(f"the op's last chunk ({last}) is not written")
    spans = [s for s in op.layout.spans() if s.kind == RECURRENT and op.read(s, last)]
    if not spans:
        raise Unplaced(f"no recurrent state an engine reads in chunk {last}")
    return last, spans


def place_state_unrestored(hook: FaultHook, call: Call, layout: ObjectLayout, control: Control,
                           request: str) -> Plan:
    op = _op(call, layout)
    last, spans = _last_state(op)
    targets = sorted({(s.kernel_group, last * layout.region_of(s.kernel_group).blocks + s.slot)
                      for s in spans})
    gpu = list(call.get("block_ids_gpu") or ())
    host = [list(g) for g in (call.get("block_ids_host") or ())]
    for group in sorted({g for g, _ in targets}):
        if group >= len(gpu):
            raise Unplaced(f"no block ids for kernel group {group}")
        gpu[group] = gpu[group].clone()  # the staged ids other object groups still read
    redirected = []
    for group, index in targets:
        known = op.block_ids[group][index] if op.block_ids else None
        redirected.append({"kernel_group": group, "block_id": known})
        gpu[group][index] = NULL_BLOCK  # on the transfer's stream, before its kernels
        if group < len(host) and index < len(host[group]):
            host[group][index] = NULL_BLOCK
    replaced = call.replaced("block_ids_gpu", gpu)
    if host:
        replaced = replaced.replaced("block_ids_host", host)
    return Plan(replaced, {"chunk": last, "redirected": redirected,
                           "placements": [op.placement(s, last) for s in spans]})


def place_state_foreign(hook: FaultHook, call: Call, layout: ObjectLayout, control: Control,
                        request: str) -> Plan:
    op = _op(call, layout)
    last, spans = _last_state(op)
    obj = op.checked(last)
    donor, index, data = hook.donor(request, "last", layout.size)
    plan = Plan(call, {"chunk": last, "donor": {"request": donor.request, "chunk": index},
                       "placements": [op.placement(s, last) for s in spans]})
    _overwrite(hook, plan, obj, [(s.start, s.stop) for s in spans], data)
    return plan


Placer = Callable[[FaultHook, Call, ObjectLayout, Control, str], Plan]
PLACERS: dict[str, Placer] = {
    "misrouted": place_misrouted,
    "key-collision": place_key_collision,
    "lost-write": place_lost_write,
    "bit-flip": place_bit_flip,
    "bit-flip-unread": place_bit_flip_unread,
    "state-unrestored": place_state_unrestored,
    "state-foreign": place_state_foreign,
}


def wrapper(hook: FaultHook) -> post_import.Wrapper:
    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        hook.write({"kind": "wrapped", "target": name})

        @functools.wraps(fn)
        def faulty(*args: Any, **kwargs: Any) -> Any:
            call = Call(list(args), dict(kwargs))
            try:
                plan = hook.plan(call)
            except Exception as exc:  # never break the server: the cell sees no application
                hook.write({"kind": "error", "why": f"{type(exc).__name__}: {exc}"[:500]})
                plan = None
            if plan is None:
                return fn(*args, **kwargs)
            try:
                return fn(*plan.call.args, **plan.call.kwargs)
            finally:
                _undo(hook, plan)

        return faulty

    return wrap


def _undo(hook: FaultHook, plan: Plan) -> None:
    if not plan.undo:
        return
    try:
        hook.sync()
        for step in plan.undo:
            step()
    except Exception as exc:
        hook.write({"kind": "error", "why": f"put back: {type(exc).__name__}: {exc}"[:500]})


def install() -> post_import.PostImportFinder | None:
    path = os.environ.get(CONTROL_ENV)
    if not path:
        return None
    hook = FaultHook(Path(path), os.environ.get(LOG_ENV))
    hook.write({"kind": "armed", "control": path})
    finder = post_import.install(TARGETS, wrapper(hook), TAG, verb="injecting faults in")
    print(f"sharedkv-{TAG}: fault injection armed (control file {path})", file=sys.stderr,
          flush=True)
    return finder
