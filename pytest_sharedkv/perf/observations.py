"""What a perf screening records, as plain data: every measured (and warm-up) request, every
session, the physical floor and the run around them. The perf tier writes one ``PerfRun``
into the sharedkv JSON report under the key ``"perf"``; the analysis and ``compare`` read
it back through ``from_json``, which refuses a foreign or broken record by name."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pytest_sharedkv.config.options import CONTROL_ARM, TREATMENT_ARMS
from pytest_sharedkv.stack.steps import STEP_NAMES

PERF_SCHEMA = "pytest-sharedkv-perf/1"
# OFF: GPU prefix caching, no shared pool; ON: the shared LMCache pool (validated
# allocator); NATIVE: vLLM's native CPU offloading.
ARMS = (CONTROL_ARM, *TREATMENT_ARMS)
STEPS = STEP_NAMES
# window-N: N alternating sessions at once (throughput screening), kept apart from the
# plain placements so their wall times never mix
PLACEMENTS = ("fixed", "alternating", "window-4", "window-8")


def arm_order(arm: str) -> int:
    """ARMS' order (OFF, ON, NATIVE), an arm it does not know last."""
    return ARMS.index(arm) if arm in ARMS else len(ARMS)


class PerfReportError(ValueError):
    """A perf record that cannot be read: the message names what is wrong and where."""


@dataclass(frozen=True)
class Observation:
    """One measured (or warm-up) request.

    ``block`` counts blocks in run order from 0; ``pair`` is the block pair (blocks
    OFF-ON-ON-OFF: blocks 0 and 1 are pair 0, blocks 2 and 3 pair 1); ``request`` is
    stable across blocks; ``ttft_s`` is client-side, to the first token event
    (streaming); ``decode_tok_s`` is (N_out - 1) / (t_last - t_first), None when N_out < 2;
    ``cached_tokens`` is the engine's count of prompt tokens served from a cache (its own
    prefix cache or the pool; None where the engine reports none); ``l1_keys`` and
    ``l2_keys``: where the receiving LMCache server said the lookup's keys came from (its
    log's ``retained keys (a L1, b L2)``), read for the HOSTS arm's steps on B; None where
    not read or not logged (unknown, not zero).
    """

    arm: str
    block: int
    pair: int
    size: str
    step: str
    request: str
    payload_sha256: str
    replica: str
    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    decode_tok_s: float | None
    e2e_s: float
    warmup: bool = False
    cached_tokens: int | None = None
    l1_keys: int | None = None
    l2_keys: int | None = None


@dataclass(frozen=True)
class SessionObservation:
    """One six-turn session, its turns on one replica (fixed) or alternating."""

    arm: str
    block: int
    pair: int
    session: str
    placement: str
    turns: int
    wall_s: float
    payload_sha256: str


@dataclass(frozen=True)
class Floor:
    """The physical floor of a cross-replica hit, measured in the same run: the bytes a
    prompt's KV (and one sequence's recurrent state) take, moved host-to-device at the
    measured rate. A cross-replica TTFT below it cannot have come through the pool."""

    h2d_gb_s: float
    kv_bytes_per_token: int
    recurrent_bytes_per_sequence: int
    source: str
    # what the pool stores a token as the engine lays the KV out (a hybrid model's padded
    # pages: 4x the KV for the 27B), where that differs from the KV; None: the same, or an
    # older report. A full hit moves this much: the floor of this stack's layout.
    stored_bytes_per_token: int | None = None
    # the HOSTS arm's L2 read rate measured in the same run (GB/s); None: no HOSTS arm, or
    # an older report. Its floor: the stored bytes of a prompt at that rate.
    l2_gb_s: float | None = None

    @property
    def stored_or_kv_bytes_per_token(self) -> int:
        return self.stored_bytes_per_token or self.kv_bytes_per_token

    def l2_seconds(self, tokens: int) -> float | None:
        """The stored bytes of TOKENS at the L2 read rate; None where not measured."""
        if not self.l2_gb_s:
            return None
        return tokens * self.stored_or_kv_bytes_per_token / (self.l2_gb_s * 1e9)

    def seconds(self, tokens: int) -> float:
        return ((tokens * self.kv_bytes_per_token + self.recurrent_bytes_per_sequence)
                / (self.h2d_gb_s * 1e9))

    def layout_seconds(self, tokens: int) -> float | None:
        """The stored bytes of TOKENS at the measured rate; None where not recorded."""
        if self.stored_bytes_per_token is None:
            return None
        return tokens * self.stored_bytes_per_token / (self.h2d_gb_s * 1e9)


