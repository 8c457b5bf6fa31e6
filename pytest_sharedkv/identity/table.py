"""The identity table as data: the dimensions that change KV, the stacks, and for each
stack the dimensions it can vary here or the precise reason it cannot (a cell skipped with
that reason). No torch, no launch: collection reads it.

Each (stack, dimension) is a PAIR of cells: ``same`` (the same identity must hit: the
positive control, without which the pair is VOID) and ``other`` (another identity must not
hit, or, where the stack shares legitimately, must answer exactly).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Dimension(str, Enum):
    """What changes the KV a key must tell apart."""

    SALT = "salt"  # the tenant (cache_salt): any hit across it is an isolation failure
    LORA = "lora"  # the LoRA adapter a request names
    WEIGHTS = "weights"  # other weights under one served name
    ROPE = "rope-scaling"
    KV_DTYPE = "kv-cache-dtype"
    CHUNK = "chunk-size"
    RELEASE = "lmcache-release"  # another LMCache release reading one L2
    # the server restarted between the two, a persistent L2 carried across (the changed
    # identity: another configuration under the same name, vLLM #56311's condition)
    RESTART_SERVER = "restart-server"
    RESTART_L2 = "restart-l2"  # the L2's own process restarted too (a persistent Redis)

    def __str__(self) -> str:
        return str(self.value)


class Side(str, Enum):
    SAME = "same"  # positive control: the same identity hits
    OTHER = "other"  # another identity: no hit, or exact answers (never for a salt)

    def __str__(self) -> str:
        return str(self.value)


class IdentityStack(str, Enum):
    """The stacks the table is run on; CPU ones run in CI."""

    STUB = "stub"  # the stub double (a shared pool keyed by salt, identity, chunk)
    TRANSFER = "transfer"  # the real LMCache MP server with LMCache's own client, no model
    MP = "mp"  # vLLM + LMCache's MP server (GPU)
    INPROCESS = "inprocess"  # vLLM + LMCacheConnectorV1 (GPU)
    NATIVE = "native"  # vLLM's own CPU offload (GPU)
    HOSTS = "hosts"  # two MP servers through each L2 (GPU)

    def __str__(self) -> str:
        return str(self.value)

    @property
    def gpu(self) -> bool:
        return self not in (IdentityStack.STUB, IdentityStack.TRANSFER)


@dataclass(frozen=True)
class Reach:
    """Whether a stack varies a dimension here: ``skip`` is the precise reason it cannot
    ("" where it can); ``shares`` where the stack legitimately keys both identities alike,
    so a hit must answer exactly."""

    skip: str = ""
    shares: bool = False

    @property
    def runs(self) -> bool:
        return not self.skip


RUNS = Reach()
NO_MODEL = ("the model-free transfer client has no weights or model configuration: "
            "LMCache keys the served name, not what it serves, so this is a launched "
            "pair's cell (contrib/gpu-host/plans/identity-table.sh)")
LORA_GPU = ("needs vLLM serving a LoRA for the model's architecture (--sharedkv-identity-lora): "
            "a GPU cell")
NOT_BUILT = ("the GPU runner of this cell is planned, not built "
             "(contrib/gpu-host/plans/identity-table.sh)")
FS_NO_PROCESS = ("an fs L2 is a directory, with no process to restart: restart-server carries "
                 "it across; a Redis L2 restarted with its persistence on is the GPU kit's "
                 "cell (contrib/gpu-host/plans/identity-restart.sh)")
ONE_RELEASE = ("the stub models no LMCache release: the transfer cells carry it, on two "
               "installed releases")

TABLE: dict[IdentityStack, dict[Dimension, Reach]] = {
    IdentityStack.STUB: {
        Dimension.SALT: RUNS, Dimension.LORA: RUNS, Dimension.WEIGHTS: RUNS,
        Dimension.ROPE: RUNS, Dimension.KV_DTYPE: RUNS, Dimension.CHUNK: RUNS,
        Dimension.RELEASE: Reach(ONE_RELEASE),
        Dimension.RESTART_SERVER: RUNS, Dimension.RESTART_L2: Reach(FS_NO_PROCESS),
    },
    IdentityStack.TRANSFER: {
        Dimension.SALT: RUNS,
        Dimension.LORA: Reach("the model-free transfer client names no adapter (LMCache "
                              "0.5.6's MP key has no adapter field: vLLM #44250); " + LORA_GPU),
        Dimension.WEIGHTS: Reach(NO_MODEL), Dimension.ROPE: Reach(NO_MODEL),
        Dimension.KV_DTYPE: Reach(NO_MODEL),
        Dimension.CHUNK: RUNS,
        Dimension.RELEASE: RUNS,  # skipped at run time without --sharedkv-identity-release-site
        Dimension.RESTART_SERVER: RUNS, Dimension.RESTART_L2: Reach(FS_NO_PROCESS),
    },
    **{stack: {d: Reach(LORA_GPU if d is Dimension.LORA else NOT_BUILT) for d in Dimension}
       for stack in (IdentityStack.MP, IdentityStack.INPROCESS, IdentityStack.NATIVE,
                     IdentityStack.HOSTS)},
}


@dataclass(frozen=True)
class IdentityCell:
    """One pair of the table: a stack and a dimension (its two sides run together)."""

    stack: IdentityStack
    dimension: Dimension

    @property
    def id(self) -> str:
        return f"{self.stack}-{self.dimension}"

    @property
    def reach(self) -> Reach:
        return TABLE[self.stack][self.dimension]

    def key(self) -> dict[str, str]:
        return {"stack": str(self.stack), "dimension": str(self.dimension)}


def cells(stacks: tuple[IdentityStack, ...] = tuple(IdentityStack)) -> list[IdentityCell]:
    """Every pair of the table for STACKS, in table order (same shape for every stack)."""
    return [IdentityCell(s, d) for s in stacks for d in Dimension]
