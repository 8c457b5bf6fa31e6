"""Which KV stack a launched pair runs (``--sharedkv-stack``), as one typed choice (what
cannot run with it is said before any test by ``config/combinations.py``): ``mp``
(LMCache's MP server and ``LMCacheMPConnector``, the default), ``inprocess`` (LMCache's
``LMCacheConnectorV1`` in each replica, sharing through a Redis the suite starts:
``stack/launch/inprocess_connector.py``) or ``native`` (vLLM's own CPU offload:
``stack/launch/native_offload.py``), whose connector ``--sharedkv-native-connector`` chooses:
``offloading`` (``OffloadingConnector``, the default) or ``simple``
(``SimpleCPUOffloadConnector``, vLLM #45704's)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any


class Stack(str, Enum):
    """The KV stack a launched pair runs (a ``str``: JSON and f-strings show the name).
    Compared as members (``stack is Stack.MP``), never as text."""

    MP = "mp"
    INPROCESS = "inprocess"
    NATIVE = "native"

    def __str__(self) -> str:
        return self.value


class NativeConnector(str, Enum):
    """The vLLM connector the native stack's CPU offload runs."""

    OFFLOADING = "offloading"
    SIMPLE = "simple"

    def __str__(self) -> str:
        return self.value


MP, INPROCESS, NATIVE = Stack.MP, Stack.INPROCESS, Stack.NATIVE
STACKS: tuple[str, ...] = tuple(s.value for s in Stack)
OFFLOADING, SIMPLE = NativeConnector.OFFLOADING, NativeConnector.SIMPLE
NATIVE_CONNECTORS: tuple[str, ...] = tuple(c.value for c in NativeConnector)
# the connector class vLLM 0.26 runs for each (config/vllm.py: VLLM_USE_SIMPLE_KV_OFFLOAD)
CONNECTOR_CLASSES = {OFFLOADING: "OffloadingConnector", SIMPLE: "SimpleCPUOffloadConnector"}
# the Settings fields that size the in-process stack's tiers (stack.launch.stacks.inprocess_tiers)
INPROCESS_TIERS = ("inprocess_cpu_gib", "inprocess_disk_gib", "inprocess_remote")
# the in-process stack's engine switches (stack.launch.stacks.inprocess_tiers), each on by
# default: turned off, they apply to its replicas alone
INPROCESS_ENGINE = ("inprocess_prefix_caching",)
# model_type values of the Mamba-family hybrids (their layer types are not listed)
MAMBA_TYPES = frozenset({"jamba", "nemotron_h", "granitemoehybrid", "falcon_h1", "zamba2",
                         "mamba", "mamba2"})
ATTENTION_ONLY_HINT = ("give --sharedkv-model an attention-only model, e.g. one made by "
                       "`python -m pytest_sharedkv make-model --kind copy-attention DIR`")


def is_hybrid(config: Mapping[str, Any]) -> bool:
    """Whether config.json describes a model with recurrent (Mamba / Gated DeltaNet) layers."""
    types = config.get("layer_types") or []
    return ("linear_attention" in types or "mamba" in types
            or str(config.get("model_type", "")) in MAMBA_TYPES)