@dataclass(frozen=True)
class RunSource:
    """One separate run a merged screening holds (``merge-screenings``): which of the
    merged blocks and block pairs it measured, where and when. A screening straight from
    the perf tier has none."""

    source: str  # the report file it came from
    host: str  # what the report says of the machine (no host name is recorded: the GPUs)
    created: str  # when that run's report was written
    first_block: int
    blocks: int
    first_pair: int
    pairs: int
    wall_s: float
    engine_flags: str  # "recorded" or "engine flags not recorded"


@dataclass(frozen=True)
class ReplicaPlacement:
    """Where the pair's engines ran: both on one GPU contend for it, one per GPU do not, so
    two screenings of another placement time different things (``compare`` shows their
    speed, not judges it; ``merge-screenings`` refuses to mix them)."""

    # distinct GPUs the two replicas ran on (1: both on one, 2: one each); None: the suite
    # launched no engine (a stub double, external endpoints), so no GPU of theirs is known
    pair_gpus: int | None
    # each launched replica's CUDA_VISIBLE_DEVICES ("": it inherited the run's); {}: none
    replicas: dict[str, str] = field(default_factory=dict)


def placed_on(devices: Mapping[str, Sequence[str]]) -> ReplicaPlacement:
    """The placement of replicas launched on DEVICES (each one's CUDA devices; () where it
    inherited the run's, the same for both); none launched: pair_gpus None."""
    if not devices:
        return ReplicaPlacement(None)
    return ReplicaPlacement(len({tuple(d) for d in devices.values()}),
                            {name: ",".join(d) for name, d in sorted(devices.items())})


def describe_placement(pair_gpus: int | None) -> str:
    """The words for a placement's GPU count (the compare's PLACEMENT DIFFERS, the notes)."""
    if pair_gpus is None:
        return "no GPU known (the suite launched no engine: a stub double or external " \
            "endpoints)"
    return {1: "both replicas on one GPU", 2: "one replica per GPU"}.get(
        pair_gpus, f"the replicas on {pair_gpus} GPUs")


@dataclass
class PerfRun:
    """What the perf tier writes under the report's top-level key ``"perf"``."""

    schema: str
    model_digest: str
    corpus_digest: str
    engine: dict[str, str]  # {"vllm": version, "lmcache": version, "torch": ..., "gpu": name}
    blocks: list[str]  # the arm of each block in run order, e.g. ["OFF", "ON", "ON", "OFF"]
    floor: Floor | None
    observations: list[Observation] = field(default_factory=list)
    sessions: list[SessionObservation] = field(default_factory=list)
    restarts_s: list[float] = field(default_factory=list)  # each block's replica restart
    wall_s: float = 0.0  # the screening's total wall time
    notes: list[str] = field(default_factory=list)
    chunk_tokens: int | None = None  # the pool's chunk: a full hit misses less than one
    runs: list[RunSource] = field(default_factory=list)  # a merge's separate runs, in order
    # the served model: kind, weights (random / seeded / checkpoint), compute, why chosen
    model: dict[str, str] = field(default_factory=dict)
    # the launched vLLM's engine settings (stack.providers.EngineSettings.record); compare
    # reads them: speed cells of runs whose engine flags differ are not judged
    engine_settings: dict[str, Any] = field(default_factory=dict)
    # each block's launched processes: {"arm", "processes": [{"name", "argv", "env"}]}
    launches: list[dict[str, Any]] = field(default_factory=list)
    # the block pair of each block, parallel to ``blocks`` (0, 0, 1, 1, ...): what lets a
    # merge hold pairs of different arms and sizes (OFF-ON beside OFF-NATIVE). Empty: not
    # recorded (reports written before it), read as consecutive pairs of one size each
    # (``pairing.pair_layout``)
    block_pairs: list[int] = field(default_factory=list)
    # where the replicas ran (one GPU or one each); None: not recorded (reports before it)
    replica_placement: ReplicaPlacement | None = None


