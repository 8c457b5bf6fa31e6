"""The replica provider a run asks for (``--sharedkv-provider``) and what it resolves to.

One typed value, defined once: the option's choices, the settings field and every
caller's comparison come from ``Provider``. ``auto`` resolves before any test (external
when endpoints are given, else vllm); vllm that does not import is a state of the
resolution (``Resolved.missing``), not a provider name, so each skip can say why.
"""

from __future__ import annotations

import importlib.util
from enum import Enum
from typing import NamedTuple


class Provider(str, Enum):
    """How the replica pair comes to exist (a ``str``: JSON and f-strings show the name)."""

    AUTO = "auto"
    VLLM = "vllm"
    TRANSFER = "transfer"
    EXTERNAL = "external"
    STUB = "stub"

    def __str__(self) -> str:
        return self.value


PROVIDER_NAMES: tuple[str, ...] = tuple(p.value for p in Provider)
# The transfer provider is no pair that answers requests: it is the replica_pair tier's
# model-free transfer check, which runs whenever lmcache imports, whatever is chosen here.
TRANSFER_SERVES_NOTHING = (
    "the transfer provider serves no completions: it is the replica_pair tier's model-free "
    "transfer check (test_transfer_pair_moves_every_byte_through_the_server, which runs "
    "whenever lmcache imports, whatever the provider)")
SERVING = "vllm, external or stub"


class Resolved(NamedTuple):
    """The provider the pair tests get: never ``auto``; ``missing`` says why it cannot run
    here (vllm does not import), else None. A named tuple: this module loads in every
    pytest start, and a dataclass compiles its generated methods there."""

    provider: Provider
    missing: str | None = None

    @property
    def launched(self) -> bool:
        """A pair of processes this run starts (the allocators and delays apply)."""
        return self.provider is Provider.VLLM

    @property
    def name(self) -> str:
        return self.provider.value

    def __str__(self) -> str:
        return self.name

    def serves_no_pair(self) -> str | None:
        """Why this provider gives the tests no pair to send through, or None."""
        if self.missing is not None:
            return self.missing
        if self.provider is Provider.TRANSFER:
            return f"{TRANSFER_SERVES_NOTHING}; the tests that send through a pair need {SERVING}"
        return None


VLLM_MISSING = ("vllm not importable: the launched provider needs it (or pass "
                "--sharedkv-endpoints for an existing deployment)")


def resolve(provider: Provider, endpoints: tuple[str, ...] | None) -> Resolved:
    """``auto``: external with endpoints, else vllm (``missing`` when it does not import)."""
    if provider is not Provider.AUTO:
        return Resolved(provider)
    if endpoints:
        return Resolved(Provider.EXTERNAL)
    if importlib.util.find_spec("vllm") is None:
        return Resolved(Provider.VLLM, missing=VLLM_MISSING)
    return Resolved(Provider.VLLM)
