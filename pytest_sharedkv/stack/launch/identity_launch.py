"""What each replica of an identity cell serves as: the parts of a model's identity that
change its KV (weights under one served name, RoPE scaling, kv-cache dtype, a LoRA
adapter) and the chunk size, as the launch of a pair takes them.

The stub double folds ``tag`` into its keys (``--identity``), as a stack whose keys are
right would, and answers a block another identity stored as stale KV (what KV computed by
other weights gives); ``--block`` is its chunk. A launched vLLM pair would take the same
record as its engine flags (the GPU kit's plan, ``contrib/gpu-host/plans/identity-*.sh``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ReplicaIdentity:
    """One replica's identity; every field empty is the served model as launched."""

    weights: str = ""  # another codebook of the copy model: other weights, one served name
    rope: str = ""  # a RoPE scaling (e.g. "yarn:2")
    kv_dtype: str = ""  # the kv-cache dtype (e.g. "fp8")
    lora: str = ""  # the adapter a request names
    chunk: int | None = None  # the pool's chunk in tokens (None: the launch's)

    @property
    def tag(self) -> str:
        """The identity as one string ("" for the model as launched)."""
        parts = (f"weights={self.weights}" if self.weights else "",
                 f"rope={self.rope}" if self.rope else "",
                 f"kv_dtype={self.kv_dtype}" if self.kv_dtype else "",
                 f"lora={self.lora}" if self.lora else "")
        return ",".join(p for p in parts if p) or "base"

    def stub_argv(self) -> list[str]:
        argv = ["--identity", self.tag]
        if self.chunk is not None:
            argv += ["--block", str(self.chunk)]  # the stub's last --block wins
        return argv


@dataclass(frozen=True)
class StubIdentity:
    """Replica A's identity and replica B's (the stub pair's launch)."""

    a: ReplicaIdentity = field(default_factory=ReplicaIdentity)
    b: ReplicaIdentity = field(default_factory=ReplicaIdentity)

    def argv(self, replica: str) -> list[str]:
        return (self.a if replica == "A" else self.b).stub_argv()