def size_tokens(size: str) -> int | None:
    """Nominal tokens of a size label: "8k" -> 8192, "128k" -> 131072, "3000" -> 3000."""
    text = size.strip().lower()
    scale = 1024 if text.endswith("k") else 1
    try:
        return int(float(text.rstrip("k")) * scale)
    except ValueError:
        return None


def size_order(size: str) -> tuple[float, str]:
    """Sort key: sizes by their nominal tokens, unknown labels last."""
    tokens = size_tokens(size)
    return (math.inf if tokens is None else float(tokens), size)


# --- JSON -------------------------------------------------------------------------------


def to_json(run: PerfRun) -> dict[str, Any]:
    """The run as JSON; ``runs`` only where it is a merge, ``block_pairs``, the replica
    placement and the floor's stored bytes only where known (a record without them stays
    what it was before they existed)."""
    data = asdict(run)
    for name in ("runs", "block_pairs", "replica_placement"):
        if not getattr(run, name):
            del data[name]
    for name in ("stored_bytes_per_token", "l2_gb_s"):
        if data.get("floor") is not None and data["floor"].get(name) is None:
            del data["floor"][name]
    for o in data["observations"]:
        for name in _UNREAD:
            if o.get(name) is None:
                o.pop(name, None)
    return data


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


_KIND: dict[str, tuple[Callable[[object], bool], str]] = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "int": (_is_int, "an integer"),
    "float": (_is_number, "a finite number"),
    # a time the client measured: a TTFT, a request or session of no time cannot be right
    "seconds": (lambda v: isinstance(v, (int, float)) and _is_number(v) and v > 0,
                "a finite number of seconds above 0"),
    "float?": (lambda v: v is None or _is_number(v), "a finite number or null"),
    "int?": (lambda v: v is None or _is_int(v), "an integer or null"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
}
_OBSERVATION = {"arm": "str", "block": "int", "pair": "int", "size": "str", "step": "str",
                "request": "str", "payload_sha256": "str", "replica": "str",
                "prompt_tokens": "int", "output_tokens": "int", "ttft_s": "seconds",
                "decode_tok_s": "float?", "e2e_s": "seconds", "warmup": "bool",
                "cached_tokens": "int?", "l1_keys": "int?", "l2_keys": "int?"}
_SESSION = {"arm": "str", "block": "int", "pair": "int", "session": "str", "placement": "str",
            "turns": "int", "wall_s": "seconds", "payload_sha256": "str"}
_FLOOR = {"h2d_gb_s": "float", "kv_bytes_per_token": "int",
          "recurrent_bytes_per_sequence": "int", "source": "str",
          "stored_bytes_per_token": "int?", "l2_gb_s": "float?"}
_RUN_SOURCE = {"source": "str", "host": "str", "created": "str", "first_block": "int",
               "blocks": "int", "first_pair": "int", "pairs": "int", "wall_s": "float",
               "engine_flags": "str"}
_UNREAD = ("l1_keys", "l2_keys")  # left out of an observation's JSON while not read
# older reports lack them
_OPTIONAL = {"warmup", "cached_tokens", "stored_bytes_per_token", "l2_gb_s", *_UNREAD}


