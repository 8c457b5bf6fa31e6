"""Faults the self-tests plant in the suite's test doubles: the stub replicas and the
transfer provider's fetching replica. A self-test hands them in as typed values, from a
plugin that implements ``pytest_sharedkv_launch_faults`` (``hookspecs``); the provider
turns them into the double's own command-line flags. Nothing here reads the environment,
and no report key names a fault: a faulted pair is keyed as a clean one would be.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest


@dataclass(frozen=True)
class StubFaults:
    """What the stub replicas get wrong on purpose (``stub_openai``'s flags)."""

    corrupt_external: bool = False  # B changes every answer that hit the pool
    # the same, unless the replicas' environment sets this variable: a fault a triage
    # control removes (the stand-in of a race CUDA_LAUNCH_BLOCKING=1 hides)
    corrupt_external_unless: str | None = None
    crash_after: int | None = None  # B exits after this many completions
    ignore_salt: bool = False  # both: every namespace shares blocks (a leak)
    # both: keys leave the model identity (--identity: weights, RoPE, kv dtype, adapter) out
    identity_blind: bool = False
    # both: the pool's keys carry no cache_salt, the engines' own caches do (SGLang #37160:
    # its LMCache connector's key takes no salt)
    pool_ignores_salt: bool = False
    pool_blocks: int | None = None  # a pool keeps this many blocks, oldest out
    fail_metrics: tuple[int, ...] = ()  # these GET /metrics of B's answer HTTP 503
    diverge: bool = False  # B answers copy prompts wrong even cold (a model fault)
    no_gate: bool = False  # B has no gate hook: the gate's corruption never happens
    # the hosts topology: A flips a byte of this chunk's L2 entry of every prompt once it
    # wrote it (a byte changed in L2); B's server logs no L2 attached (serves without it)
    l2_flip_chunk: int | None = None
    l2_unattached: bool = False
    hosts_share_l1: bool = False  # the two "hosts" keep one L1: B's server saw A's KV
    # native offload: the two replicas' CPU tiers are one, so B's cross step hits A's KV,
    # which a native stack has no way to give it
    native_share_pool: bool = False
    # a race in the pool's copies: B's pool hits are stale unless the server runs this
    # stream remedy (a triage remedy cell removes it) or the replicas' launches are
    # synchronous (CUDA_LAUNCH_BLOCKING, as a real race's); or while the delay hook is on
    race_unless_remedy: str | None = None
    race_under_delay: bool = False
    no_hooks: bool = False  # both: the server hooks' stand-ins never load (their flags idle)
    # both: identical requests (one prompt, one salt) in flight together answer differently
    # (LMCache #4463's later report)
    twins_diverge: bool = False
    # both: each request of a prompt whose KV came from the pool answers differently (the
    # report's own condition: requests one after another)
    sequence_diverge: bool = False
    # both: a copy prompt of whole blocks loaded from the pool (its CPU tier) answers one
    # word off (vLLM #51094: the OffloadingConnector at exact chunk boundaries)
    boundary_diverge: bool = False
    # both: an engine's GPU prefix cache of this many blocks, least recently used out (a
    # size group larger than it is evicted before its local step asks again, and served
    # from the pool), its size logged at start as vLLM logs its GPU KV cache
    gpu_blocks: int | None = None
    # both: the GPU KV cache size the start log says, in tokens, in place of the true one
    # (a start log that says more than the cache keeps)
    gpu_kv_tokens: int | None = None
    # B: a hybrid's recurrent-state load for the last chunk of every pool hit, with the
    # state it resumed from in its audit record (the state oracle's input): "exact" (the
    # stub's state of those tokens), "zeroed" or "stale" (the chunk before's), planted;
    # None: no state loads (the other self-tests' audit counts stay as they are)
    state_loads: str | None = None

    def argv(self, replica: str, arm: str, replica_env: Mapping[str, str]) -> list[str]:
        """The flags REPLICA ("A" or "B") of an ARM pair starts with; REPLICA_ENV: what
        the launch sets in the replicas' environment."""
        argv: list[str] = []
        b = replica == "B"
        if b and (self.corrupt_external or (self.corrupt_external_unless is not None
                                            and self.corrupt_external_unless not in replica_env)):
            argv.append("--corrupt-external")
        if b and self.crash_after is not None:
            argv += ["--crash-after", str(self.crash_after)]
        if self.ignore_salt:
            argv.append("--ignore-salt")
        if self.identity_blind:
            argv.append("--identity-blind")
        if self.pool_ignores_salt:
            argv.append("--pool-ignores-salt")
        if self.pool_blocks is not None and arm != "OFF":  # OFF has no pool
            argv += ["--pool-blocks", str(self.pool_blocks)]
        if b and self.fail_metrics:
            argv += ["--fail-metrics", ",".join(str(n) for n in self.fail_metrics)]
        if b and self.diverge:
            argv.append("--diverge")
        if not b and self.l2_flip_chunk is not None:
            argv += ["--l2-flip-chunk", str(self.l2_flip_chunk)]
        if b and self.l2_unattached:
            argv.append("--l2-unattached")
        if b and self.race_unless_remedy is not None \
                and "CUDA_LAUNCH_BLOCKING" not in replica_env:
            argv += ["--race-unless-remedy", self.race_unless_remedy]
        if b and self.race_under_delay:
            argv.append("--race-under-delay")
        if self.no_hooks:
            argv.append("--no-hooks")
        if self.twins_diverge:
            argv.append("--twins-diverge")
        if self.sequence_diverge:
            argv.append("--sequence-diverge")
        if self.boundary_diverge:
            argv.append("--boundary-diverge")
        if self.gpu_blocks is not None:
            argv += ["--gpu-blocks", str(self.gpu_blocks)]
        if self.gpu_kv_tokens is not None:
            argv += ["--gpu-kv-tokens", str(self.gpu_kv_tokens)]
        if b and self.state_loads is not None:
            argv += ["--state-loads", self.state_loads]
        return argv


# The LMCache server's hook switches (a triage control's or the catalogue's server_env) as
# the stub's flags: the stub pair has no server, so its replicas stand in for its hooks.
STUB_HOOK_FLAGS = (("SHAREDKV_FAULT_CONTROL", "--fault-control"),  # fault_hook.CONTROL_ENV
                   ("SHAREDKV_FAULT_LOG", "--fault-log"),  # fault_hook.LOG_ENV
                   ("SHAREDKV_STREAM_REMEDY", "--stream-remedy"),  # stream_remedy_hook
                   ("SHAREDKV_STREAM_REMEDY_LOG", "--stream-remedy-log"))


def stub_hook_flags(server_env: Mapping[str, str], inject_log: Path | None) -> list[str]:
    """The stub's flags for the server hooks SERVER_ENV arms, and the delay hook's log where
    the launch injects a delay (INJECT_LOG)."""
    argv = []
    for name, flag in STUB_HOOK_FLAGS:
        if server_env.get(name):
            argv += [flag, server_env[name]]
    if inject_log is not None:
        argv += ["--inject-log", str(inject_log)]
    return argv


@dataclass(frozen=True)
class TransferFaults:
    """What the transfer provider's fetching replica gets wrong on purpose."""

    off_by_one: bool = False  # B retrieves each block into the one after it
    # the identity tier's drivers drop every cache_salt (LMCache #4825's SGLang path): the
    # salt-blind fault on the real server
    salt_blind: bool = False

    def argv(self) -> list[str]:
        """The flags the fetching replica starts with."""
        return ["--off-by-one"] if self.off_by_one else []


@dataclass(frozen=True)
class LaunchFaults:
    """Every test double's planted faults; the default plants none."""

    stub: StubFaults = StubFaults()
    transfer: TransferFaults = TransferFaults()


NO_FAULTS = LaunchFaults()


def planted(config: pytest.Config) -> LaunchFaults:
    """The faults a self-test's plugin planted for this run, else none."""
    found = config.hook.pytest_sharedkv_launch_faults(config=config)
    if found is None:
        return NO_FAULTS
    if not isinstance(found, LaunchFaults):
        raise TypeError(f"pytest_sharedkv_launch_faults returned {type(found).__name__}, "
                        "not LaunchFaults")
    return found
