"""Which KV stack a launched pair runs (``--sharedkv-stack``), and the combinations that
cannot run, said before any test: ``mp`` (LMCache's MP server and ``LMCacheMPConnector``,
the default), ``inprocess`` (LMCache's ``LMCacheConnectorV1`` in each replica, sharing
through a Redis the suite starts: ``stack/inprocess_connector.py``) or ``native`` (vLLM's
own CPU offload: ``stack/native_offload.py``), whose connector ``--sharedkv-native-connector``
chooses: ``offloading`` (``OffloadingConnector``, the default) or ``simple``
(``SimpleCPUOffloadConnector``, vLLM #45704's)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_sharedkv.config.provider import Provider

if TYPE_CHECKING:
    from pytest_sharedkv.config.options import Settings

MP, INPROCESS, NATIVE = "mp", "inprocess", "native"
STACKS = (MP, INPROCESS, NATIVE)
OFFLOADING, SIMPLE = "offloading", "simple"
NATIVE_CONNECTORS = (OFFLOADING, SIMPLE)
# the connector class vLLM 0.26 runs for each (config/vllm.py: VLLM_USE_SIMPLE_KV_OFFLOAD)
CONNECTOR_CLASSES = {OFFLOADING: "OffloadingConnector", SIMPLE: "SimpleCPUOffloadConnector"}
# the Settings fields that size the in-process stack's tiers (stack_launch.inprocess_tiers)
INPROCESS_TIERS = ("inprocess_cpu_gib", "inprocess_disk_gib", "inprocess_remote")
# the in-process stack's engine switches (stack_launch.inprocess_tiers), each on by
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


def _config(model: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def stack_problem(settings: Settings, provider: Provider) -> str | None:
    """Why the stack asked for cannot run with the other settings, or None. PROVIDER: the
    one asked for (``auto`` resolved as far as the settings say)."""
    tiers = [settings.source_of(f) for f in INPROCESS_TIERS
             if settings.sources.get(f, "default") != "default"]
    if tiers and settings.stack != INPROCESS:
        return (f"{', '.join(tiers)}: only the in-process stack has LMCache tiers in each "
                f"replica, and {settings.source_of('stack')} is {settings.stack}; give "
                f"{settings.source_of('stack')} inprocess or drop {' and '.join(tiers)}")
    if settings.sources.get("native_connector", "default") != "default" \
            and settings.stack != NATIVE:
        given = settings.source_of("native_connector")
        return (f"{given}: only the native stack runs vLLM's own CPU offload, whose "
                f"connector it chooses, and {settings.source_of('stack')} is "
                f"{settings.stack}; give {settings.source_of('stack')} native or drop {given}")
    engine = [settings.source_of(f) for f in INPROCESS_ENGINE
              if getattr(settings, f) is False]
    if engine and settings.stack != INPROCESS:
        return (f"{', '.join(engine)}: only the in-process stack's replicas are launched with "
                f"vLLM's prefix caching as this option sets it (its expected hits are "
                f"written for that stack alone), and {settings.source_of('stack')} is "
                f"{settings.stack}; give {settings.source_of('stack')} inprocess or drop "
                f"{' and '.join(engine)}")
    if settings.stack == MP:
        return None
    where = settings.source_of("stack")
    if provider is Provider.EXTERNAL:
        return (f"{where} {settings.stack}: the suite launches the stack it names, and the "
                "external provider serves a deployment it never starts; drop one of them")
    if settings.triage:
        return (f"{where} {settings.stack}: {settings.source_of('triage')}'s controls act on "
                "LMCache's MP server, which this stack does not run; drop one of them")
    if settings.topology != "shared":
        return (f"{where} {settings.stack}: {settings.source_of('topology')} "
                f"{settings.topology} runs one LMCache MP server per replica, which this stack "
                "does not run; drop one of them")
    if settings.fault_catalogue is not None:
        return (f"{where} {settings.stack}: {settings.source_of('fault_catalogue')}'s faults "
                "go into LMCache's MP server, which this stack does not run; drop one of them")
    if settings.sources.get("allocators", "default") != "default":
        return (f"{where} {settings.stack}: {settings.source_of('allocators')} chooses the MP "
                "server's L1 allocator, which this stack does not run; drop one of them")
    if settings.stack == INPROCESS and provider is not Provider.STUB:
        refused = release_problem(settings)
        if refused is not None:
            return refused
        if settings.model is None:
            return (f"{where} inprocess: LMCacheConnectorV1 has no hybrid-model support in "
                    "vLLM 0.26 and the default model (the copy model) is a hybrid; "
                    + ATTENTION_ONLY_HINT)
        config = _config(settings.model)
        if config is not None and is_hybrid(config):
            return (f"{where} inprocess: {settings.source_of('model')} {settings.model} is a "
                    "hybrid model, which LMCacheConnectorV1 cannot serve in vLLM 0.26; "
                    + ATTENTION_ONLY_HINT)
    return None


def release_problem(settings: Settings) -> str | None:
    """Why the in-process stack cannot run on the LMCache the run would drive it with (the
    installed one, and the release site the identity tier is given): a module vLLM's
    LMCacheConnectorV1 imports that the release moved (issue 50 item 3), or None."""
    import importlib.util

    from pytest_sharedkv.host.lmcache_api import stack_refusal

    sites: list[tuple[str, Path]] = []
    spec = importlib.util.find_spec("lmcache")  # top-level: found, not imported
    if spec is not None and spec.submodule_search_locations:
        sites.append((settings.source_of("stack") + " inprocess",
                      Path(next(iter(spec.submodule_search_locations)))))
    site = getattr(settings, "identity_release_site", None)
    if site is not None:
        sites.append((settings.source_of("identity_release_site"), Path(site) / "lmcache"))
    for where, lmcache in sites:
        refused = stack_refusal(INPROCESS, lmcache)
        if refused is not None:
            return f"{where}: {refused}"
    return None