def _fields(data: object, spec: Mapping[str, str], where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise PerfReportError(f"{where}: expected an object, found {type(data).__name__}")
    out: dict[str, Any] = {}  # fields this version does not know are left out
    for name, kind in spec.items():
        if name not in data:
            if name in _OPTIONAL:
                continue
            raise PerfReportError(f"{where}: missing field {name!r}")
        check, words = _KIND[kind]
        value = data[name]
        if not check(value):
            raise PerfReportError(f"{where}.{name}: expected {words}, found {value!r}")
        numeric = kind in ("float", "seconds") or (kind == "float?" and value is not None)
        out[name] = float(value) if numeric else value
    return out


def _one_of(value: str, allowed: tuple[str, ...], where: str) -> None:
    if value not in allowed:
        raise PerfReportError(f"{where}: {value!r} is not one of {', '.join(allowed)}")


def _observation(data: object, where: str) -> Observation:
    values = _fields(data, _OBSERVATION, where)
    _one_of(values["arm"], ARMS, f"{where}.arm")
    _one_of(values["step"], STEPS, f"{where}.step")
    return Observation(**values)


def _session(data: object, where: str) -> SessionObservation:
    values = _fields(data, _SESSION, where)
    _one_of(values["arm"], ARMS, f"{where}.arm")
    _one_of(values["placement"], PLACEMENTS, f"{where}.placement")
    return SessionObservation(**values)


def _list(data: dict[str, Any], name: str) -> list[Any]:
    value = data.get(name, [])
    if not isinstance(value, list):
        raise PerfReportError(f"perf.{name}: expected a list, found {type(value).__name__}")
    return value


def _strings(values: list[Any], where: str) -> list[str]:
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise PerfReportError(f"{where}[{i}]: expected a string, found {value!r}")
    return list(values)


def from_json(data: object) -> PerfRun:
    """The run a report's ``"perf"`` value holds; ``PerfReportError`` names what is wrong."""
    if not isinstance(data, dict):
        raise PerfReportError(f"perf: expected an object, found {type(data).__name__}")
    schema = data.get("schema")
    if schema != PERF_SCHEMA:
        raise PerfReportError(f"perf.schema: {schema!r} is not {PERF_SCHEMA!r} (a foreign or "
                              "newer perf record)")
    for name in ("model_digest", "corpus_digest"):
        if not isinstance(data.get(name), str):
            raise PerfReportError(f"perf.{name}: expected a string, found "
                                  f"{data.get(name)!r}")
    engine = data.get("engine", {})
    if not isinstance(engine, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in engine.items()):
        raise PerfReportError(f"perf.engine: expected an object of strings, found {engine!r}")
    blocks = _strings(_list(data, "blocks"), "perf.blocks")
    for i, arm in enumerate(blocks):
        _one_of(arm, ARMS, f"perf.blocks[{i}]")
    floor_data = data.get("floor")
    floor = None if floor_data is None else Floor(**_fields(floor_data, _FLOOR, "perf.floor"))
    if floor is not None and floor.h2d_gb_s <= 0:
        raise PerfReportError(f"perf.floor.h2d_gb_s: must be positive, found {floor.h2d_gb_s}")
    restarts = _list(data, "restarts_s")
    for i, value in enumerate(restarts):
        if not _is_number(value):
            raise PerfReportError(f"perf.restarts_s[{i}]: expected a number, found {value!r}")
    wall = data.get("wall_s", 0.0)
    if not _is_number(wall):
        raise PerfReportError(f"perf.wall_s: expected a number, found {wall!r}")
    chunk = data.get("chunk_tokens")
    if chunk is not None and not (_is_int(chunk) and chunk > 0):
        raise PerfReportError(f"perf.chunk_tokens: expected a positive integer or null, "
                              f"found {chunk!r}")
    block_pairs = _block_pairs(_list(data, "block_pairs"), blocks)
    observations = [_observation(o, f"perf.observations[{i}]")
                    for i, o in enumerate(_list(data, "observations"))]
    sessions = [_session(s, f"perf.sessions[{i}]")
                for i, s in enumerate(_list(data, "sessions"))]
    for name, records in (("observations", observations), ("sessions", sessions)):
        _in_their_pairs(records, block_pairs, f"perf.{name}")
    return PerfRun(
        schema=schema, model_digest=data["model_digest"], corpus_digest=data["corpus_digest"],
        engine=dict(engine), blocks=blocks, floor=floor, block_pairs=block_pairs,
        observations=observations, sessions=sessions,
        restarts_s=[float(r) for r in restarts], wall_s=float(wall),
        notes=_strings(_list(data, "notes"), "perf.notes"), chunk_tokens=chunk,
        runs=[RunSource(**_fields(r, _RUN_SOURCE, f"perf.runs[{i}]"))
              for i, r in enumerate(_list(data, "runs"))],
        model=_mapping(data, "model", str_values=True),
        engine_settings=_mapping(data, "engine_settings"),
        launches=[dict(x) for x in _list(data, "launches") if isinstance(x, dict)],
        replica_placement=_replica_placement(data.get("replica_placement")))


def _replica_placement(data: object) -> ReplicaPlacement | None:
    """``perf.replica_placement`` where recorded (older reports: None)."""
    if data is None:
        return None
    where = "perf.replica_placement"
    values = _fields(data, {"pair_gpus": "int?"}, where)
    gpus = values["pair_gpus"]
    if gpus is not None and gpus < 1:
        raise PerfReportError(f"{where}.pair_gpus: expected a positive integer or null, "
                              f"found {gpus!r}")
    replicas = data.get("replicas", {}) if isinstance(data, dict) else {}
    if not isinstance(replicas, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in replicas.items()):
        raise PerfReportError(f"{where}.replicas: expected an object of strings, found "
                              f"{replicas!r}")
    return ReplicaPlacement(gpus, dict(replicas))


def _block_pairs(values: list[Any], blocks: list[str]) -> list[int]:
    """``perf.block_pairs`` where recorded: one pair number a block, from 0, each block in
    the pair of the block before it or the next one (pairs are consecutive blocks)."""
    if not values:
        return []
    if len(values) != len(blocks):
        raise PerfReportError(f"perf.block_pairs: {len(values)} entries for {len(blocks)} "
                              "blocks (one pair number a block)")
    expected = [0]
    for i, value in enumerate(values):
        if not _is_int(value) or value not in expected:
            raise PerfReportError(f"perf.block_pairs[{i}]: expected "
                                  f"{' or '.join(map(str, expected))}, found {value!r} (pairs "
                                  "are numbered from 0, in run order)")
        expected = [value, value + 1]
    return list(values)


def _in_their_pairs(records: Sequence[Observation | SessionObservation],
                    block_pairs: list[int], where: str) -> None:
    """Each record's pair is its block's (where the pairs are recorded): pairing reads the
    pair a block belongs to from ``block_pairs`` and the records' own numbers alike."""
    for i, r in enumerate(records):
        if r.block < len(block_pairs) and r.pair != block_pairs[r.block]:
            raise PerfReportError(f"{where}[{i}].pair: {r.pair}, but perf.block_pairs puts "
                                  f"block {r.block} in block pair {block_pairs[r.block]}")


def _mapping(data: dict[str, Any], name: str, str_values: bool = False) -> dict[str, Any]:
    """An optional object field (older reports lack it: empty)."""
    value = data.get(name, {})
    if not isinstance(value, dict) or (str_values and not all(
            isinstance(v, str) for v in value.values())):
        raise PerfReportError(f"perf.{name}: expected an object"
                              f"{' of strings' if str_values else ''}, found {value!r}")
    return dict(value)
