"""The identity table on the stub double, launched through the stub provider
(``stack.launch.providers.stub_pair``): each dimension a pair of cells over one shared pool (or,
for a restart, a persistent ``fs`` L2 the restarted servers read).

Protocol, the same a launched vLLM pair runs: replica A answers a copy prompt cold under
the tenant's salt (it stores the KV); ``same``: a replica of A's identity answers it under
that salt, and must hit and answer as A did; ``other``: a replica of another identity (or
under another salt) answers it, and its answer is compared with its own cold answer under
a fresh salt (the reference). The stub answers a block another identity stored as stale KV,
so a key that leaves the identity out (the planted ``identity_blind``) answers wrong, and
one that leaves the salt out (``ignore_salt``, the salt-blind fault) hits across tenants.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_sharedkv.identity.judge import SideResult
from pytest_sharedkv.identity.table import Dimension, Side
from pytest_sharedkv.stack.launch.identity_launch import ReplicaIdentity, StubIdentity

if TYPE_CHECKING:
    from pytest_sharedkv.stack.faults import StubFaults
    from pytest_sharedkv.stack.launch.spec import LaunchSpec
    from pytest_sharedkv.stack.pair import ReplicaPair

CHUNK = 32  # the stub's pool chunk (the other chunk: twice it)
PROMPT_WORDS = 255  # with <s>: 256 tokens, 7 whole chunks hit (hits stop one token short)
ANSWER = 16
BASE = ReplicaIdentity()
# what the other side changes, per dimension the stub varies by identity
OTHER: dict[Dimension, ReplicaIdentity] = {
    Dimension.WEIGHTS: ReplicaIdentity(weights="codebook-2"),
    Dimension.ROPE: ReplicaIdentity(rope="yarn:2"),
    Dimension.KV_DTYPE: ReplicaIdentity(kv_dtype="fp8"),
    Dimension.LORA: ReplicaIdentity(lora="adapter-1"),
    Dimension.CHUNK: ReplicaIdentity(chunk=2 * CHUNK),
    # a restart with a changed configuration under the same served name (vLLM #56311)
    Dimension.RESTART_SERVER: ReplicaIdentity(rope="yarn:2"),
}


def copy_prompt(seed: str) -> str:
    """A copy prompt of PROMPT_WORDS words in the copy model's vocabulary (w00..w62)."""
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(63):02d}" for _ in range(PROMPT_WORDS))


@dataclass(frozen=True)
class StubRun:
    """What one dimension's pair of cells on the stub observed."""

    same: SideResult
    other: SideResult
    launches: int


def _external(reply: object) -> int | None:
    hit = getattr(reply, "external_hit_tokens", None)
    cached = int(getattr(reply, "cached_tokens", 0) or 0)
    return cached if hit is None and cached else hit


def _same(pair: ReplicaPair, prompt: str, salt: str, answer: str) -> SideResult:
    reply = pair.send("B", prompt, ANSWER, salt)
    exact = reply.text == answer
    return SideResult(Side.SAME, _external(reply), exact,
                      "" if exact else f"answered {reply.text!r}, A {answer!r}")


def _other(pair: ReplicaPair, prompt: str, salt: str, fresh: str) -> SideResult:
    """B (another identity, or under another salt) after its cold reference (FRESH)."""
    reference = pair.send("B", prompt, ANSWER, fresh)
    reply = pair.send("B", prompt, ANSWER, salt)
    exact = reply.text == reference.text
    return SideResult(Side.OTHER, _external(reply), exact,
                      "" if exact else f"answered {reply.text!r}, its own cold answer "
                      f"{reference.text!r}", cold_hit=reference.cached_tokens)


def run(dimension: Dimension, log_dir: Path, salt: str, faults: StubFaults) -> StubRun:
    """DIMENSION's two cells on stub pairs under LOG_DIR (every pair closed)."""
    from pytest_sharedkv.stack.launch.spec import LaunchSpec

    prompt = copy_prompt(f"identity-{dimension}")
    spec = LaunchSpec(log_dir=log_dir, chunk_size=CHUNK, gate=False, stub_faults=faults,
                      identity=StubIdentity(BASE, BASE))
    if dimension is Dimension.RESTART_SERVER:
        return _restart(spec, prompt, salt)
    pair = _launch(spec)
    try:
        written = pair.send("A", prompt, ANSWER, salt)
        same = _same(pair, prompt, salt, written.text)
        if dimension is Dimension.SALT:
            other = _other(pair, prompt, _salt(salt, "tenant-2"), _salt(salt, "fresh"))
            return StubRun(same, replace(other, cold_hit=written.cached_tokens or
                                         other.cold_hit), 1)
    finally:
        pair.close()
    pair = _launch(replace(spec, identity=StubIdentity(BASE, OTHER[dimension])))
    try:
        return StubRun(same, _other(pair, prompt, salt, _salt(salt, "fresh")), 2)
    finally:
        pair.close()


def _restart(spec: LaunchSpec, prompt: str, salt: str) -> StubRun:
    """Two stub servers over a persistent fs L2: A stores, every process stops; restarted
    servers (fresh L1s, the same L2) of the same configuration must hit; of a changed one
    under the same name (vLLM #56311's condition) must not hit, or answer exactly."""
    from pytest_sharedkv.stack.l2.backends import DirectoryL2
    from pytest_sharedkv.stack.topology import HostsSpec

    l2 = DirectoryL2(spec.log_dir / "persistent-l2")
    l2.start()
    hosts = HostsSpec(adapter=l2.adapter_json(), l2=l2.describe(), cell="identity-restart")
    first = replace(spec, log_dir=spec.log_dir / "before", hosts=hosts)
    pair = _launch(first)
    try:
        written = pair.send("A", prompt, ANSWER, salt)
    finally:
        pair.close()
    pair = _launch(replace(first, log_dir=spec.log_dir / "after-same"))
    try:
        same = _same(pair, prompt, salt, written.text)
    finally:
        pair.close()
    changed = StubIdentity(BASE, OTHER[Dimension.RESTART_SERVER])
    pair = _launch(replace(first, log_dir=spec.log_dir / "after-changed", identity=changed))
    try:
        return StubRun(same, _other(pair, prompt, salt, _salt(salt, "fresh")), 3)
    finally:
        pair.close()


def _launch(spec: LaunchSpec) -> ReplicaPair:
    from pytest_sharedkv.stack.launch.providers import stub_pair

    spec.log_dir.mkdir(parents=True, exist_ok=True)
    return stub_pair(spec)


def _salt(salt: str, suffix: str) -> str:
    """Another salt from SALT, within LMCache's 128 characters."""
    return f"{salt[:100]}-{suffix}"
